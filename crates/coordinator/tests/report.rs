//! `koala report` on a synthetic run: steady input, one scale-out that dips throughput and spikes
//! lag and end-to-end latency, then recovery (latency after lag: records still inside the job).
//! Checks the summary numbers and that the plots are real PNGs.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use koala_coordinator::metrics_store::{
    MetricSample, MetricsStore, ReconfigurationCompletion, ReconfigurationStart, RunInfo,
};
use koala_coordinator::report::{
    ReportError, overlay_offered, report, settle_bytes_moved, write_throughput_overlay,
};
use koala_types::metric;

const RUN_START_S: u64 = 1_700_000_000;
const SECONDS: u64 = 120;
const RECONFIG_AT: u64 = 60;

fn sample(time_s: u64, task: &str, metric: &str, value: f64) -> MetricSample {
    MetricSample { time_s, task: task.into(), metric: metric.into(), value }
}

/// Total source throughput at second `t` since the start: 1000/s, 200/s during the 5 s pause,
/// 1500/s while draining the backlog for 10 s, then 1000/s again.
fn throughput(t: u64) -> f64 {
    match t {
        60..=64 => 200.0,
        65..=74 => 1500.0,
        _ => 1000.0,
    }
}

/// Mean source lag: 20 ms steady; a spike; a 1 s relapse at 73 s; healthy again from 74 s.
fn lag(t: u64) -> f64 {
    match t {
        60..=69 => 2000.0,
        70 => 500.0,
        73 => 100.0,
        _ => 20.0,
    }
}

/// The sink's median end-to-end latency: 30 ms steady; 3 s from the scale-out until 79 s, while
/// the backlog the sources already emitted drains through the job; healthy from 80 s.
fn latency(t: u64) -> f64 {
    match t {
        60..=79 => 3000.0,
        _ => 30.0,
    }
}

/// The sink's p99: 60 ms steady, 6 s while the median is 3 s, then a slow tail of 400 ms until
/// 85 s that the median does not show; healthy from 86 s.
fn latency_p99(t: u64) -> f64 {
    match t {
        60..=79 => 6000.0,
        80..=85 => 400.0,
        _ => 60.0,
    }
}

fn write_run(db: &Path, run: &str, started_s: u64) {
    let mut store = MetricsStore::open(db).unwrap();
    store
        .begin_run(&RunInfo {
            run: run.into(),
            started_ms: started_s * 1000 + 250,
            query: "nexmark-q8".into(),
            protocol: "koala".into(),
            config: "{\"parallelism\": 2}".into(),
        })
        .unwrap();
    for t in 0..SECONDS {
        let at = |task: &str, metric: &str, value| sample(started_s + t, task, metric, value);
        let mut samples = Vec::new();
        for source in ["source.0", "source.1"] {
            samples.push(at(source, metric::RECORDS_IN, throughput(t) / 2.0));
            samples.push(at(source, metric::SOURCE_LAG_MEAN_MS, lag(t)));
            samples.push(at(source, metric::SOURCE_LAG_P99_MS, lag(t) * 2.0));
        }
        for (i, task) in ["aggregate.0", "aggregate.1"].into_iter().enumerate() {
            let base = 100.0 * (2 * i + 1) as f64; // 100 and 300 µs: mean 200
            samples.push(at(task, metric::RECORDS_IN, throughput(t)));
            samples.push(at(task, metric::BATCH_LATENCY_MEAN_US, base));
            samples.push(at(task, metric::BATCH_LATENCY_P99_US, base * 3.0));
            samples.push(at(task, metric::BATCH_LATENCY_MAX_US, base * 5.0));
            samples.push(at(task, metric::BACKPRESSURE_MS, 0.0));
            samples.push(at(task, metric::QUEUED_RECORDS, if t == 61 { 40.0 * (i + 1) as f64 } else { 0.0 }));
            samples.push(at(
                task,
                metric::QUEUED_RECORDS_MAX,
                if t == 61 { 40.0 * (i + 1) as f64 } else { 1.0 },
            ));
            samples.push(at(task, metric::INPUT_PAUSED_MS, 0.0));
        }
        // Both sources paused 800 ms in one second and 700 ms in the next (the longest task counts
        // per second, not the sum over tasks).
        for (source, ms) in [("source.0", [800.0, 700.0]), ("source.1", [600.0, 700.0])] {
            let paused = match t {
                60 => ms[0],
                61 => ms[1],
                _ => 0.0,
            };
            samples.push(at(source, metric::INPUT_PAUSED_MS, paused));
        }
        samples.push(at("sink.0", metric::RECORDS_IN, throughput(t)));
        samples.push(at("sink.0", metric::LATENCY_P50_MS, latency(t)));
        samples.push(at("sink.0", metric::LATENCY_P99_MS, latency_p99(t)));
        samples.push(at("sink.0", metric::LATENCY_MAX_MS, latency(t) * 3.0));
        // A second sink, faster: the columns take the worst sink.
        samples.push(at("sink.1", metric::LATENCY_P50_MS, 10.0));
        samples.push(at("sink.1", metric::LATENCY_P99_MS, 10.0));
        samples.push(at("sink.1", metric::LATENCY_MAX_MS, 10.0));
        if (RECONFIG_AT..RECONFIG_AT + 5).contains(&t) {
            samples.push(at("aggregate.0", metric::STATE_BYTES_ON_DEMAND, 1_048_576.0));
            samples.push(at("aggregate.0", metric::STATE_BYTES_BACKGROUND, 524_288.0));
            samples.push(at("aggregate.1", metric::STATE_BYTES_EAGER, 1024.0));
        }
        store.insert_samples(run, &samples).unwrap();
    }
    let start_ms = (started_s + RECONFIG_AT) * 1000 + 400;
    store
        .reconfiguration_started(
            run,
            &ReconfigurationStart {
                epoch: 1,
                operator: "aggregate".into(),
                kind: "scale_out".into(),
                protocol: "koala".into(),
                started_ms: start_ms,
                buckets_moved: 64,
                detail: "2 -> 4 tasks".into(),
            },
        )
        .unwrap();
    store
        .reconfiguration_completed(
            run,
            &ReconfigurationCompletion {
                epoch: 1,
                operator: "aggregate".into(),
                completed_ms: start_ms + 5_000,
                bytes_moved: 5 * 1_048_576,
                // The coordinator's Drain-to-completion figure: not the report's pause.
                pause_ms: Some(2_000),
            },
        )
        .unwrap();
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    assert!(bytes.len() > 1000, "{} is only {} bytes", path.display(), bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
}

#[test]
fn scale_out_dip_and_backlog_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metrics.db");
    write_run(&db, "older", RUN_START_S - 10_000);
    write_run(&db, "scale-out", RUN_START_S);
    let out = dir.path().join("report");

    let summary = report(&db, None, &out).unwrap();
    println!("{summary}\n{}", summary.table);

    assert_eq!(summary.run.run, "scale-out", "latest run is the default");
    assert_eq!(summary.table.rows.len(), SECONDS as usize);
    assert_eq!(summary.table.rows[0].t_s, 0);
    // 60 × 1000 + 5 × 200 + 10 × 1500 + 45 × 1000; the aggregate tasks' records_in do not count.
    assert_eq!(summary.records_total, 121_000.0);
    assert!((summary.mean_throughput - 121_000.0 / 120.0).abs() < 1e-9);
    assert_eq!(summary.peak_lag_mean_ms, Some(2000.0));
    assert_eq!(summary.peak_lag_p99_ms, Some(4000.0));
    assert_eq!(summary.state_moved.on_demand, 5.0 * 1_048_576.0);
    assert_eq!(summary.state_moved.background, 2.5 * 1_048_576.0);
    assert_eq!(summary.state_moved.eager, 5.0 * 1024.0);
    let text = summary.to_string();
    assert!(
        text.contains(
            "state moved: 7.50 MiB (5.00 MiB on demand, 2.50 MiB in the background, 5.0 KiB eager)"
        ),
        "{text}"
    );
    assert_eq!(summary.pause_ms_total, 1_500, "Σ over seconds of the longest task's input_paused_ms");
    assert_eq!(summary.max_queued_records, Some(("aggregate.1".to_string(), 80.0)));
    assert!(
        text.contains("input paused: 1500 ms")
            && text.contains("queued records: at most 80 (task aggregate.1)"),
        "{text}"
    );
    let moving = &summary.table.rows[RECONFIG_AT as usize];
    assert_eq!(moving.state_bytes_moved, 1_048_576.0 + 524_288.0 + 1024.0, "all three kinds per second");
    let row = &summary.table.rows[10];
    assert_eq!(row.batch_latency_mean_us, Some(200.0), "mean over non-source tasks (sinks report none)");
    assert_eq!(row.batch_latency_p99_us, Some(900.0), "max over non-source tasks");
    assert_eq!(
        (row.latency_p50_ms, row.latency_p99_ms, row.latency_max_ms),
        (Some(30.0), Some(60.0), Some(90.0))
    );
    assert_eq!(summary.peak_latency_p50_ms, Some(3000.0));
    assert_eq!(summary.peak_latency_p99_ms, Some(6000.0));
    assert_eq!(row.batch_latency_max_us, Some(1500.0), "the longest batch of any non-source task");
    let table = summary.table.to_string();
    assert!(
        table.lines().next().is_some_and(|h| h.contains("batch_max_us") && h.contains("e2e_p99_ms")),
        "{table}"
    );

    let dip = summary.worst_dip.unwrap();
    assert_eq!((dip.offered, dip.min, dip.at_t_s), (1000.0, 200.0, 60));
    assert!((dip.ratio() - 0.2).abs() < 1e-12);
    // Lag exceeds max(2 × 20, 20 + 20) = 40 ms from 60 s; 71–72 s are healthy but 73 s is not,
    // so lag recovery holds from 74 s on. The end-to-end median is back under max(60, 50) ms at
    // 80 s, the records the sources had emitted still inside the job until then; its p99 is back
    // under max(120, 80) ms only at 86 s: the recovery is the p99's, 26 s.
    assert_eq!(summary.lag_recovery_s, Some(14));
    assert_eq!((summary.recovery_s, summary.recovery_p50_s), (Some(26), Some(20)));
    let reconfig = &summary.reconfigurations[0];
    assert_eq!((reconfig.start_t_s, reconfig.end_t_s), (60, Some(65)));
    assert_eq!(reconfig.reconfiguration.bytes_moved, 5 * 1_048_576);
    assert_eq!(
        (reconfig.recovery_s, reconfig.recovery_p50_s, reconfig.lag_recovery_s),
        (Some(26), Some(20), Some(14))
    );
    assert_eq!(reconfig.drain_limit, None, "no capacity emulation in this run's config");

    for name in ["throughput.png", "lag.png", "latency.png", "batch_latency.png", "state_moved.png"] {
        assert_png(&out.join(name));
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<img src=\"throughput.png\""));
    assert!(
        html.contains(
            "recovery (longest; e2e p99 (worst sink) back within 2× its level before the surge for 5 s): \
             26 s; on the median: 20 s; on source lag: 14 s"
        ),
        "{html}"
    );
    assert!(html.contains("<img src=\"latency.png\""));
    assert_eq!(summary.files.len(), 6);

    let older = report(&db, Some("older"), &out).unwrap();
    assert_eq!(older.run.run, "older");
    assert_eq!(older.recovery_s, Some(26));
    let text = summary.to_string();
    assert!(
        text.contains(&format!("plots and report written to {}: throughput.png", out.display()))
            && text.contains("report.html"),
        "{text}"
    );
    let unknown = report(&db, Some("nope"), &out).unwrap_err().to_string();
    assert!(
        unknown.contains("its runs (oldest first): older (") && unknown.contains("scale-out ("),
        "{unknown}"
    );
}

#[test]
fn run_without_reconfigurations_or_samples() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metrics.db");
    let mut store = MetricsStore::open(&db).unwrap();
    store
        .begin_run(&RunInfo {
            run: "empty".into(),
            started_ms: RUN_START_S * 1000,
            query: "q".into(),
            protocol: "koala".into(),
            config: String::new(),
        })
        .unwrap();
    let summary = report(&db, Some("empty"), &dir.path().join("out")).unwrap();
    assert!(summary.table.rows.is_empty());
    assert_eq!(summary.records_total, 0.0);
    assert_eq!(summary.worst_dip, None);
    assert_eq!((summary.recovery_s, summary.lag_recovery_s), (None, None));
    assert_eq!(summary.peak_latency_p99_ms, None);
    assert_png(&dir.path().join("out").join("throughput.png"));
}

#[test]
fn bad_requests_name_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metrics.db");
    let out = dir.path().join("out");
    let missing = report(&db, None, &out).unwrap_err();
    assert!(matches!(missing, ReportError::MissingDatabase { .. }), "{missing}");
    assert!(!db.exists(), "a report never creates a database");

    MetricsStore::open(&db).unwrap();
    let none = report(&db, None, &out).unwrap_err();
    assert!(matches!(none, ReportError::NoRuns { .. }), "{none}");
    let unknown = report(&db, Some("nope"), &out).unwrap_err();
    assert!(unknown.to_string().contains("metrics.db"), "{unknown}");
    assert!(unknown.to_string().contains("\"nope\""), "{unknown}");

    // With runs in the store, a bad name lists them.
    write_run(&db, "first", RUN_START_S);
    let unknown = report(&db, Some("nope"), &out).unwrap_err();
    assert!(unknown.to_string().contains("its runs (oldest first): first (nexmark-q8, koala)"), "{unknown}");
}

/// A bounded (or Kafka) job at 8 000 records/s offered: two Koala scale-outs at 4 s and 8 s whose
/// state follows on demand after they complete, a real dip to 4 100 at 5 s, and the input ending
/// in second 12 while the job runs on until 20 s with nothing to take.
#[test]
fn epochs_add_up_and_the_end_of_input_is_neither_a_dip_nor_unrecovered() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metrics.db");
    let mut store = MetricsStore::open(&db).unwrap();
    let run = "bounded";
    store
        .begin_run(&RunInfo {
            run: run.into(),
            started_ms: RUN_START_S * 1000 + 250,
            query: "tumbling-window".into(),
            protocol: "koala".into(),
            config: "[params.source]\nrate = [{ at_ms = 0, records_per_sec = 8000.0 }]\n".into(),
        })
        .unwrap();
    for t in 0..20 {
        let at = |task: &str, metric: &str, value| sample(RUN_START_S + t, task, metric, value);
        let rate = match t {
            5 => 4100.0,
            0..=11 => 8000.0,
            12 => 3000.0,
            _ => 0.0,
        };
        let mut samples = vec![at("source.0", metric::RECORDS_IN, rate)];
        if t <= 12 {
            samples.push(at("source.0", metric::SOURCE_LAG_MEAN_MS, if t == 5 { 900.0 } else { 5.0 }));
            samples.push(at("sink.0", metric::LATENCY_P50_MS, if t == 5 { 900.0 } else { 10.0 }));
        }
        match t {
            5 | 6 => samples.push(at("window.2", metric::STATE_BYTES_ON_DEMAND, 7_000.0)),
            9 => samples.push(at("window.3", metric::STATE_BYTES_ON_DEMAND, 3_000.0)),
            8 => samples.push(at("window.0", metric::STATE_BYTES_EAGER, 1_000.0)),
            _ => {}
        }
        store.insert_samples(run, &samples).unwrap();
    }
    lazy_scale_outs(&mut store, run, &[(1, 4), (2, 8)]);
    drop(store);
    let summary = report(&db, Some(run), &dir.path().join("out")).unwrap();
    let text = summary.to_string();
    println!("{text}");
    let [first, second] = &summary.reconfigurations[..] else { panic!("two epochs: {text}") };
    assert_eq!((first.start_t_s, second.start_t_s), (4, 8), "the second its started_ms falls in");
    // Totals are the sum of the epochs, by kind.
    assert_eq!((first.state_moved.on_demand, first.state_moved.eager), (14_000.0, 0.0));
    assert_eq!((second.state_moved.on_demand, second.state_moved.eager), (3_000.0, 1_000.0));
    assert_eq!(first.state_moved.total() + second.state_moved.total(), summary.state_moved.total());
    assert!(
        text.contains("state moved 13.7 KiB (13.7 KiB on demand, 0 B in the background, 0 B eager)"),
        "{text}"
    );
    // Each epoch's dip is its own: the first's at 5 s, the second's within 8..12 s, not the
    // seconds after the input ended (12 is partial, 13.. have nothing to take).
    let dip = first.dip.unwrap();
    assert_eq!((dip.min, dip.offered, dip.at_t_s), (4100.0, 8000.0, 5));
    let dip = second.dip.unwrap();
    assert_eq!(dip.min, 8000.0, "{dip}");
    assert!((8..12).contains(&dip.at_t_s), "{dip}");
    assert_eq!(summary.input_last_t_s, Some(12));
    assert!(text.contains("worst throughput dip: min 4 100 rec/s of 8 000 offered at t=5 s"), "{text}");
    assert!(!text.contains('%'), "a dip is a rate, not a percentage: {text}");
    // Latency is over its threshold only at 5 s; the end of input is no excursion.
    assert_eq!((first.recovery_p50_s, second.recovery_p50_s), (Some(2), Some(0)));
    assert_eq!((first.lag_recovery_s, second.lag_recovery_s), (Some(2), Some(0)));
    assert_eq!(summary.recovery_p50_s, Some(2));
    assert_eq!(summary.recovery_s, None, "this run's sinks report no p99");
    // The protocol acknowledged no bytes (Koala's state follows after completion, as DRRS's
    // pushes report only through the metrics): once the run ended, each reconfiguration's stored
    // figure is the report's, and they add up to the run's.
    let mut store = MetricsStore::open(&db).unwrap();
    assert!(store.reconfigurations(run).unwrap().iter().all(|r| r.bytes_moved == 0));
    settle_bytes_moved(&mut store, run).unwrap();
    let stored: Vec<u64> = store.reconfigurations(run).unwrap().iter().map(|r| r.bytes_moved).collect();
    assert_eq!(stored, vec![14_000, 4_000]);
    assert_eq!(stored.iter().sum::<u64>() as f64, summary.state_moved.total());
}

/// Koala scale-outs of `window` at 600 ms into each `(epoch, second)`, complete 30 ms later with
/// nothing moved at the hand-over (their state follows on first access).
fn lazy_scale_outs(store: &mut MetricsStore, run: &str, epochs: &[(u64, u64)]) {
    for &(epoch, at_s) in epochs {
        let started_ms = (RUN_START_S + at_s) * 1000 + 600;
        let start = ReconfigurationStart {
            epoch,
            operator: "window".into(),
            kind: "scale_out".into(),
            protocol: "koala".into(),
            started_ms,
            buckets_moved: 40,
            detail: String::new(),
        };
        store.reconfiguration_started(run, &start).unwrap();
        let done = ReconfigurationCompletion {
            epoch,
            operator: "window".into(),
            completed_ms: started_ms + 30,
            bytes_moved: 0,
            pause_ms: Some(0),
        };
        store.reconfiguration_completed(run, &done).unwrap();
    }
}

/// A dip in the second reconfiguration's seconds is the second's, not also
/// the first's. Offered 8 000/s; scale-outs at 4 s and 8 s; the job falls to 6 000 at 5 s and to
/// 2 000 at 9 s. Searched over 60 s from its start (the old window), the first epoch would claim
/// the 9 s dip, long after it completed.
#[test]
fn each_reconfiguration_owns_only_the_dip_in_its_own_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metrics.db");
    let mut store = MetricsStore::open(&db).unwrap();
    let run = "two-dips";
    store
        .begin_run(&RunInfo {
            run: run.into(),
            started_ms: RUN_START_S * 1000 + 250,
            query: "tumbling-window".into(),
            protocol: "koala".into(),
            config: "[params.source]\nrate = [{ at_ms = 0, records_per_sec = 8000.0 }]\n".into(),
        })
        .unwrap();
    for t in 0..20 {
        let rate = match t {
            5 => 6000.0,
            9 => 2000.0,
            0..=15 => 8000.0,
            _ => 0.0,
        };
        // Source tasks are the ones reporting source lag: their records in are the throughput.
        let at = |metric: &str, value| sample(RUN_START_S + t, "source.0", metric, value);
        store
            .insert_samples(run, &[at(metric::RECORDS_IN, rate), at(metric::SOURCE_LAG_MEAN_MS, 5.0)])
            .unwrap();
    }
    lazy_scale_outs(&mut store, run, &[(1, 4), (2, 8)]);
    drop(store);
    let summary = report(&db, Some(run), &dir.path().join("out")).unwrap();
    let [first, second] = &summary.reconfigurations[..] else { panic!("two epochs: {summary}") };
    let (first, second) = (first.dip.unwrap(), second.dip.unwrap());
    assert_eq!((first.min, first.at_t_s), (6000.0, 5), "the first epoch's own dip: {first}");
    assert_eq!((second.min, second.at_t_s), (2000.0, 9), "the second epoch's: {second}");
    assert!(summary.to_string().contains("worst throughput dip: min 2 000 rec/s of 8 000 offered at t=9 s"));
}

/// The plots' data: throughput beside the offered rate and the sinks' output; two
/// reconfigurations in one second are two spans, each from its start to its completion.
#[test]
fn plots_show_offered_and_output_and_every_reconfiguration_as_a_span() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metrics.db");
    let mut store = MetricsStore::open(&db).unwrap();
    store
        .begin_run(&RunInfo {
            run: "spans".into(),
            started_ms: RUN_START_S * 1000,
            query: "q".into(),
            protocol: "koala".into(),
            config: "[params.source]\nrate = [{ at_ms = 0, records_per_sec = 5000.0 }]\n".into(),
        })
        .unwrap();
    for t in 0..10 {
        let at = |task: &str, metric: &str, value| sample(RUN_START_S + t, task, metric, value);
        store
            .insert_samples(
                "spans",
                &[
                    at("source.0", metric::RECORDS_IN, 5000.0),
                    at("source.0", metric::SOURCE_LAG_MEAN_MS, 1.0),
                    at("window.0", metric::RECORDS_IN, 5000.0),
                    at("sink.0", metric::RECORDS_IN, 700.0),
                    at("sink.0", metric::LATENCY_P50_MS, 5.0),
                ],
            )
            .unwrap();
    }
    for (epoch, start_ms, end_ms) in [(1, 4_200, 4_230), (2, 4_600, 4_650)] {
        let started_ms = RUN_START_S * 1000 + start_ms;
        let start = ReconfigurationStart {
            epoch,
            operator: "window".into(),
            kind: "scale_out".into(),
            protocol: "koala".into(),
            started_ms,
            buckets_moved: 8,
            detail: String::new(),
        };
        store.reconfiguration_started("spans", &start).unwrap();
        let done = ReconfigurationCompletion {
            epoch,
            operator: "window".into(),
            completed_ms: RUN_START_S * 1000 + end_ms,
            bytes_moved: 0,
            pause_ms: Some(0),
        };
        store.reconfiguration_completed("spans", &done).unwrap();
    }
    drop(store);
    let out = dir.path().join("out");
    let summary = report(&db, Some("spans"), &out).unwrap();
    let row = &summary.table.rows[3];
    assert_eq!((row.throughput, row.output, row.offered), (5000.0, 700.0, Some(5000.0)), "sinks only");
    let table = summary.table.to_string();
    assert!(table.lines().next().is_some_and(|h| h.contains("out/s") && h.contains("offered/s")), "{table}");
    let spans = summary.spans();
    let times: Vec<(f64, Option<f64>)> = spans.iter().map(|s| (s.start_s, s.end_s)).collect();
    assert_eq!(times, vec![(4.2, Some(4.23)), (4.6, Some(4.65))]);
    assert_eq!(spans[1].label, "2");
    assert!(spans[0].legend.starts_with("1: 4.20→4.23 s scale_out window"), "{}", spans[0].legend);
    assert_png(&out.join("throughput.png"));
    // throughput.png draws what the sources took beside the offered rate and the sinks' output.
    let plots = summary.plot_lines();
    let (_, throughput) = plots.iter().find(|(file, _)| *file == "throughput.png").expect("throughput.png");
    let names: Vec<&str> = throughput.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, ["offered (rate schedule)", "input (sources)", "output (sinks)"]);
    assert_eq!(throughput[0].1[3], (3.5, 5000.0), "offered");
    assert_eq!(throughput[2].1[3], (3.5, 700.0), "the sinks' output");

    // `koala experiment`'s throughput overlay draws the same offered line beside the runs'.
    let (name, points) = overlay_offered(&[&summary]).expect("the run has a rate schedule");
    assert_eq!(name, "offered (rate schedule)");
    assert_eq!(points.len(), 10, "{points:?}");
    assert_eq!(points[3], (3.5, 5000.0), "each second's offered rate at its middle");
    let overlay = out.join("overlay_throughput.png");
    let series = [("koala", summary.table.rows.iter().map(|r| (r.t_s as f64 + 0.5, r.throughput)).collect())];
    write_throughput_overlay(&overlay, "throughput", &series, &[&summary]).unwrap();
    assert_png(&overlay);
    let mut unscheduled = summary.clone();
    unscheduled.table.rows.iter_mut().for_each(|r| r.offered = None);
    assert_eq!(overlay_offered(&[&unscheduled]), None, "no schedule, no offered line");
}

/// A surge at 10 s the two aggregate tasks cannot keep up with, a scale-out to four at 20 s: the
/// drain limit beside the recovery is the backlog at the start over the spare capacity after.
#[test]
fn the_drain_limit_is_printed_beside_the_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metrics.db");
    let mut store = MetricsStore::open(&db).unwrap();
    let run = "surge";
    let config = "query = \"keyed-aggregate\"\nworkers = 2\nduration_s = 60\n\
                  [parallelism]\nsource = 1\naggregate = 2\nsink = 1\n\
                  [runtime]\ntask_records_per_sec = 1000\n\
                  [params.source]\nrate = [{ at_ms = 0, records_per_sec = 1400.0 }, \
                  { at_ms = 10000, records_per_sec = 2800.0 }]\n";
    store
        .begin_run(&RunInfo {
            run: run.into(),
            started_ms: RUN_START_S * 1000,
            query: "keyed-aggregate".into(),
            protocol: "koala".into(),
            config: config.into(),
        })
        .unwrap();
    for t in 0..50 {
        let at = |task: &str, metric: &str, value| sample(RUN_START_S + t, task, metric, value);
        let taken = match t {
            0..=9 => 1400.0,
            10..=19 => 2000.0,
            20..=29 => 4000.0,
            _ => 2800.0,
        };
        let mut samples = vec![
            at("source.0", metric::RECORDS_IN, taken),
            at("source.0", metric::SOURCE_LAG_MEAN_MS, if (10..30).contains(&t) { 900.0 } else { 5.0 }),
            at("sink.0", metric::LATENCY_P50_MS, if (10..30).contains(&t) { 900.0 } else { 10.0 }),
            at("sink.0", metric::LATENCY_P99_MS, if (10..32).contains(&t) { 1900.0 } else { 20.0 }),
        ];
        let tasks = if t <= 20 { 2 } else { 4 };
        for i in 0..tasks {
            samples.push(at(&format!("aggregate.{i}"), metric::RECORDS_IN, taken / f64::from(tasks)));
        }
        store.insert_samples(run, &samples).unwrap();
    }
    let start_ms = (RUN_START_S + 20) * 1000 + 100;
    store
        .reconfiguration_started(
            run,
            &ReconfigurationStart {
                epoch: 1,
                operator: "aggregate".into(),
                kind: "scale_out".into(),
                protocol: "koala".into(),
                started_ms: start_ms,
                buckets_moved: 64,
                detail: "scale-out of aggregate from 2 to 4 tasks".into(),
            },
        )
        .unwrap();
    let done = ReconfigurationCompletion {
        epoch: 1,
        operator: "aggregate".into(),
        completed_ms: start_ms + 500,
        bytes_moved: 0,
        pause_ms: None,
    };
    store.reconfiguration_completed(run, &done).unwrap();
    drop(store);
    let summary = report(&db, Some(run), &dir.path().join("out")).unwrap();
    let text = summary.to_string();
    let r = &summary.reconfigurations[0];
    // 800 records/s behind for 10 s; 4 × 1 000 − 2 800 = 1 200 records/s spare after.
    let limit = r.drain_limit.expect("drain limit");
    assert_eq!((limit.backlog, limit.capacity, limit.offered), (8_000.0, 4_000.0, 2_800.0));
    assert_eq!((r.recovery_s, r.recovery_p50_s), (Some(12), Some(10)));
    assert!(
        text.contains(
            "recovery 12 s (e2e p99; median 10 s, source lag 10 s); \
             drain limit 7 s (backlog 8 000 records ÷ 1 200 records/s spare)"
        ),
        "{text}"
    );
    assert!(text.contains("peak end-to-end latency: p99 1900.0 ms (median 900.0 ms)"), "{text}");
}
