#![allow(clippy::unwrap_used)]

use super::*;
use koala_types::metric;

fn store() -> (tempfile::TempDir, MetricsStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = MetricsStore::open(&dir.path().join("m.db")).unwrap();
    (dir, store)
}

fn run(name: &str, started_ms: u64) -> RunInfo {
    RunInfo {
        run: name.into(),
        started_ms,
        query: "q".into(),
        protocol: "koala".into(),
        config: String::new(),
    }
}

fn sample(time_s: u64, task: &str, metric: &str, value: f64) -> MetricSample {
    MetricSample { time_s, task: task.into(), metric: metric.into(), value }
}

#[test]
fn aggregates_respect_scope_and_skip_non_finite() {
    let (_dir, mut s) = store();
    s.begin_run(&run("r", 0)).unwrap();
    s.insert_samples(
        "r",
        &[
            sample(1, "source.0", metric::SOURCE_LAG_MEAN_MS, 10.0),
            sample(1, "source.0", metric::RECORDS_IN, 100.0),
            sample(1, "map.0", metric::RECORDS_IN, 40.0),
            sample(1, "map.1", metric::RECORDS_IN, 60.0),
            sample(2, "map.1", metric::RECORDS_IN, f64::NAN),
        ],
    )
    .unwrap();
    let lag = TaskScope::Reporting(metric::SOURCE_LAG_MEAN_MS);
    let not_lag = TaskScope::NotReporting(metric::SOURCE_LAG_MEAN_MS);
    let get = |agg, scope| s.per_second("r", metric::RECORDS_IN, agg, scope).unwrap();
    assert_eq!(get(Aggregate::Sum, TaskScope::All), vec![(1, 200.0)]);
    assert_eq!(get(Aggregate::Sum, lag), vec![(1, 100.0)]);
    assert_eq!(get(Aggregate::Mean, not_lag), vec![(1, 50.0)]);
    assert_eq!(get(Aggregate::Max, not_lag), vec![(1, 60.0)]);
}

#[test]
fn grouped_aggregates_combine_an_operators_tasks_from_a_second_on() {
    let (_dir, mut s) = store();
    s.begin_run(&run("r", 0)).unwrap();
    s.insert_samples(
        "r",
        &[
            sample(1, "agg2.0", metric::RECORDS_IN, 1.0),
            sample(2, "agg2.0", metric::RECORDS_IN, 40.0),
            sample(2, "agg2.11", metric::RECORDS_IN, 60.0),
            sample(2, "map.0", metric::RECORDS_IN, 7.0),
            sample(2, "map.0", metric::RECORDS_OUT, 9.0),
        ],
    )
    .unwrap();
    let get = |agg, grouping| s.per_second_grouped("r", metric::RECORDS_IN, agg, grouping, 2).unwrap();
    let row = |g: &str, v| (g.to_string(), 2, v);
    assert_eq!(get(Aggregate::Sum, Grouping::Operator), vec![row("agg2", 100.0), row("map", 7.0)]);
    assert_eq!(get(Aggregate::Max, Grouping::Operator), vec![row("agg2", 60.0), row("map", 7.0)]);
    assert_eq!(
        get(Aggregate::Sum, Grouping::Task),
        vec![row("agg2.0", 40.0), row("agg2.11", 60.0), row("map.0", 7.0)]
    );
}

#[test]
fn runs_are_listed_and_duplicates_rejected() {
    let (_dir, mut s) = store();
    assert_eq!(s.latest_run().unwrap(), None);
    s.begin_run(&run("a", 5)).unwrap();
    s.begin_run(&run("b", 9)).unwrap();
    let err = s.begin_run(&run("a", 7)).unwrap_err();
    assert!(err.to_string().contains("begin run \"a\""), "{err}");
    assert_eq!(s.runs().unwrap().len(), 2);
    assert_eq!(s.latest_run().unwrap().unwrap().run, "b");
    assert_eq!(s.run("a").unwrap().unwrap().started_ms, 5);
    assert_eq!(s.run("zz").unwrap(), None);
    let too_big = s.begin_run(&run("c", u64::MAX)).unwrap_err();
    assert!(too_big.to_string().contains("begin run \"c\""), "{too_big}");
}

#[test]
fn reconfiguration_lifecycle() {
    let (_dir, mut s) = store();
    s.begin_run(&run("r", 0)).unwrap();
    let start = ReconfigurationStart {
        epoch: 1,
        operator: "agg".into(),
        kind: "scale_out".into(),
        protocol: "koala".into(),
        started_ms: 1_000,
        buckets_moved: 64,
        detail: "4→8".into(),
    };
    s.reconfiguration_started("r", &start).unwrap();
    let mut done = ReconfigurationCompletion {
        epoch: 1,
        operator: "agg".into(),
        completed_ms: 3_000,
        bytes_moved: 1 << 20,
        pause_ms: None,
    };
    s.reconfiguration_completed("r", &done).unwrap();
    let stored = s.reconfigurations("r").unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].completed_ms, Some(3_000));
    assert_eq!(stored[0].bytes_moved, 1 << 20);
    assert_eq!(stored[0].buckets_moved, 64);
    done.epoch = 2;
    let err = s.reconfiguration_completed("r", &done).unwrap_err();
    assert!(matches!(err, MetricsStoreError::UnknownReconfiguration { epoch: 2, .. }));
}

#[test]
fn open_names_the_path_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("missing-dir").join("m.db");
    let err = MetricsStore::open(&bad).unwrap_err();
    assert!(err.to_string().contains("missing-dir"), "{err}");
}
