//! What the demo's reconfiguration did to the job, for `koala demo` and `koala compare`: state
//! moved, time from the reconfiguration until source lag is back to its pre-surge level, the
//! worst throughput dip against the input rate, and per-batch latency before and after.

use std::path::Path;

use anyhow::Context;
use koala_coordinator::report::{ReportSummary, SecondRow, report};
use koala_coordinator::{JobConfig, JobSummary};

/// The demo's surge starts at this second (examples/demo.toml).
const SURGE_START_S: i64 = 20;

/// One run's outcome.
pub struct Outcome {
    /// Protocol name.
    pub protocol: String,
    /// Bytes of state moved between tasks over the whole run.
    pub state_moved: f64,
    /// Seconds from the reconfiguration until lag is back to its pre-surge level (and stays 3 s).
    pub recovery_s: Option<i64>,
    /// (lowest records/s in the 10 s after the reconfiguration, the input rate then).
    pub dip: Option<(f64, f64)>,
    /// Mean per-batch latency (µs) in the 5 s before the reconfiguration and 1–11 s after.
    pub latency: (Option<f64>, Option<f64>),
    /// Worst per-second p99 source lag (ms) in the 10 s after the reconfiguration started.
    pub peak_lag_p99_ms: Option<f64>,
    /// How long upstreams were paused, ms.
    pub pause_ms: u64,
}

fn mean(rows: &[&SecondRow], f: impl Fn(&SecondRow) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = rows.iter().filter_map(|r| f(r)).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Computes the outcome of a finished demo-like run.
pub fn outcome(
    config: &JobConfig,
    summary: &JobSummary,
    out: &Path,
) -> anyhow::Result<(Outcome, ReportSummary)> {
    let rep = report(&summary.metrics_db, Some(&summary.run), out).context("reading the run's metrics")?;
    let rows = &rep.table.rows;
    let in_range = |a: i64, b: i64| rows.iter().filter(|r| r.t_s >= a && r.t_s < b).collect::<Vec<_>>();
    let start = rep.reconfigurations.first().map(|r| r.start_t_s);
    let state_moved = rows.iter().map(|r| r.state_bytes_moved).sum();
    let pause_ms = rep.pause_ms_total;
    let (mut recovery_s, mut dip, mut latency, mut peak_lag_p99_ms) = (None, None, (None, None), None);
    if let Some(start) = start {
        let pre = mean(&in_range(5, SURGE_START_S), |r| r.lag_mean_ms).unwrap_or(0.0);
        let threshold = (2.0 * pre).max(pre + 20.0);
        let after = in_range(start, i64::MAX);
        let healthy = |r: &SecondRow| r.lag_mean_ms.is_some_and(|l| l <= threshold);
        recovery_s = after.windows(3).find(|w| w.iter().all(|r| healthy(r))).map(|w| w[0].t_s - start);
        let rate_at = |t: i64| {
            let ms = u64::try_from(t.max(0)).unwrap_or(0) * 1000;
            config
                .params
                .get("source")
                .and_then(|s| s.get("rate"))
                .and_then(|r| r.as_array())
                .and_then(|steps| {
                    steps
                        .iter()
                        .rev()
                        .find(|s| s.get("at_ms").and_then(|a| a.as_integer()).is_some_and(|a| a as u64 <= ms))
                        .and_then(|s| s.get("records_per_sec").and_then(|r| r.as_float()))
                })
                .unwrap_or(0.0)
        };
        dip = in_range(start, start + 10)
            .into_iter()
            .map(|r| (r.throughput, rate_at(r.t_s)))
            .min_by(|a, b| (a.0 / a.1.max(1.0)).total_cmp(&(b.0 / b.1.max(1.0))));
        peak_lag_p99_ms = in_range(start, start + 10).iter().filter_map(|r| r.lag_p99_ms).reduce(f64::max);
        latency = (
            mean(&in_range(start - 5, start), |r| r.batch_latency_mean_us),
            mean(&in_range(start + 1, start + 11), |r| r.batch_latency_mean_us),
        );
    }
    let protocol = rep.run.protocol.clone();
    Ok((Outcome { protocol, state_moved, recovery_s, dip, latency, peak_lag_p99_ms, pause_ms }, rep))
}

fn mib(b: f64) -> String {
    crate::launch::human_bytes(b as u64)
}

fn opt_us(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0} µs"))
}

/// The demo's closing lines.
pub fn print_outcome(o: &Outcome) {
    println!("state moved: {}", mib(o.state_moved));
    match o.recovery_s {
        Some(s) => println!("lag back to its pre-surge level {s} s after the reconfiguration started"),
        None => println!("lag did not get back to its pre-surge level before the run ended"),
    }
    if let Some((min, rate)) = o.dip {
        println!(
            "worst throughput in the 10 s after it: {min:.0} rec/s against {rate:.0} rec/s offered ({:.0}%)",
            100.0 * min / rate.max(1.0)
        );
    }
    println!(
        "per-batch latency: {} before, {} after; upstreams paused {} ms",
        opt_us(o.latency.0),
        opt_us(o.latency.1),
        o.pause_ms
    );
}

/// The `koala compare` table.
pub fn print_table(outcomes: &[Outcome]) {
    println!();
    println!(
        "{:<18} {:>12} {:>10} {:>14} {:>24} {:>22} {:>8}",
        "protocol", "state moved", "recovery", "peak lag p99", "worst dip (rec/s)", "batch latency", "pause"
    );
    for o in outcomes {
        let dip =
            o.dip.map_or("-".into(), |(m, r)| format!("{m:.0}/{r:.0} ({:.0}%)", 100.0 * m / r.max(1.0)));
        let rec = o.recovery_s.map_or("never".into(), |s| format!("{s} s"));
        let lat = format!("{} → {}", opt_us(o.latency.0), opt_us(o.latency.1));
        println!(
            "{:<18} {:>12} {:>10} {:>14} {:>24} {:>22} {:>6} ms",
            o.protocol,
            mib(o.state_moved),
            rec,
            o.peak_lag_p99_ms.map_or("-".into(), |l| format!("{l:.0} ms")),
            dip,
            lat,
            o.pause_ms
        );
    }
}
