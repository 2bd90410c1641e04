//! `koala experiment autoscale` (the paper is policy-agnostic, so no figure of it): the
//! reconfiguration policy (`[autoscale]`, docs/architecture.md §7, "The reconfiguration policy") drives the demo's workload.
//! The demo's keyed aggregate on 2 tasks of 20 000 records/s each (emulated capacity) takes
//! 30 000/s; the rate surges to 60 000/s and stays there (the steady rate); then a hot range
//! appears: a scheduled rebalance gathers half of all buckets (every even one) on task 0, which
//! then takes about 60 % of the input. The policy must scale out within 2 windows of the surge,
//! bring end-to-end p99 below 200 ms within 60 s, act at most once per window, stay still in the
//! last 30 s of the steady rate, and answer the hot range with one rebalance.
//!
//! The hot range is made by a bucket assignment, not by the generator: its key skew cannot be
//! switched on mid-run. The policy packs the hot task's buckets by their measured per-bucket
//! load (`bucket_records`), hottest first, onto the coldest tasks.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use koala_coordinator::JobConfig;
use koala_coordinator::report::ReportSummary;
use koala_coordinator::request_record::{describe_text, from_text};
use koala_protocol::ReconfigRequest;

use super::scenario::{Scenario, Step};
use super::{Info, Mode, Options, Runner};

/// The figures one run is judged by.
struct Timeline {
    /// Seconds: base rate until `surge_s`, surge (the steady rate) until `hot_s`, hot range until
    /// `end_s`.
    surge_s: u64,
    hot_s: u64,
    end_s: u64,
    window_s: u64,
}

const BASE: f64 = 30_000.0;
const SURGE: f64 = 60_000.0;
const PER_TASK: f64 = 20_000.0;
const TARGET_MS: f64 = 200.0;

fn timeline(mode: Mode) -> Timeline {
    match mode {
        Mode::Smoke => Timeline { surge_s: 4, hot_s: 14, end_s: 20, window_s: 2 },
        Mode::Quick => Timeline { surge_s: 20, hot_s: 110, end_s: 170, window_s: 10 },
        Mode::Full => Timeline { surge_s: 30, hot_s: 180, end_s: 300, window_s: 10 },
    }
}

fn scenario(t: &Timeline) -> Scenario {
    let even: Vec<u16> = (0..koala_types::DEFAULT_NUM_BUCKETS).filter(|b| b % 2 == 0).collect();
    Scenario {
        query: "keyed-aggregate",
        params: "sink = \"discard\"".into(),
        param_tables: "[params.generator]\nkey_space = 4000000\nhot_keys = 100\nhot_key_ratio = 0.3\n\
                       active_keys = 20000\nactive_shift_records = 1\nseed = 7\n"
            .into(),
        source: "max_disorder_ms = 50\nwatermark_interval_ms = 200\n".into(),
        parallelism: vec![("source", 2), ("aggregate", 2), ("sink", 1)],
        target: "aggregate",
        workers: 2,
        duration_s: t.end_s,
        steps: vec![Step::Rebalance {
            at_s: t.hot_s as f64,
            operator: "aggregate".into(),
            moves: vec![(even, 0)],
        }],
        rates: vec![(0.0, BASE), (t.surge_s as f64, SURGE)],
        task_records_per_sec: PER_TASK,
        link_mb_per_sec: Some(100.0),
        extra_keys: None,
        warm_keys: 0,
        value_bytes: 0,
    }
}

/// The job config of the run: the scenario and `[autoscale]`.
fn config_text(t: &Timeline, protocol: &str, dir: &Path) -> String {
    let mut text = scenario(t).config(protocol, dir, None);
    let _ = write!(
        text,
        "\n[autoscale]\nenabled = true\noperator = \"aggregate\"\nwindow_s = {}\ntarget_latency_ms = {TARGET_MS:?}\nmax_parallelism = 8\ncooldown_s = {}\n",
        t.window_s,
        t.window_s / 2
    );
    text
}

/// Tasks of `aggregate` after each second: the rescales completed by then.
fn parallelism_at(report: &ReportSummary, t_s: i64) -> u32 {
    let mut p = 2;
    for r in &report.reconfigurations {
        let done = r.end_t_s.is_some_and(|e| e <= t_s);
        if let (true, Some(ReconfigRequest::Rescale { parallelism, .. })) =
            (done, from_text(&r.reconfiguration.detail))
        {
            p = parallelism;
        }
    }
    p
}

/// The per-second table: offered, output, e2e p99, parallelism, decisions and reconfigurations.
fn seconds_table(report: &ReportSummary) -> (String, String) {
    let mut text = format!(
        "{:>5} {:>9} {:>9} {:>10} {:>5}  {}\n",
        "t", "offered", "output", "e2e p99", "tasks", "decisions / reconfigurations"
    );
    let mut csv = String::from("t_s,offered,output,e2e_p99_ms,parallelism,events\n");
    for row in &report.table.rows {
        let mut events: Vec<String> = report
            .autoscale
            .iter()
            .filter(|d| (d.at_ms.saturating_sub(report.run.started_ms) / 1000) as i64 == row.t_s)
            .map(|d| format!("decide {} ({})", d.kind, describe_text(&d.request)))
            .collect();
        for r in &report.reconfigurations {
            let c = &r.reconfiguration;
            if r.start_t_s == row.t_s {
                events.push(format!("start {} {} (epoch {})", c.kind, c.operator, c.epoch));
            }
            if r.end_t_s == Some(row.t_s) {
                events.push(format!("end epoch {}", c.epoch));
            }
        }
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0} ms"));
        let p = parallelism_at(report, row.t_s);
        let offered = row.offered.map_or("-".into(), |o| format!("{o:.0}"));
        let _ = writeln!(
            text,
            "{:>5} {offered:>9} {:>9.0} {:>10} {p:>5}  {}",
            row.t_s,
            row.output,
            ms(row.latency_p99_ms),
            events.join("; ")
        );
        let _ = writeln!(
            csv,
            "{},{},{:.0},{},{p},\"{}\"",
            row.t_s,
            row.offered.map_or(String::new(), |o| format!("{o:.0}")),
            row.output,
            row.latency_p99_ms.map_or(String::new(), |v| format!("{v:.0}")),
            events.join("; ").replace('"', "'")
        );
    }
    (text, csv)
}

/// What the policy must achieve on this workload, one line each, and whether each holds.
fn figures(report: &ReportSummary, t: &Timeline) -> Vec<(bool, String)> {
    let since_start = |ms: u64| ms.saturating_sub(report.run.started_ms) as f64 / 1000.0;
    let mut out = Vec::new();
    let (surge, hot) = (t.surge_s as f64, t.hot_s as f64);
    let first_out = report.autoscale.iter().find(|d| d.kind == "scale_out").map(|d| since_start(d.at_ms));
    out.push(match first_out {
        Some(at) => (
            at - surge <= 2.0 * t.window_s as f64,
            format!(
                "first scale-out decided at {at:.1} s, {:.1} s after the surge (goal ≤ 2 windows = {} s)",
                at - surge,
                2 * t.window_s
            ),
        ),
        None => (false, "no scale-out decided".into()),
    });
    // The first second from which e2e p99 stays below the target for 5 s, in the steady rate.
    let rows: Vec<_> =
        report.table.rows.iter().filter(|r| r.t_s as f64 >= surge && (r.t_s as f64) < hot).collect();
    let below = |r: &&koala_coordinator::report::SecondRow| r.latency_p99_ms.is_some_and(|v| v < TARGET_MS);
    let back = first_out.and_then(|at| {
        rows.windows(5).find(|w| w[0].t_s as f64 >= at && w.iter().all(below)).map(|w| w[0].t_s)
    });
    out.push(match back {
        Some(s) => (
            s as f64 - surge <= 60.0,
            format!("e2e p99 below {TARGET_MS:.0} ms (for 5 s on) from t={s} s, {:.0} s after the surge (goal ≤ 60 s)", s as f64 - surge),
        ),
        None => (false, format!("e2e p99 never stayed below {TARGET_MS:.0} ms for 5 s before the hot range")),
    });
    let decided: Vec<f64> = report.autoscale.iter().map(|d| since_start(d.at_ms)).collect();
    let min_gap = decided.windows(2).map(|w| w[1] - w[0]).reduce(f64::min);
    out.push((
        min_gap.is_none_or(|g| g >= t.window_s as f64 - 1.0),
        format!(
            "{} decisions; shortest gap {} (goal: at most one per {} s window)",
            decided.len(),
            min_gap.map_or("-".into(), |g| format!("{g:.1} s")),
            t.window_s
        ),
    ));
    let quiet_from = hot - 30.0;
    let late: Vec<f64> =
        report.reconfigurations.iter().map(|r| r.start_s).filter(|s| *s >= quiet_from && *s < hot).collect();
    out.push((late.is_empty(), format!("reconfigurations started in the last 30 s of the steady rate ({quiet_from:.0}–{hot:.0} s): {late:?} (goal: none)")));
    let after: Vec<&str> =
        report.autoscale.iter().filter(|d| since_start(d.at_ms) >= hot).map(|d| d.kind.as_str()).collect();
    let rebalances = after.iter().filter(|k| **k == "rebalance").count();
    out.push((
        rebalances == 1 && !after.contains(&"scale_out"),
        format!("after the hot range at {hot:.0} s the policy decided {after:?} (goal: one rebalance, no scale-out)"),
    ));
    out
}

fn run(info: &Info, mode: Mode, opts: &Options) -> anyhow::Result<()> {
    let protocols = opts.protocols.clone().unwrap_or_else(|| vec!["koala".into()]);
    let t = timeline(mode);
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    println!("koala experiment {} ({}): {}", info.name, mode.name(), info.shows);
    println!(
        "keyed-aggregate, 2 → ? tasks of {PER_TASK}/s; offered {BASE}/s, {SURGE}/s from {} s (steady), hot range (even buckets → task 0) at {} s, end at {} s; window {} s, target e2e p99 {TARGET_MS} ms",
        t.surge_s, t.hot_s, t.end_s, t.window_s
    );
    let mut summary = String::new();
    let mut failed = Vec::new();
    for protocol in &protocols {
        let dir = opts.out.join(super::engine::slug(protocol));
        let config = JobConfig::parse(&config_text(&t, protocol, &dir), "koala experiment autoscale")?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("job.toml"), toml::to_string(&config).unwrap_or_default())
            .with_context(|| format!("writing {}", dir.join("job.toml").display()))?;
        println!("\n=== {protocol} ===");
        let job = crate::launch::run_job_locally(config)?;
        let (_, report) = crate::compare::outcome(&job, &dir)?;
        let (table, csv) = seconds_table(&report);
        std::fs::write(dir.join("seconds.csv"), csv).with_context(|| format!("writing {}", dir.display()))?;
        let _ = writeln!(summary, "== {protocol} ==\n{table}");
        for d in &report.autoscale {
            let _ = writeln!(
                summary,
                "decision at t={} s: {} {}: {} [{}]; {}",
                d.t_s,
                d.kind,
                describe_text(&d.request),
                d.reason,
                d.window,
                d.outcome
            );
        }
        for (ok, line) in figures(&report, &t) {
            let _ = writeln!(summary, "{} {line}", if ok { "MET   " } else { "MISSED" });
            if !ok {
                failed.push(format!("{protocol}: {line}"));
            }
        }
    }
    println!("\n{summary}");
    let path = opts.out.join("autoscale.txt");
    std::fs::write(&path, &summary).with_context(|| format!("writing {}", path.display()))?;
    println!("written: {} and <protocol>/seconds.csv, <protocol>/report.html", path.display());
    if mode != Mode::Smoke && !failed.is_empty() {
        println!("goals missed: {}", failed.join("; "));
    }
    Ok(())
}

/// `koala experiment autoscale`.
pub const AUTOSCALE: Info = Info {
    name: "autoscale",
    figure: "none (the paper is policy-agnostic)",
    shows: "the [autoscale] policy on the demo's workload: a surge, a steady rate, a hot key range; per-second offered, output, e2e p99, tasks, decisions",
    quick: "one 170 s run (Koala): about 3 minutes",
    full: "one 300 s run: about 5.5 minutes",
    protocols: &["koala"],
    runner: Runner::Own(run),
};
