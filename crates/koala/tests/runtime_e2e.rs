//! End-to-end: each registered query runs on 2 worker processes over loopback TCP, and the sink
//! output equals an expected output computed independently by a plain loop over the same input
//! (`common::expected`, shared with the random-schedule oracle).

mod common;

use std::collections::BTreeMap;

use common::expected::{keyed_totals, last_n_lists, self_join_pairs, window_join_pairs, window_totals};
use common::*;
use koala_workloads::{JoinPair, KeyedJoinPair, KeyedTotal, LastN, WindowTotal};

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
    let expected = keyed_totals(&input(&generator, SOURCES));
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
    let expected = last_n_lists(&input(&generator, SOURCES), 4);
    assert_same("last-n", &actual, &expected);
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
    let expected = window_join_pairs(&left, &right, 250);
    assert_same("window-join", &actual, &expected);
}

/// One source on both inputs of the join: every source task has two channels to every join task.
#[test]
fn self_join() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut generator = generator(8_000, 16);
    generator.key_space = 2_000;
    generator.hot_keys = 0;
    generator.hot_key_ratio = 0.0;
    let cfg =
        config(dir.path(), "self-join", &[("source", SOURCES), ("join", 3), ("sink", 2)], &generator, "");
    let out = run_job(dir.path(), &cfg);
    let mut actual = per_key(sink_output::<KeyedJoinPair>(&out, "sink"), |r| r.key);
    for v in actual.values_mut() {
        v.sort_by_key(|p| (p.left_seq, p.right_seq));
    }
    assert_same("self-join", &actual, &self_join_pairs(&input(&generator, SOURCES)));
}
