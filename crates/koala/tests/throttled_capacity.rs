//! Capacity emulation end to end (docs/architecture.md §4): with `[runtime] task_records_per_sec`
//! every task of the stateful operator processes at most its budget per second — also while a
//! scale-out moves state, under either protocol — and the job still processes every record.
//! Judged by the counts the run reports (per-second `records_in` samples), never by timing.

mod common;

use std::path::Path;

use common::verify::RunRecord;
use rusqlite::{Connection, OpenFlags};

const BUDGET: f64 = 2_000.0;
const RECORDS: u64 = 24_000;

/// Every `records_in` sample of the aggregate's tasks: (task, value).
fn aggregate_samples(db: &Path, run: &str, metric: &str) -> Vec<(String, f64)> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("open metrics db");
    let mut stmt = conn
        .prepare("SELECT task, value FROM metrics WHERE run = ?1 AND metric = ?2 AND task LIKE 'aggregate.%'")
        .expect("query");
    stmt.query_map([run, metric], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

fn throttled_run(protocol: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = common::generator(RECORDS, 11);
    let mut config = common::config_top(
        dir.path(),
        "keyed-aggregate",
        &format!("protocol = \"{protocol}\""),
        &[("source", 2), ("aggregate", 2), ("sink", 1)],
        &generator,
        "",
    );
    // Sources offer 6000 records/s, above the 2 × 2000 the aggregate may take: the budget binds
    // from the first second; the scale-out (to 4 × 2000) lands while the backlog is there.
    config.push_str(&format!(
        "rate = [{{ at_ms = 0, records_per_sec = 6000.0 }}]\n\n[runtime]\ntask_records_per_sec = {BUDGET}\nlink_mb_per_sec = 50\n\n[[reconfigurations]]\nat_s = 1.0\noperator = \"aggregate\"\nparallelism = 4\n"
    ));
    let (out, stdout) = common::run_job_logged(dir.path(), &config);
    let rec = RunRecord::read(&out.join("metrics.db")).expect("run record");
    assert_eq!(rec.protocol, protocol);
    assert_eq!(rec.completed(), 1, "the scale-out did not complete:\n{stdout}\n{config}");
    assert!(
        stdout.contains("task_records_per_sec = 2000") && stdout.contains("link_mb_per_sec = 50"),
        "the summary does not print the capacity settings:\n{stdout}"
    );

    let samples = aggregate_samples(&out.join("metrics.db"), &rec.run, koala_types::metric::RECORDS_IN);
    let processed: f64 = samples.iter().map(|(_, v)| v).sum();
    assert_eq!(processed as u64, RECORDS, "every record processed once by the aggregate");
    // A sample covers one second (the last one of a task less). The token bucket lets through at
    // most its rate, plus 50 ms of banked budget, plus the one batch that goes into debt.
    let bound = BUDGET * 1.05 + BUDGET * 0.05 + 256.0;
    for (task, v) in &samples {
        assert!(*v <= bound, "{protocol}: {task} processed {v} records in one second, budget {BUDGET}");
    }
    // The budget was what bound the tasks: some second ran close to it, and input was held back.
    let busiest = samples.iter().map(|(_, v)| *v).fold(0.0, f64::max);
    assert!(busiest >= 0.7 * BUDGET, "{protocol}: no task got near its budget (max {busiest}/s)");
    let throttled = rec.total(koala_types::metric::THROTTLED_MS);
    assert!(throttled > 0.0, "{protocol}: no task was ever held back by its budget");
    // The throttle is not a pause (`input_paused_ms` and `throttled_ms` never count the same
    // time): the aggregate's tasks, throttled all along, are never paused under stop-and-restart,
    // whose pause is at the sources, the scale-out's upstreams; Koala never pauses a source.
    let paused = |prefix: &str| -> f64 {
        let samples = rec
            .sums
            .iter()
            .filter(|((t, m), _)| t.starts_with(prefix) && m == koala_types::metric::INPUT_PAUSED_MS);
        samples.map(|(_, v)| *v).sum()
    };
    let (sources, aggregates) = (paused("source."), paused("aggregate."));
    if protocol == "stop-and-restart" {
        assert!(sources > 0.0, "the sources paused for the scale-out but report no input_paused_ms");
        assert_eq!(aggregates, 0.0, "{protocol}: a throttled task reported a pause");
    } else {
        assert_eq!(sources, 0.0, "{protocol}: a source reported a pause");
    }
    // New tasks are throttled too: records kept flowing to them and their rate stayed bounded.
    for new in ["aggregate.2", "aggregate.3"] {
        assert!(rec.task_sum(new, koala_types::metric::RECORDS_IN) > 0.0, "{protocol}: {new} idle");
    }
}

#[test]
fn a_throttled_keyed_aggregate_stays_within_its_budget_under_koala() {
    throttled_run("koala");
}

#[test]
fn a_throttled_keyed_aggregate_stays_within_its_budget_under_stop_and_restart() {
    throttled_run("stop-and-restart");
}
