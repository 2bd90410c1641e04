//! Every real-world query against a plain single-threaded computation of what it means over the
//! same generated records: the query runs on the local executor (one task per operator), the
//! reference is a loop with a map per key. Rows are compared as sorted multisets; every row
//! carries its key's running count, so a lost, duplicated or reordered record changes a row.

use std::collections::{BTreeMap, VecDeque};

use koala_dataflow::local::{LocalOptions, run_with};
use serde::de::DeserializeOwned;

use super::*;

fn params(events: u64) -> RealWorldParams {
    RealWorldParams {
        generator: RealWorldConfig {
            events: Some(events),
            keys: Some(500),
            active_keys: Some(60),
            viewers: 300,
            ..Default::default()
        },
        recent: Some(7),
        loyal_watch_ms: 10 * 60_000,
        state_padding_bytes: 8,
        ..Default::default()
    }
}

fn check<T: DeserializeOwned + Ord + std::fmt::Debug>(name: &str, p: &RealWorldParams, mut expected: Vec<T>) {
    expected.sort();
    let graph = build(name, p).expect("registered").expect("builds");
    let out = run_with(&graph, &LocalOptions { batch_size: 16, ..Default::default() }).expect("runs");
    let mut got: Vec<T> = out["sink"]
        .iter()
        .map(|v| serde_json::from_value(v.clone()).expect("row of the output type"))
        .collect();
    got.sort();
    assert_eq!(got.len(), expected.len(), "{name}: row count");
    let wrong: Vec<(&T, &T)> = got.iter().zip(&expected).filter(|(g, e)| g != e).take(3).collect();
    assert!(wrong.is_empty(), "{name}: rows differ (got, expected): {wrong:?}");
}

fn lower_median(values: impl Iterator<Item = u32>) -> u32 {
    let mut v: Vec<u32> = values.collect();
    v.sort_unstable();
    if v.is_empty() { 0 } else { v[(v.len() - 1) / 2] }
}

#[test]
fn twitch_matches_a_plain_loop() {
    let p = params(6_000);
    let mut viewers: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    let mut streamers: BTreeMap<u64, (u64, u64, u64, u64)> = BTreeMap::new();
    let mut expected = Vec::new();
    for e in events_of::<Twitch>(&p.generator, 0, 1) {
        let watched = viewers.entry((e.streamer, e.viewer)).or_default();
        let loyal_now = *watched < p.loyal_watch_ms && *watched + e.watch_ms >= p.loyal_watch_ms;
        *watched += e.watch_ms;
        let s = streamers.entry(e.streamer).or_default();
        let interactions = u64::from(e.chats) + u64::from(e.follow);
        *s = (s.0 + 1, s.1 + e.watch_ms, s.2 + interactions, s.3 + u64::from(loyal_now));
        expected.push(Loyalty {
            key: e.streamer,
            count: s.0,
            viewer: e.viewer,
            watch_ms: e.watch_ms,
            total_watch_ms: s.1,
            interactions: s.2,
            loyal_viewers: s.3,
            score: s.1 / 60_000 + 10 * s.2 + 100 * s.3,
        });
    }
    assert!(streamers.values().map(|s| s.3).sum::<u64>() >= 20, "viewers became loyal");
    check("twitch", &p, expected);
}

fn taxi_expected(p: &RealWorldParams, by_pickup: bool) -> Vec<RouteMedian> {
    let mut keys: BTreeMap<u64, (u64, VecDeque<(u64, u32)>)> = BTreeMap::new();
    let mut expected = Vec::new();
    for t in events_of::<Taxi>(&p.generator, 0, 1) {
        let key = if by_pickup { t.pickup } else { t.route() };
        let (count, recent) = keys.entry(key).or_default();
        *count += 1;
        recent.push_back((t.route(), t.duration_s));
        if recent.len() > 7 {
            recent.pop_front();
        }
        let median_s = lower_median(recent.iter().filter(|(r, _)| *r == t.route()).map(|(_, d)| *d));
        expected.push(RouteMedian { key, route: t.route(), count: *count, median_s });
    }
    expected
}

#[test]
fn taxi_matches_a_plain_loop_by_route_and_by_pickup_area() {
    let mut p = params(6_000);
    p.generator.keys = None; // the 263 zones
    check("taxi", &p, taxi_expected(&p, false));
    p.taxi_partition = TaxiPartition::PickupArea;
    let expected = taxi_expected(&p, true);
    assert!(expected.iter().any(|r| r.count > 50), "pickup areas are hot");
    check("taxi", &p, expected);
}

#[test]
fn azure_matches_a_plain_loop() {
    let p = params(6_000);
    let mut vms: BTreeMap<u64, (u64, VecDeque<AzureReading>)> = BTreeMap::new();
    let mut expected = Vec::new();
    for r in events_of::<Azure>(&p.generator, 0, 1) {
        let (count, recent) = vms.entry(r.vm).or_default();
        *count += 1;
        recent.push_back(r.clone());
        if recent.len() > 7 {
            recent.pop_front();
        }
        expected.push(VmCpu {
            key: r.vm,
            count: *count,
            min: recent.iter().map(|r| r.min_cpu).min().unwrap_or(0),
            max: recent.iter().map(|r| r.max_cpu).max().unwrap_or(0),
            median: lower_median(recent.iter().map(|r| r.avg_cpu)),
        });
    }
    assert!(vms.values().any(|(n, _)| *n > 7), "some VM's list wrapped");
    check("azure", &p, expected);
}

#[test]
fn borg_matches_a_plain_loop() {
    let p = params(6_000);
    let mut tasks: BTreeMap<u64, (u64, VecDeque<BorgUsage>)> = BTreeMap::new();
    let mut expected = Vec::new();
    for u in events_of::<Borg>(&p.generator, 0, 1) {
        let (count, recent) = tasks.entry(u.task).or_default();
        *count += 1;
        recent.push_back(u.clone());
        if recent.len() > 7 {
            recent.pop_front();
        }
        expected.push(TaskUsage {
            key: u.task,
            count: *count,
            cpu: lower_median(recent.iter().map(|u| u.cpu)),
            ram: lower_median(recent.iter().map(|u| u.ram)),
            disk: lower_median(recent.iter().map(|u| u.disk)),
        });
    }
    check("borg", &p, expected);
}

#[test]
fn a_csv_replay_runs_the_query_like_the_generator() {
    // The same records written as CSV and replayed: the same output as the generator's.
    let p = params(2_000);
    let dir = std::env::temp_dir().join(format!("koala-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("azure-0.csv");
    let mut text = String::from("time_ms,vm,min_cpu,max_cpu,avg_cpu\n");
    for r in events_of::<Azure>(&p.generator, 0, 1) {
        let pct = |v: u32| format!("{}.{:02}", v / 100, v % 100);
        text += &format!("{},{},{},{},{}\n", r.time, r.vm, pct(r.min_cpu), pct(r.max_cpu), pct(r.avg_cpu));
    }
    std::fs::write(&path, text).expect("write");
    let replay = RealWorldParams {
        input: Input::Csv,
        csv: CsvParams { paths: vec![path.display().to_string()], header: true },
        ..p.clone()
    };
    let rows = |p: &RealWorldParams| {
        let graph = build("azure", p).expect("registered").expect("builds");
        let out = run_with(&graph, &LocalOptions::default()).expect("runs");
        let mut rows: Vec<VmCpu> =
            out["sink"].iter().map(|v| serde_json::from_value(v.clone()).expect("row")).collect();
        rows.sort();
        rows
    };
    let generated = rows(&p);
    assert_eq!(generated.len(), 2_000);
    assert_eq!(rows(&replay), generated);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_sample_trace_in_the_repository_replays() {
    // examples/traces/azure-sample.csv: 40 readings of 5 VMs, hashed and quoted ids among them.
    // The crate's directory as the test runner gives it when the test runs, not as it was when
    // the binary was built: a shared build cache reuses a binary built from another checkout.
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let path = std::path::Path::new(&crate_dir).join("../../examples/traces/azure-sample.csv");
    let text = std::fs::read_to_string(&path).expect("the sample trace");
    let p = RealWorldParams {
        input: Input::Csv,
        csv: CsvParams { paths: vec![path.display().to_string()], header: true },
        recent: Some(4),
        ..Default::default()
    };
    type Readings = VecDeque<(u32, u32, u32)>;
    let mut vms: BTreeMap<String, (u64, Readings)> = BTreeMap::new();
    let mut expected = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let cpu = |i: usize| (f[i].parse::<f64>().expect("number") * 100.0).round() as u32;
        let (count, recent) = vms.entry(f[1].trim_matches('"').to_string()).or_default();
        *count += 1;
        recent.push_back((cpu(2), cpu(3), cpu(4)));
        if recent.len() > 4 {
            recent.pop_front();
        }
        expected.push((
            *count,
            recent.iter().map(|r| r.0).min().unwrap_or(0),
            recent.iter().map(|r| r.1).max().unwrap_or(0),
            lower_median(recent.iter().map(|r| r.2)),
        ));
    }
    assert_eq!((expected.len(), vms.len()), (40, 5));
    let graph = build("azure", &p).expect("registered").expect("builds");
    let out = run_with(&graph, &LocalOptions::default()).expect("runs");
    let rows: Vec<VmCpu> =
        out["sink"].iter().map(|v| serde_json::from_value(v.clone()).expect("row")).collect();
    let keys: std::collections::BTreeSet<u64> = rows.iter().map(|r| r.key).collect();
    assert_eq!(keys.len(), 5, "one key per VM id, text ids hashed");
    let got: Vec<(u64, u32, u32, u32)> = rows.iter().map(|r| (r.count, r.min, r.max, r.median)).collect();
    assert_eq!(got, expected);
}
