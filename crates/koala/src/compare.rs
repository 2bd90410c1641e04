//! What the demo's reconfiguration did to the job, for `koala demo` and `koala compare`. Every
//! figure comes from the run's [`ReportSummary`] (`koala_coordinator::report`, one definition of
//! each: dip against the offered rate, recovery on the end-to-end p99 (the median and source lag
//! beside it) and the drain limit no protocol can beat, state moved on demand vs in the
//! background), so the demo, `compare` and `koala report <db>` print the same numbers.

use std::path::Path;

use anyhow::Context;
use koala_coordinator::JobSummary;
use koala_coordinator::report::{
    DrainLimit, ReportSummary, SecondRow, StateMoved, TAIL_S, ThroughputDip, fmt_drain_limit, fmt_recovery,
    recovery_rule, recovery_watched_s, report,
};

/// One run's outcome.
pub struct Outcome {
    /// Protocol name.
    pub protocol: String,
    /// State moved between tasks over the whole run.
    pub state_moved: StateMoved,
    /// Recovery of the first reconfiguration on the end-to-end p99, seconds.
    pub recovery_s: Option<u64>,
    /// The same on the end-to-end median, seconds.
    pub recovery_p50_s: Option<u64>,
    /// The same on source lag, seconds.
    pub lag_recovery_s: Option<u64>,
    /// The first reconfiguration's drain limit.
    pub drain_limit: Option<DrainLimit>,
    /// Seconds from the first reconfiguration's start to the input's last second: how long a
    /// recovery was watched for.
    pub watched_s: Option<i64>,
    /// Highest per-second p99 end-to-end latency of the run (worst sink), ms.
    pub peak_latency_p99_ms: Option<f64>,
    /// Highest per-second median end-to-end latency of the run (worst sink), ms.
    pub peak_latency_p50_ms: Option<f64>,
    /// Throughput dip of the first reconfiguration.
    pub dip: Option<ThroughputDip>,
    /// Mean per-batch latency (µs) in the 5 s before the reconfiguration and in the first 10 s
    /// after it in which the sources took input ([`mean_batch_latency`]).
    pub latency: (Option<f64>, Option<f64>),
    /// Highest per-second mean source lag of the run, ms.
    pub peak_lag_ms: Option<f64>,
    /// Worst per-second p99 source lag over the run's last seconds, ms.
    pub tail_lag_p99_ms: Option<f64>,
    /// How long some task held input back for its protocol, ms (the report's pause: Σ over
    /// seconds of the longest `input_paused_ms`, for every protocol).
    pub pause_ms: u64,
    /// The most records any task held unprocessed at once (`queued_records_max`).
    pub max_queued: Option<f64>,
}

fn mean(rows: &[&SecondRow], f: impl Fn(&SecondRow) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = rows.iter().filter_map(|r| f(r)).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Mean per-batch latency (µs) of `rep`'s run in the 5 s before second `start`, and in the first
/// 10 seconds after it in which the sources took input. Every protocol's per-batch latency runs
/// from the first record taken to the last output, waits for state included (DRRS's records
/// waiting for their bucket, Koala's fetches). The seconds after are counted from when input
/// flows: while stop-and-restart's sources are paused, the only batches are the sink's (a few
/// µs), which would read as a per-batch latency thousands of times below every other protocol's;
/// its cost is the pause, which the pause column shows.
pub fn mean_batch_latency(rep: &ReportSummary, start: i64) -> (Option<f64>, Option<f64>) {
    batch_latency_around(&rep.table.rows, start)
}

fn batch_latency_around(rows: &[SecondRow], start: i64) -> (Option<f64>, Option<f64>) {
    let before: Vec<&SecondRow> = rows.iter().filter(|r| r.t_s >= start - 5 && r.t_s < start).collect();
    let after: Vec<&SecondRow> =
        rows.iter().filter(|r| r.t_s > start && r.throughput > 0.0).take(10).collect();
    (mean(&before, |r| r.batch_latency_mean_us), mean(&after, |r| r.batch_latency_mean_us))
}

/// The outcome of a finished demo-like run, and its report (plots written into `out`).
pub fn outcome(summary: &JobSummary, out: &Path) -> anyhow::Result<(Outcome, ReportSummary)> {
    let rep = report(&summary.metrics_db, Some(&summary.run), out).context("reading the run's metrics")?;
    let first = rep.reconfigurations.first();
    let latency = first.map_or((None, None), |r| mean_batch_latency(&rep, r.start_t_s));
    let outcome = Outcome {
        protocol: rep.run.protocol.clone(),
        state_moved: rep.state_moved,
        recovery_s: first.and_then(|r| r.recovery_s),
        recovery_p50_s: first.and_then(|r| r.recovery_p50_s),
        lag_recovery_s: first.and_then(|r| r.lag_recovery_s),
        drain_limit: first.and_then(|r| r.drain_limit),
        watched_s: first.and_then(|r| recovery_watched_s(r.start_t_s, rep.input_last_t_s)),
        peak_latency_p99_ms: rep.peak_latency_p99_ms,
        peak_latency_p50_ms: rep.peak_latency_p50_ms,
        dip: first.and_then(|r| r.dip),
        latency,
        peak_lag_ms: rep.peak_lag_mean_ms,
        tail_lag_p99_ms: rep.tail_lag_p99_ms,
        pause_ms: rep.pause_ms_total,
        max_queued: rep.max_queued_records.as_ref().map(|(_, n)| *n),
    };
    Ok((outcome, rep))
}

fn mib(b: f64) -> String {
    crate::human::human_bytes(b as u64)
}

fn opt_us(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0} µs"))
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0} ms"))
}

fn fmt_dip(dip: Option<ThroughputDip>) -> String {
    dip.map_or("-".into(), |d| d.short())
}

/// The demo's closing lines: the report's summary (what `koala report` prints for this run),
/// then the demo's own checks on it.
pub fn print_outcome(o: &Outcome, rep: &ReportSummary) {
    println!();
    print!("{rep}");
    for line in demo_lines(o) {
        println!("{line}");
    }
    println!(
        "demo: per-batch latency {} before the reconfiguration, {} after",
        opt_us(o.latency.0),
        opt_us(o.latency.1)
    );
}

/// The demo's own lines on its run: peak latency and recovery, each on the p99 with the median
/// named beside it, and the drain limit.
fn demo_lines(o: &Outcome) -> Vec<String> {
    let recovery = match o.recovery_s {
        Some(s) => format!("demo: recovered {s} s after the reconfiguration started"),
        None => format!(
            "demo: not recovered {} after the reconfiguration started (the run ended first)",
            fmt_recovery(None, o.watched_s)
        ),
    };
    vec![
        format!(
            "demo: peak end-to-end latency p99 {} (median {}), peak source lag {} (overloaded if above 1 s), \
             lag p99 over the last {TAIL_S} s {} (drained if below 200 ms)",
            opt_ms(o.peak_latency_p99_ms),
            opt_ms(o.peak_latency_p50_ms),
            opt_ms(o.peak_lag_ms),
            opt_ms(o.tail_lag_p99_ms)
        ),
        format!(
            "{recovery} ({}; on the median {}, on source lag {})",
            recovery_rule(),
            fmt_recovery(o.recovery_p50_s, o.watched_s),
            fmt_recovery(o.lag_recovery_s, o.watched_s)
        ),
        match &o.drain_limit {
            Some(limit) => format!("demo: {limit}: no protocol recovers sooner"),
            None => "demo: drain limit n/a (the run has no emulated capacity or rate schedule)".into(),
        },
    ]
}

/// The `koala compare` table.
pub fn print_table(outcomes: &[Outcome]) {
    println!();
    println!(
        "recovery: {}; drain limit: the backlog at the start ÷ the spare capacity after it, which no \
         protocol can beat",
        recovery_rule()
    );
    println!(
        "{:<18} {:>12} {:>12} {:>12} {:>10} {:>11} {:>11} {:>10} {:>12} {:>10} {:>12} {:>26} {:>22} {:>9} {:>10}",
        "protocol",
        "on demand",
        "background",
        "eager",
        "recovery",
        "drain limit",
        "median rec.",
        "lag rec.",
        "peak e2e p99",
        "peak lag",
        "tail p99",
        "lowest rate (vs offered)",
        "batch latency",
        "pause",
        "max queued"
    );
    for o in outcomes {
        let rec = fmt_recovery(o.recovery_s, o.watched_s);
        let median_rec = fmt_recovery(o.recovery_p50_s, o.watched_s);
        let lag_rec = fmt_recovery(o.lag_recovery_s, o.watched_s);
        let lat = format!("{} → {}", opt_us(o.latency.0), opt_us(o.latency.1));
        println!(
            "{:<18} {:>12} {:>12} {:>12} {:>10} {:>11} {:>11} {:>10} {:>12} {:>10} {:>12} {:>26} {:>22} {:>6} ms {:>10}",
            o.protocol,
            mib(o.state_moved.on_demand),
            mib(o.state_moved.background),
            mib(o.state_moved.eager),
            rec,
            fmt_drain_limit(o.drain_limit.as_ref()),
            median_rec,
            lag_rec,
            opt_ms(o.peak_latency_p99_ms),
            opt_ms(o.peak_lag_ms),
            opt_ms(o.tail_lag_p99_ms),
            fmt_dip(o.dip),
            lat,
            o.pause_ms,
            o.max_queued.map_or("-".into(), |n| format!("{n:.0}"))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t_s: i64, throughput: f64, batch: Option<f64>) -> SecondRow {
        SecondRow {
            t_s,
            throughput,
            output: throughput,
            batch_latency_mean_us: batch,
            ..SecondRow::default()
        }
    }

    #[test]
    fn the_demo_names_the_p99_recovery_with_the_median_beside_it_and_the_drain_limit() {
        let o = Outcome {
            protocol: "koala".into(),
            state_moved: StateMoved::default(),
            recovery_s: Some(21),
            recovery_p50_s: Some(8),
            lag_recovery_s: Some(6),
            drain_limit: Some(DrainLimit { backlog: 120_000.0, capacity: 80_000.0, offered: 60_000.0 }),
            watched_s: Some(31),
            peak_latency_p99_ms: Some(2827.0),
            peak_latency_p50_ms: Some(2145.0),
            dip: None,
            latency: (None, None),
            peak_lag_ms: Some(1900.0),
            tail_lag_p99_ms: Some(20.0),
            pause_ms: 0,
            max_queued: None,
        };
        let lines = demo_lines(&o);
        assert!(
            lines[0].starts_with("demo: peak end-to-end latency p99 2827 ms (median 2145 ms)"),
            "{lines:?}"
        );
        assert_eq!(
            lines[1],
            "demo: recovered 21 s after the reconfiguration started (e2e p99 (worst sink) back within 2× \
             its level before the surge for 5 s; on the median 8 s, on source lag 6 s)"
        );
        assert_eq!(
            lines[2],
            "demo: drain limit 6 s (backlog 120 000 records ÷ 20 000 records/s spare): no protocol recovers sooner"
        );
        let unrecovered = Outcome { recovery_s: None, drain_limit: None, ..o };
        let lines = demo_lines(&unrecovered);
        assert!(lines[1].starts_with("demo: not recovered > 31 s after"), "{lines:?}");
    }

    /// Stop-and-restart's shape: input paused for 20 s after the start, one sink-only second of
    /// 4 µs, then 10 seconds of 2 ms batches. The seconds after are those 10, not the sink's.
    #[test]
    fn the_seconds_after_a_reconfiguration_start_when_input_flows_again() {
        let mut rows: Vec<SecondRow> = (0..10).map(|t| row(t, 1000.0, Some(1000.0))).collect();
        rows.push(row(10, 500.0, Some(1000.0)));
        rows.push(row(11, 0.0, Some(4.0)));
        rows.extend((12..31).map(|t| row(t, 0.0, None)));
        rows.extend((31..41).map(|t| row(t, 3000.0, Some(2000.0))));
        rows.extend((41..50).map(|t| row(t, 1000.0, Some(9000.0))));
        assert_eq!(batch_latency_around(&rows, 10), (Some(1000.0), Some(2000.0)));
        // A protocol that never pauses: the 10 seconds right after the start.
        let steady: Vec<SecondRow> =
            (0..30).map(|t| row(t, 1000.0, Some(if t > 10 { 5.0 } else { 1.0 }))).collect();
        assert_eq!(batch_latency_around(&steady, 10), (Some(1.0), Some(5.0)));
    }
}
