//! `koala demo` (shortened) exits 0, prints per-second progress, and leaves a metrics DB with
//! samples of every runtime metric plus the PNG plots, in the run's own directory
//! (`<output_dir>/runs/<run>/`, `<output_dir>/latest`).

mod common;

use koala_coordinator::metrics_store::{Aggregate, MetricsStore, TaskScope};
use koala_types::metric;

#[test]
fn demo_writes_progress_metrics_and_plots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_dir = dir.path().join("out");
    let out = common::koala()
        .args(["demo", "--duration-s", "4", "--output-dir"])
        .arg(&out_dir)
        .output()
        .expect("start demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let progress = stdout.lines().filter(|l| l.starts_with('[') && l.contains("rec/s")).count();
    assert!(progress >= 3, "expected a progress line per second:\n{stdout}");
    assert!(stdout.contains("done: run"), "no summary:\n{stdout}");

    let store = MetricsStore::open(&out_dir.join("metrics.db")).expect("metrics db");
    let run = store.latest_run().expect("read runs").expect("a run").run;
    for m in [
        metric::RECORDS_IN,
        metric::RECORDS_OUT,
        metric::BATCH_LATENCY_MEAN_US,
        metric::BATCH_LATENCY_P99_US,
        metric::BATCH_LATENCY_MAX_US,
        metric::SOURCE_LAG_MEAN_MS,
        metric::SOURCE_LAG_P99_MS,
        metric::LATENCY_P50_MS,
        metric::LATENCY_P99_MS,
        metric::LATENCY_MAX_MS,
        metric::STATE_READS,
        metric::STATE_WRITES,
        metric::BACKPRESSURE_MS,
    ] {
        let series = store.per_second(&run, m, Aggregate::Sum, TaskScope::All).expect("query");
        assert!(!series.is_empty(), "no samples of {m}");
    }
    // The longest batch of a second is at least its 99th percentile, in every second.
    let p99 =
        store.per_second(&run, metric::BATCH_LATENCY_P99_US, Aggregate::Max, TaskScope::All).expect("query");
    let max =
        store.per_second(&run, metric::BATCH_LATENCY_MAX_US, Aggregate::Max, TaskScope::All).expect("query");
    assert_eq!(p99.len(), max.len(), "batch p99 and max cover different seconds");
    for ((t, p), (_, m)) in p99.iter().zip(&max) {
        assert!(m >= p, "second {t}: longest batch {m} µs below the p99 {p} µs");
    }
    let reads: f64 = store
        .per_second(&run, metric::STATE_READS, Aggregate::Sum, TaskScope::All)
        .expect("query")
        .iter()
        .map(|(_, v)| v)
        .sum();
    assert!(reads > 0.0, "the keyed aggregate read no state");
    // A sink's slowest record of a second is at least its 99th percentile.
    let p99 = store.per_second(&run, metric::LATENCY_P99_MS, Aggregate::Max, TaskScope::All).expect("query");
    let max = store.per_second(&run, metric::LATENCY_MAX_MS, Aggregate::Max, TaskScope::All).expect("query");
    for ((t, p), (_, m)) in p99.iter().zip(&max) {
        assert!(m >= p, "second {t}: end-to-end latency max {m} ms below the p99 {p} ms");
    }
    let run_dir = out_dir.join("latest");
    assert_eq!(std::fs::read_link(&run_dir).ok(), Some(std::path::Path::new("runs").join(&run)));
    for png in ["throughput.png", "lag.png", "latency.png", "batch_latency.png", "state_moved.png"] {
        let bytes = std::fs::read(run_dir.join(png)).unwrap_or_else(|e| panic!("{png}: {e}"));
        assert!(bytes.starts_with(b"\x89PNG"), "{png} is not a PNG");
    }
}
