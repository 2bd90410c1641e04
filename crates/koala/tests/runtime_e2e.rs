//! End-to-end: each registered query runs on 2 worker processes over loopback TCP, and the sink
//! output equals an expected output computed independently by a plain loop over the same input.

mod common;

use std::collections::BTreeMap;

use common::*;
use koala_dataflow::KeyedEvent;
use koala_workloads::{JoinPair, KeyedTotal, LastN, WindowTotal};

const RECORDS: u64 = 20_000;
const SOURCES: u32 = 2;

#[test]
fn keyed_running_aggregate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = generator(RECORDS, 11);
    let cfg = config(
        dir.path(),
        "keyed-aggregate",
        &[("source", SOURCES), ("aggregate", 3), ("sink", 1)],
        &generator,
        "",
    );
    let out = run_job(dir.path(), &cfg);
    let actual = per_key(sink_output::<KeyedTotal>(&out, "sink"), |r| r.key);
    let mut expected: BTreeMap<u64, Vec<KeyedTotal>> = BTreeMap::new();
    let mut totals: BTreeMap<u64, (u64, i64)> = BTreeMap::new();
    for (e, _) in input(&generator, SOURCES) {
        let t = totals.entry(e.key).or_default();
        t.0 += 1;
        t.1 += e.value;
        expected.entry(e.key).or_default().push(KeyedTotal { key: e.key, count: t.0, sum: t.1 });
    }
    assert_same("keyed-aggregate", &actual, &expected);
}

#[test]
fn last_n_list_state_keeps_per_key_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = generator(RECORDS, 12);
    let cfg = config(
        dir.path(),
        "last-n",
        &[("source", SOURCES), ("last_n", 2), ("sink", 1)],
        &generator,
        "last_n = 4\n",
    );
    let out = run_job(dir.path(), &cfg);
    let actual = per_key(sink_output::<LastN>(&out, "sink"), |r| r.key);
    let mut expected: BTreeMap<u64, Vec<LastN>> = BTreeMap::new();
    let mut lists: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for (e, _) in input(&generator, SOURCES) {
        let l = lists.entry(e.key).or_default();
        l.push(e.value);
        if l.len() > 4 {
            l.remove(0);
        }
        expected.entry(e.key).or_default().push(LastN { key: e.key, values: l.clone() });
    }
    assert_same("last-n", &actual, &expected);
}

/// Window totals per key, sorted by window start.
fn window_totals(events: &[(KeyedEvent, u64)], size: u64, slide: u64) -> BTreeMap<u64, Vec<WindowTotal>> {
    let mut acc: BTreeMap<(u64, u64), (u64, i64)> = BTreeMap::new();
    for (e, t) in events {
        let mut k = t / slide;
        loop {
            let start = k * slide;
            if start + size <= *t {
                break;
            }
            let a = acc.entry((e.key, start)).or_default();
            a.0 += 1;
            a.1 += e.value;
            if k == 0 {
                break;
            }
            k -= 1;
        }
    }
    let mut out: BTreeMap<u64, Vec<WindowTotal>> = BTreeMap::new();
    for ((key, start), (count, sum)) in acc {
        out.entry(key).or_default().push(WindowTotal { key, start, end: start + size, count, sum });
    }
    out
}

fn sorted_windows(rows: Vec<WindowTotal>) -> BTreeMap<u64, Vec<WindowTotal>> {
    let mut map = per_key(rows, |r| r.key);
    for v in map.values_mut() {
        v.sort_by_key(|w| w.start);
    }
    map
}

#[test]
fn tumbling_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = generator(RECORDS, 13);
    let cfg = config(
        dir.path(),
        "tumbling-window",
        &[("source", SOURCES), ("window", 3), ("sink", 2)],
        &generator,
        "window_ms = 500\n",
    );
    let out = run_job(dir.path(), &cfg);
    let actual = sorted_windows(sink_output(&out, "sink"));
    assert_same("tumbling-window", &actual, &window_totals(&input(&generator, SOURCES), 500, 500));
}

#[test]
fn sliding_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = generator(RECORDS, 14);
    let cfg = config(
        dir.path(),
        "sliding-window",
        &[("source", SOURCES), ("window", 2), ("sink", 1)],
        &generator,
        "window_ms = 600\nslide_ms = 200\n",
    );
    let out = run_job(dir.path(), &cfg);
    let actual = sorted_windows(sink_output(&out, "sink"));
    assert_same("sliding-window", &actual, &window_totals(&input(&generator, SOURCES), 600, 200));
}

#[test]
fn window_join() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut generator = generator(8_000, 15);
    generator.key_space = 100;
    let cfg = config(
        dir.path(),
        "window-join",
        &[("left", SOURCES), ("right", SOURCES), ("join", 3), ("sink", 2)],
        &generator,
        "window_ms = 250\n",
    );
    let out = run_job(dir.path(), &cfg);
    let mut actual = per_key(sink_output::<JoinPair>(&out, "sink"), |r| r.key);
    for v in actual.values_mut() {
        v.sort_by_key(|p| (p.start, p.left_seq, p.right_seq));
    }
    let left = input(&generator, SOURCES);
    let mut right_gen = generator.clone();
    right_gen.seed += 1;
    let right = input(&right_gen, SOURCES);
    let mut by_window: BTreeMap<(u64, u64), (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    for (e, t) in &left {
        by_window.entry((e.key, t - t % 250)).or_default().0.push(e.seq);
    }
    for (e, t) in &right {
        by_window.entry((e.key, t - t % 250)).or_default().1.push(e.seq);
    }
    let mut expected: BTreeMap<u64, Vec<JoinPair>> = BTreeMap::new();
    for ((key, start), (ls, rs)) in by_window {
        for l in &ls {
            for r in &rs {
                expected.entry(key).or_default().push(JoinPair { key, start, left_seq: *l, right_seq: *r });
            }
        }
    }
    for v in expected.values_mut() {
        v.sort_by_key(|p| (p.start, p.left_seq, p.right_seq));
    }
    assert_same("window-join", &actual, &expected);
}
