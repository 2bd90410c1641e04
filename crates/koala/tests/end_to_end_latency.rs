//! End-to-end latency (docs/architecture.md §9): every record carries the time it was due at its
//! source, and the sink reports arrival − due per second. A record is never faster end to end
//! than it left its source, and a stop-and-restart pause, which holds records at the sources,
//! shows in the sink's latency. Judged from the run's metrics database, never by timing.

mod common;

use std::path::Path;

use common::verify::RunRecord;
use koala_types::metric;
use rusqlite::{Connection, OpenFlags};

const RATE: f64 = 2_000.0;
const RECORDS: u64 = 10_000;

/// Every sample of `metric` from tasks whose name starts with `prefix`: (unix second, value).
fn samples(db: &Path, run: &str, prefix: &str, metric: &str) -> Vec<(u64, f64)> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("open metrics db");
    let mut stmt = conn
        .prepare(
            "SELECT time, value FROM metrics WHERE run = ?1 AND metric = ?2 AND task LIKE ?3 ORDER BY time",
        )
        .expect("query");
    stmt.query_map([run, metric, &format!("{prefix}.%")], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

fn max(values: &[(u64, f64)]) -> f64 {
    values.iter().map(|(_, v)| *v).fold(0.0, f64::max)
}

#[test]
fn the_sinks_latency_covers_the_source_lag_and_a_stop_and_restart_pause() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = common::generator(RECORDS, 5);
    let mut config = common::config_top(
        dir.path(),
        "keyed-aggregate",
        "protocol = \"stop-and-restart\"",
        &[("source", 2), ("aggregate", 2), ("sink", 1)],
        &generator,
        "",
    );
    // A slow emulated link makes the state transfer, and so the sources' pause, take a while.
    config.push_str(&format!(
        "rate = [{{ at_ms = 0, records_per_sec = {RATE} }}]\n\n[runtime]\nlink_mb_per_sec = 0.001\n\n[[reconfigurations]]\nat_s = 2.0\noperator = \"aggregate\"\nparallelism = 4\n"
    ));
    let (out, stdout) = common::run_job_logged(dir.path(), &config);
    let db = out.join("metrics.db");
    let rec = RunRecord::read(&db).expect("run record");
    assert_eq!(rec.completed(), 1, "the scale-out did not complete:\n{stdout}");
    let reconfig = &rec.reconfigurations[0];
    let pause_ms = reconfig.pause_ms.expect("stop-and-restart records its pause") as f64;

    let latency_max = samples(&db, &rec.run, "sink", metric::LATENCY_MAX_MS);
    let latency_p99 = samples(&db, &rec.run, "sink", metric::LATENCY_P99_MS);
    let lag_p99 = samples(&db, &rec.run, "source", metric::SOURCE_LAG_P99_MS);
    let start_s = reconfig.started_ms / 1000;
    let before: Vec<(u64, f64)> = latency_p99.iter().copied().filter(|(t, _)| *t < start_s).collect();
    println!(
        "pause {pause_ms} ms; sink latency p99 before the reconfiguration {before:?}; sink latency max {latency_max:?}; source lag p99 {lag_p99:?}"
    );
    assert!(!latency_p99.is_empty(), "the sink reported no end-to-end latency:\n{stdout}");
    // Every record's end-to-end latency includes its source lag (HDR histograms: 3 digits).
    assert!(
        max(&latency_max) >= 0.99 * max(&lag_p99),
        "sink latency max {} below the source lag p99 {}",
        max(&latency_max),
        max(&lag_p99)
    );
    // The records due while the sources were paused reached the sink at least about the pause
    // late: far above the latency before the reconfiguration.
    assert!(pause_ms >= 300.0, "the pause ({pause_ms} ms) is too short to judge: slow the link down");
    assert!(
        max(&latency_max) >= 0.8 * pause_ms,
        "sink latency max {} ms, but the sources were paused {pause_ms} ms",
        max(&latency_max)
    );
    assert!(
        max(&latency_max) >= 2.0 * max(&before) + 100.0,
        "sink latency max {} ms barely above the {} ms before the pause",
        max(&latency_max),
        max(&before)
    );
}

/// Window results come from timers: they carry the latest due time their task processed (never
/// 0 = unknown once a task has processed records), so the sink measures them like any record,
/// with a latency of the order of the window's wait, not of the unix epoch.
#[test]
fn window_results_carry_due_times_their_sink_measures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = common::generator(RECORDS, 6);
    let mut config = common::config(
        dir.path(),
        "tumbling-window",
        &[("source", 2), ("window", 2), ("sink", 1)],
        &generator,
        "window_ms = 500\n",
    );
    config.push_str(&format!("rate = [{{ at_ms = 0, records_per_sec = {RATE} }}]\n"));
    let (out, stdout) = common::run_job_logged(dir.path(), &config);
    let db = out.join("metrics.db");
    let rec = RunRecord::read(&db).expect("run record");
    let latency_max = samples(&db, &rec.run, "sink", metric::LATENCY_MAX_MS);
    println!("tumbling-window sink latency max {latency_max:?}");
    assert!(!latency_max.is_empty(), "the sink measured no window result:\n{stdout}");
    assert!(max(&latency_max) < 60_000.0, "a window result without its due time: {latency_max:?}");
}
