//! Expected outputs of the registered queries, computed independently of the runtime by plain
//! single-threaded loops over the generated input (`super::input`). One copy, used by the
//! end-to-end tests (`runtime_e2e.rs`) and the random-schedule oracle (`oracle_random.rs`).

use std::collections::{BTreeMap, BTreeSet};

use koala_dataflow::{KeyedEvent, KeyedEventsConfig};
use koala_workloads::{GroupCount, JoinPair, KeyedJoinPair, KeyedTotal, LastN, WindowTotal};
use serde::Serialize;
use serde_json::Value;

use super::input;

/// Groups of `two-stage-aggregate`'s rollup (`key % 16`; `koala_workloads` keeps its constant
/// private).
pub const ROLLUP_GROUPS: u64 = 16;

/// Input events with their event times, as the generator produces them.
pub type Events = [(KeyedEvent, u64)];

/// `keyed-aggregate`: the running count and sum of a key after each of its events, in per-key
/// order.
pub fn keyed_totals(events: &Events) -> BTreeMap<u64, Vec<KeyedTotal>> {
    let mut expected: BTreeMap<u64, Vec<KeyedTotal>> = BTreeMap::new();
    let mut totals: BTreeMap<u64, (u64, i64)> = BTreeMap::new();
    for (e, _) in events {
        let t = totals.entry(e.key).or_default();
        t.0 += 1;
        t.1 = t.1.wrapping_add(e.value);
        expected.entry(e.key).or_default().push(KeyedTotal { key: e.key, count: t.0, sum: t.1 });
    }
    expected
}

/// `last-n`: the newest `n` values of a key after each of its events, in per-key order.
pub fn last_n_lists(events: &Events, n: usize) -> BTreeMap<u64, Vec<LastN>> {
    let mut expected: BTreeMap<u64, Vec<LastN>> = BTreeMap::new();
    let mut lists: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for (e, _) in events {
        let l = lists.entry(e.key).or_default();
        l.push(e.value);
        if l.len() > n {
            l.remove(0);
        }
        expected.entry(e.key).or_default().push(LastN { key: e.key, values: l.clone() });
    }
    expected
}

/// Window totals per key (tumbling when `slide == size`), sorted by window start.
pub fn window_totals(events: &Events, size: u64, slide: u64) -> BTreeMap<u64, Vec<WindowTotal>> {
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
            a.1 = a.1.wrapping_add(e.value);
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

/// `window-join`: every (left, right) pair of a key in the same tumbling window, sorted by
/// (start, left_seq, right_seq).
pub fn window_join_pairs(left: &Events, right: &Events, size: u64) -> BTreeMap<u64, Vec<JoinPair>> {
    let mut by_window: BTreeMap<(u64, u64), (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    for (e, t) in left {
        by_window.entry((e.key, t - t % size)).or_default().0.push(e.seq);
    }
    for (e, t) in right {
        by_window.entry((e.key, t - t % size)).or_default().1.push(e.seq);
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
    expected
}

/// `keyed-join`: every (left, right) pair of a key over the whole input, sorted by
/// (left_seq, right_seq).
pub fn keyed_join_pairs(left: &Events, right: &Events) -> BTreeMap<u64, Vec<KeyedJoinPair>> {
    let mut sides: BTreeMap<u64, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    for (e, _) in left {
        sides.entry(e.key).or_default().0.push(e.seq);
    }
    for (e, _) in right {
        sides.entry(e.key).or_default().1.push(e.seq);
    }
    let mut expected: BTreeMap<u64, Vec<KeyedJoinPair>> = BTreeMap::new();
    for (key, (ls, rs)) in sides {
        for l in &ls {
            for r in &rs {
                expected.entry(key).or_default().push(KeyedJoinPair { key, left_seq: *l, right_seq: *r });
            }
        }
    }
    for v in expected.values_mut() {
        v.sort_by_key(|p| (p.left_seq, p.right_seq));
    }
    expected
}

/// `self-join`: every ordered pair of records of a key over the whole input, a record with itself
/// included (each record is joined with the earlier records of its key on the other input, so
/// every pair is emitted once whatever the interleaving), sorted by (left_seq, right_seq).
pub fn self_join_pairs(events: &Events) -> BTreeMap<u64, Vec<KeyedJoinPair>> {
    keyed_join_pairs(events, events)
}

/// `two-stage-aggregate`: the rollup's running count per group (key mod 16) — one row per input
/// record, counts 1..=n per group whatever the order.
pub fn group_counts(events: &Events) -> BTreeMap<u64, Vec<GroupCount>> {
    let mut n: BTreeMap<u64, u64> = BTreeMap::new();
    for (e, _) in events {
        *n.entry(e.key % ROLLUP_GROUPS).or_default() += 1;
    }
    n.into_iter().map(|(g, n)| (g, (1..=n).map(|count| GroupCount { key: g, count }).collect())).collect()
}

/// `filtered-window`'s "sample" operator: events whose value is not a multiple of 3.
pub fn sampled(events: &Events) -> Vec<(KeyedEvent, u64)> {
    events.iter().filter(|(e, _)| e.value % 3 != 0).cloned().collect()
}

/// Query parameters the expected output depends on.
#[derive(Clone, Copy, Debug)]
pub struct QueryShape {
    /// Window size (window queries).
    pub window_ms: u64,
    /// Window slide (sliding-window).
    pub slide_ms: u64,
    /// Values kept per key (last-n).
    pub last_n: usize,
}

fn json_rows<T: Serialize>(map: BTreeMap<u64, Vec<T>>) -> BTreeMap<String, Vec<String>> {
    map.into_iter()
        .map(|(k, rows)| {
            let mut rows: Vec<String> = rows
                .iter()
                .map(|r| serde_json::to_value(r).expect("serialize expected row").to_string())
                .collect();
            rows.sort();
            (Value::from(k).to_string(), rows)
        })
        .collect()
}

/// The expected sink output of `query` as JSON rows per key (the key as JSON text), each key's
/// rows sorted: the form the oracle compares multisets in. `sources` is the source parallelism
/// (keys depend on it); joins of two streams read a second source with `seed + 1`.
pub fn expected_rows(
    query: &str,
    generator: &KeyedEventsConfig,
    sources: u32,
    shape: QueryShape,
) -> BTreeMap<String, Vec<String>> {
    let events = input(generator, sources);
    let right = || {
        let mut g = generator.clone();
        g.seed = g.seed.wrapping_add(1);
        input(&g, sources)
    };
    match query {
        "keyed-aggregate" => json_rows(keyed_totals(&events)),
        "last-n" => json_rows(last_n_lists(&events, shape.last_n)),
        "tumbling-window" => json_rows(window_totals(&events, shape.window_ms, shape.window_ms)),
        "sliding-window" => json_rows(window_totals(&events, shape.window_ms, shape.slide_ms)),
        "filtered-window" => json_rows(window_totals(&sampled(&events), shape.window_ms, shape.window_ms)),
        "window-join" => json_rows(window_join_pairs(&events, &right(), shape.window_ms)),
        "keyed-join" => json_rows(keyed_join_pairs(&events, &right())),
        "self-join" => json_rows(self_join_pairs(&events)),
        "two-stage-aggregate" => json_rows(group_counts(&events)),
        other => panic!("no expected output for query {other:?}"),
    }
}

/// The keys a stateful operator of `query` holds state for: the input keys (both sources of a
/// join of two streams), or the groups for the rollup of `two-stage-aggregate`.
pub fn operator_keys(
    query: &str,
    operator: &str,
    generator: &KeyedEventsConfig,
    sources: u32,
) -> BTreeSet<u64> {
    let mut keys: BTreeSet<u64> = input(generator, sources).iter().map(|(e, _)| e.key).collect();
    if two_sources(query) {
        let mut g = generator.clone();
        g.seed = g.seed.wrapping_add(1);
        keys.extend(input(&g, sources).iter().map(|(e, _)| e.key));
    }
    if operator == "rollup" {
        keys = keys.iter().map(|k| k % ROLLUP_GROUPS).collect();
    }
    keys
}

/// Whether `query` joins two sources (the second with `seed + 1`); a self-join reads one.
fn two_sources(query: &str) -> bool {
    matches!(query, "window-join" | "keyed-join")
}
