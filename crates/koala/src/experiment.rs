//! `koala experiment scale-out`: the analogue of the paper's Figures 6–7 (§5.2) for the keyed
//! aggregate. Warm state (`koala warmup`) restored into every run; phase 1 at 70 % of the
//! emulated capacity, phase 2 at twice that (a backlog forms), then a scale-out that doubles the
//! aggregate's tasks while the surge goes on (phase 3); once per protocol (Koala,
//! stop-and-restart, Remote on one state server, DRRS). Writes one overlay PNG
//! per metric (throughput, end-to-end latency, source lag; 10 s moving average as in the paper),
//! a CSV of the per-second rows, and prints a table of backlog recovery (on end-to-end latency,
//! and on source lag beside it), state moved and per-batch latency before/after per protocol —
//! all figures from
//! the runs' report summaries (`koala_coordinator::report`).
//!
//! The link cap is chosen so that moving the state takes as long, relative to the run, as in
//! the paper: stop-and-restart paused ~45 s of a 10-minute run (7.5 %) for its 4 → 8 scale-out
//! (Figure 22). As there, every new task runs on a machine of its own — one worker per task
//! after the scale-out, so each new task's state crosses its worker's link — and every task
//! gets an equal share of the buckets, so the added capacity is real: the cap = one new task's
//! share of the state / (7.5 % of the run). Every run gets the same policy and cache size
//! (`crate::settings`): interleaved without DRRS (doubling moves exactly the new tasks' shares),
//! uniform (contiguous ranges, which DRRS requires; old tasks also exchange buckets) with it, or
//! `--partition-policy`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use koala_coordinator::JobConfig;
use koala_coordinator::report::{
    ReportSummary, fmt_recovery, moving_average, recovery_watched_s, write_overlay, write_throughput_overlay,
};

use crate::settings::SharedSettings;

/// Fraction of the run the paper's stop-and-restart paused for its scale-out (45 s of 600 s).
const PAUSE_FRACTION: f64 = 45.0 / 600.0;

/// One experiment's fixed settings.
struct Setup {
    warm_keys: u64,
    value_bytes: usize,
    phases_s: [u64; 3],
    tasks: (u32, u32),
    task_records_per_sec: f64,
}

impl Setup {
    fn new(quick: bool) -> Self {
        if quick {
            // 256 MB, 90 s per protocol: the whole experiment in about 3 minutes.
            Self {
                warm_keys: 125_000,
                value_bytes: 2048,
                phases_s: [25, 20, 45],
                tasks: (2, 4),
                task_records_per_sec: 10_000.0,
            }
        } else {
            // 1 GB, 10 minutes per protocol (the paper's run length), 4 → 8 tasks (its scale-out).
            Self {
                warm_keys: 500_000,
                value_bytes: 2048,
                phases_s: [120, 60, 420],
                tasks: (4, 8),
                task_records_per_sec: 7_500.0,
            }
        }
    }

    fn duration_s(&self) -> u64 {
        self.phases_s.iter().sum()
    }

    fn state_bytes(&self) -> f64 {
        self.warm_keys as f64 * self.value_bytes as f64
    }

    /// The state each new task receives in the scale-out (the interleaved policy gives every task
    /// an equal share), which crosses that task's worker's link.
    fn moved_per_link(&self) -> f64 {
        self.state_bytes() / f64::from(self.tasks.1)
    }

    /// The link cap (MB/s) that makes moving a new task's share of the state take
    /// `PAUSE_FRACTION` of the run.
    fn link_mb_per_sec(&self) -> f64 {
        let pause_s = PAUSE_FRACTION * self.duration_s() as f64;
        (self.moved_per_link() / 1e6 / pause_s * 10.0).round() / 10.0
    }

    fn config(&self, protocol: &str, out: &Path, warm: &Path) -> String {
        let base = 0.7 * f64::from(self.tasks.0) * self.task_records_per_sec;
        let [p1, p2, _] = self.phases_s;
        // The Remote baseline keeps its state on a state server, with a client cache per task
        // (the shared settings give it the others' cache size) that holds the working set:
        // without one every record's 2 KB state would cross the link scaled down for the
        // transfer, which no real deployment would do.
        let state = if protocol == "remote" { "\n[state]\nbackend = \"remote\"\n" } else { "" };
        // `drrs-overlapping`: DRRS with the original DRRS's schedule.
        let (protocol, state) = match protocol {
            "drrs-overlapping" => ("drrs", "\n[drrs]\nschedule = \"overlapping\"\n"),
            p => (p, state),
        };
        let text = format!(
            r#"query = "keyed-aggregate"
workers = {workers}
duration_s = {duration}
output_dir = {out:?}
protocol = "{protocol}"
warm_state = {warm:?}

[parallelism]
source = 2
aggregate = {before}
sink = 1

[[reconfigurations]]
at_s = {at}
operator = "aggregate"
parallelism = {after}

[runtime]
task_records_per_sec = {budget}
link_mb_per_sec = {link}
reconfiguration_timeout_s = 600.0

[params]
sink = "discard"

[params.generator]
key_space = {keys}
hot_keys = 1000
hot_key_ratio = 0.3
active_keys = 10000
active_shift_records = 500
seed = 7

[params.source]
max_disorder_ms = 50
watermark_interval_ms = 200
rate = [{{ at_ms = 0, records_per_sec = {base:.1} }}, {{ at_ms = {surge_ms}, records_per_sec = {surge:.1} }}]
"#,
            workers = self.tasks.1,
            duration = self.duration_s(),
            out = out.display().to_string(),
            warm = warm.display().to_string(),
            before = self.tasks.0,
            after = self.tasks.1,
            at = p1 + p2,
            budget = self.task_records_per_sec,
            link = self.link_mb_per_sec(),
            keys = self.warm_keys,
            surge_ms = p1 * 1000,
            surge = 2.0 * base,
        );
        text + state
    }
}

/// The protocols the experiment knows (and plots in these colours' order).
const PROTOCOLS: [&str; 5] = ["koala", "stop-and-restart", "remote", "drrs", "drrs-overlapping"];

/// Workers of every run (one per task after the scale-out).
pub fn workers(quick: bool) -> u32 {
    Setup::new(quick).tasks.1
}

/// Runs the experiment into `out` under `protocols` (validated by the caller), in that order,
/// every run with the `shared` settings.
pub fn scale_out(
    quick: bool,
    out: &Path,
    protocols: &[String],
    shared: SharedSettings,
) -> anyhow::Result<()> {
    let setup = Setup::new(quick);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let warm = out.join("warm");
    println!(
        "koala experiment scale-out{}: keyed-aggregate, {} warm keys × {} B = {}, {} → {} aggregate tasks at {} s, \
         phases {:?} s, one worker per task after the scale-out, {}, task_records_per_sec = {}, link_mb_per_sec = {} per worker (a new task's share, {}, takes {:.1} s = {:.1} % of the run to cross its link, as in the paper)",
        if quick { " --quick" } else { "" },
        setup.warm_keys,
        setup.value_bytes,
        crate::launch::human_bytes(setup.state_bytes() as u64),
        setup.tasks.0,
        setup.tasks.1,
        setup.phases_s[0] + setup.phases_s[1],
        setup.phases_s,
        shared.line(),
        setup.task_records_per_sec,
        setup.link_mb_per_sec(),
        crate::launch::human_bytes(setup.moved_per_link() as u64),
        PAUSE_FRACTION * setup.duration_s() as f64,
        PAUSE_FRACTION * 100.0
    );
    if let Some(line) = crate::settings::drrs_line(protocols) {
        println!("{line}");
    }
    if !warm.join(crate::warmup::OPERATOR).join("manifest").exists() {
        let started = std::time::Instant::now();
        let written = crate::warmup::warmup(
            "keyed-aggregate",
            "",
            koala_types::DEFAULT_NUM_BUCKETS,
            setup.warm_keys,
            setup.value_bytes,
            &warm,
        )?;
        println!(
            "warm state: {} written in {:.1} s",
            crate::launch::human_bytes(written.iter().map(|w| w.bytes).sum()),
            started.elapsed().as_secs_f64()
        );
    }
    let mut runs: Vec<ReportSummary> = Vec::new();
    let mut latencies = Vec::new();
    // A protocol whose run fails does not throw away the others' runs: the results are written
    // for those that ran, then the experiment fails naming the ones that did not.
    let mut failed = Vec::new();
    for protocol in protocols {
        let protocol = protocol.as_str();
        let dir = out.join(protocol);
        let mut config = JobConfig::parse(&setup.config(protocol, &dir, &warm), "koala experiment")?;
        shared.apply(&mut config);
        let ran = crate::launch::run_job_locally(config)
            .and_then(|summary| crate::compare::outcome(&summary, &dir));
        match ran {
            Ok((outcome, report)) => {
                println!("{report}");
                runs.push(report);
                latencies.push(outcome.latency);
            }
            Err(e) => {
                eprintln!("the {protocol} run failed: {e:#}");
                failed.push(format!("{protocol}: {e:#}"));
            }
        }
    }
    if !runs.is_empty() {
        println!();
        println!("{}", shared.line());
        if let Some(line) = crate::settings::drrs_line(protocols) {
            println!("{line}");
        }
        write_results(&runs, &latencies, out)?;
    }
    if !failed.is_empty() {
        anyhow::bail!("{} of {} runs failed: {}", failed.len(), protocols.len(), failed.join("; "));
    }
    Ok(())
}

fn protocol_name(p: &str) -> &'static str {
    PROTOCOLS.into_iter().find(|name| *name == p).unwrap_or("other")
}

/// The overlay plots, the CSV and the table; `latencies`: each run's mean per-batch latency
/// before and after its scale-out (`compare::Outcome::latency`).
fn write_results(
    runs: &[ReportSummary],
    latencies: &[(Option<f64>, Option<f64>)],
    out: &Path,
) -> anyhow::Result<()> {
    let mut csv = String::from(
        "protocol,t_s,throughput,lag_mean_ms,lag_p99_ms,latency_p50_ms,latency_p99_ms,state_bytes_moved\n",
    );
    for r in runs {
        for row in &r.table.rows {
            let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v}"));
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{},{},{}",
                r.run.protocol,
                row.t_s,
                row.throughput,
                opt(row.lag_mean_ms),
                opt(row.lag_p99_ms),
                opt(row.latency_p50_ms),
                opt(row.latency_p99_ms),
                row.state_bytes_moved
            );
        }
    }
    let csv_path = out.join("scale_out.csv");
    std::fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    /// Seconds per moving average, as the paper plots throughput and lag.
    const SMOOTHING_S: i64 = 10;
    let smoothed = |f: &dyn Fn(&koala_coordinator::report::SecondRow) -> Option<f64>| {
        runs.iter()
            .map(|r| {
                let series: Vec<(i64, f64)> =
                    r.table.rows.iter().filter_map(|row| Some((row.t_s, f(row)?))).collect();
                // Each average at the middle of the seconds it covers (t - 9 ..= t), not at its
                // last one: drawn there, a pause showed ~5 s after its span began.
                let points = moving_average(&series, SMOOTHING_S)
                    .into_iter()
                    .map(|(t, v)| (t as f64 + 1.0 - SMOOTHING_S as f64 / 2.0, v))
                    .collect();
                (protocol_name(&r.run.protocol), points)
            })
            .collect::<Vec<_>>()
    };
    let reports: Vec<&ReportSummary> = runs.iter().collect();
    write_throughput_overlay(
        &out.join("throughput.png"),
        "Throughput (10 s moving average, drawn at its middle) and the offered rate",
        &smoothed(&|r| Some(r.throughput)),
        &reports,
    )?;
    write_overlay(
        &out.join("latency.png"),
        "End-to-end latency, worst sink's median (10 s moving average, drawn at its middle)",
        "ms",
        &smoothed(&|r| r.latency_p50_ms),
        &reports,
    )?;
    write_overlay(
        &out.join("lag.png"),
        "Source lag (10 s moving average, drawn at its middle)",
        "ms",
        &smoothed(&|r| r.lag_mean_ms),
        &reports,
    )?;
    println!();
    println!(
        "{:<18} {:>10} {:>10} {:>14} {:>14} {:>14} {:>10} {:>10} {:>10} {:>26} {:>22} {:>10}",
        "protocol",
        "recovery",
        "lag rec.",
        "on demand",
        "background",
        "eager",
        "pause",
        "peak e2e",
        "peak lag",
        "lowest rate (vs offered)",
        "batch latency",
        "max queued"
    );
    let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} µs"));
    for (r, (before, after)) in runs.iter().zip(latencies) {
        let first = r.reconfigurations.first();
        let watched = first.and_then(|c| recovery_watched_s(c.start_t_s, r.input_last_t_s));
        println!(
            "{:<18} {:>10} {:>10} {:>14} {:>14} {:>14} {:>7} ms {:>7} ms {:>7} ms {:>26} {:>22} {:>10}",
            r.run.protocol,
            fmt_recovery(first.and_then(|c| c.backlog_recovery_s), watched),
            fmt_recovery(first.and_then(|c| c.lag_recovery_s), watched),
            crate::launch::human_bytes(r.state_moved.on_demand as u64),
            crate::launch::human_bytes(r.state_moved.background as u64),
            crate::launch::human_bytes(r.state_moved.eager as u64),
            r.pause_ms_total,
            r.peak_latency_p50_ms.map_or(0.0, |l| l.round()),
            r.peak_lag_mean_ms.map_or(0.0, |l| l.round()),
            first.and_then(|c| c.dip).map_or("-".into(), |d| d.short()),
            format!("{} → {}", us(*before), us(*after)),
            r.max_queued_records.as_ref().map_or("-".into(), |(_, n)| format!("{n:.0}"))
        );
    }
    let ran = |p: &str| runs.iter().find(|r| r.run.protocol == p);
    if let (Some(k), Some(s)) = (ran("koala"), ran("stop-and-restart")) {
        let rec = |r: &ReportSummary| r.reconfigurations.first().and_then(|c| c.backlog_recovery_s);
        if let (Some(a), Some(b)) = (rec(k), rec(s)) {
            println!(
                "koala's backlog recovery (end-to-end latency) is {:.2} of stop-and-restart's",
                a as f64 / (b as f64).max(1.0)
            );
        }
        if s.state_moved.total() > 0.0 {
            println!(
                "koala's state moved is {:.3} of stop-and-restart's (all kinds)",
                k.state_moved.total() / s.state_moved.total()
            );
        }
    }
    println!(
        "plots: {}, {}, {}; rows: {}",
        out.join("throughput.png").display(),
        out.join("latency.png").display(),
        out.join("lag.png").display(),
        csv_path.display()
    );
    Ok(())
}
