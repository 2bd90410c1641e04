//! Each query run through the local reference executor on a small input, checked against an
//! expectation computed independently with plain loops over the generated events.

use std::collections::BTreeMap;

use koala_dataflow::{KeyedEvent, KeyedEvents, KeyedEventsConfig, SourceOptions, local};
use serde::de::DeserializeOwned;

use crate::queries::ROLLUP_GROUPS;
use crate::{
    GroupCount, JoinPair, KeyedJoinPair, KeyedTotal, LastN, QueryError, QueryParams, SinkKind, WindowTotal,
    build_query,
};

fn params() -> QueryParams {
    QueryParams {
        generator: KeyedEventsConfig {
            key_space: 8,
            records: Some(300),
            time_step_ms: Some(5),
            max_disorder_ms: 7,
            seed: 3,
            min_value: -10,
            max_value: 10,
            ..Default::default()
        },
        source: SourceOptions { max_disorder_ms: 7, ..Default::default() },
        window_ms: 50,
        slide_ms: 20,
        last_n: 3,
        ..Default::default()
    }
}

fn events(params: &QueryParams, seed: u64) -> Vec<(KeyedEvent, u64)> {
    let config = KeyedEventsConfig { seed, ..params.generator.clone() };
    KeyedEvents::all_records(&config, 1)
}

fn run<T: DeserializeOwned>(query: &str, params: &QueryParams) -> Result<Vec<T>, QueryError> {
    let outputs = local::run(&build_query(query, params)?)?;
    let values = outputs.get("sink").cloned().unwrap_or_default();
    let parsed: Result<Vec<T>, _> = values.into_iter().map(serde_json::from_value).collect();
    parsed.map_err(|e| QueryError::InvalidParams {
        query: query.to_string(),
        reason: format!("unexpected sink output: {e}"),
    })
}

/// Groups values by key, keeping their order.
fn per_key<T: Clone>(values: &[T], key: impl Fn(&T) -> u64) -> BTreeMap<u64, Vec<T>> {
    let mut out: BTreeMap<u64, Vec<T>> = BTreeMap::new();
    for v in values {
        out.entry(key(v)).or_default().push(v.clone());
    }
    out
}

#[test]
fn keyed_aggregate_matches_running_totals() -> Result<(), QueryError> {
    let p = params();
    let got: Vec<KeyedTotal> = run("keyed-aggregate", &p)?;
    let mut totals: BTreeMap<u64, (u64, i64)> = BTreeMap::new();
    let mut expected = Vec::new();
    for (e, _) in events(&p, p.generator.seed) {
        let t = totals.entry(e.key).or_default();
        t.0 += 1;
        t.1 += e.value;
        expected.push(KeyedTotal { key: e.key, count: t.0, sum: t.1 });
    }
    assert_eq!(got.len(), 300);
    assert_eq!(per_key(&got, |t| t.key), per_key(&expected, |t| t.key));
    Ok(())
}

/// Padding makes the aggregate's state larger (and keeps it so), not the output different.
#[test]
fn padded_aggregate_state_gives_the_same_output() -> Result<(), QueryError> {
    let plain: Vec<KeyedTotal> = run("keyed-aggregate", &params())?;
    let padded: Vec<KeyedTotal> =
        run("keyed-aggregate", &QueryParams { state_padding_bytes: 512, ..params() })?;
    assert_eq!(plain.len(), 300);
    assert_eq!(per_key(&padded, |t| t.key), per_key(&plain, |t| t.key));
    Ok(())
}

#[test]
fn last_n_keeps_the_newest_values() -> Result<(), QueryError> {
    let p = params();
    let got: Vec<LastN> = run("last-n", &p)?;
    let mut lists: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    let mut expected = Vec::new();
    for (e, _) in events(&p, p.generator.seed) {
        let list = lists.entry(e.key).or_default();
        list.push(e.value);
        if list.len() > p.last_n {
            list.remove(0);
        }
        expected.push(LastN { key: e.key, values: list.clone() });
    }
    assert_eq!(per_key(&got, |l| l.key), per_key(&expected, |l| l.key));
    Ok(())
}

/// Count and sum per (key, window start) of windows of `size` starting every `slide`.
fn expected_windows(p: &QueryParams, size: u64, slide: u64) -> Vec<WindowTotal> {
    windows_of(events(p, p.generator.seed), size, slide)
}

/// Count and sum per (key, window start) of `events` in windows of `size` every `slide`.
fn windows_of(events: Vec<(KeyedEvent, u64)>, size: u64, slide: u64) -> Vec<WindowTotal> {
    let mut totals: BTreeMap<(u64, u64), (u64, i64)> = BTreeMap::new();
    for (e, t) in events {
        let mut start = 0;
        while start <= t {
            if start + size > t {
                let w = totals.entry((e.key, start)).or_default();
                w.0 += 1;
                w.1 += e.value;
            }
            start += slide;
        }
    }
    totals
        .into_iter()
        .map(|((key, start), (count, sum))| WindowTotal { key, start, end: start + size, count, sum })
        .collect()
}

#[test]
fn tumbling_window_matches_grouped_totals() -> Result<(), QueryError> {
    let p = params();
    let mut got: Vec<WindowTotal> = run("tumbling-window", &p)?;
    got.sort();
    assert_eq!(got, expected_windows(&p, 50, 50));
    Ok(())
}

/// Padding makes the window state larger, not the output different.
#[test]
fn padded_window_state_gives_the_same_output() -> Result<(), QueryError> {
    let p = QueryParams { window_padding_bytes: 1024, ..params() };
    for (query, slide) in [("tumbling-window", 50), ("sliding-window", 20)] {
        let p = QueryParams { slide_ms: 20, ..p.clone() };
        let mut got: Vec<WindowTotal> = run(query, &p)?;
        got.sort();
        assert_eq!(got, expected_windows(&p, 50, slide), "{query}");
    }
    Ok(())
}

#[test]
fn sliding_window_matches_grouped_totals() -> Result<(), QueryError> {
    let p = params();
    let mut got: Vec<WindowTotal> = run("sliding-window", &p)?;
    got.sort();
    let expected = expected_windows(&p, 50, 20);
    assert!(expected.len() > 100);
    assert_eq!(got, expected);
    Ok(())
}

#[test]
fn window_join_emits_every_pair_in_arrival_order() -> Result<(), QueryError> {
    let p = params();
    let got: Vec<JoinPair> = run("window-join", &p)?;
    let window_of = |t: u64| t - t % p.window_ms;
    let mut expected: BTreeMap<(u64, u64), Vec<JoinPair>> = BTreeMap::new();
    let right = events(&p, p.generator.seed + 1);
    for (l, lt) in events(&p, p.generator.seed) {
        for (r, rt) in &right {
            if l.key == r.key && window_of(lt) == window_of(*rt) {
                expected.entry((l.key, window_of(lt))).or_default().push(JoinPair {
                    key: l.key,
                    start: window_of(lt),
                    left_seq: l.seq,
                    right_seq: r.seq,
                });
            }
        }
    }
    let mut grouped: BTreeMap<(u64, u64), Vec<JoinPair>> = BTreeMap::new();
    for pair in got {
        grouped.entry((pair.key, pair.start)).or_default().push(pair);
    }
    assert!(!expected.is_empty());
    assert_eq!(grouped, expected);
    Ok(())
}

#[test]
fn keyed_join_emits_every_pair_once() -> Result<(), QueryError> {
    let p = params();
    let mut got: Vec<KeyedJoinPair> = run("keyed-join", &p)?;
    got.sort();
    let right = events(&p, p.generator.seed + 1);
    let mut expected = Vec::new();
    for (l, _) in events(&p, p.generator.seed) {
        for (r, _) in &right {
            if l.key == r.key {
                expected.push(KeyedJoinPair { key: l.key, left_seq: l.seq, right_seq: r.seq });
            }
        }
    }
    expected.sort();
    assert_eq!(got, expected);
    Ok(())
}

#[test]
fn self_join_emits_every_ordered_pair_of_a_key_once() -> Result<(), QueryError> {
    let p = params();
    let graph = build_query("self-join", &p)?;
    let join = graph.by_name("join").map(|j| j.inputs.iter().map(|i| i.from).collect::<Vec<_>>());
    let source = graph.by_name("source").map(|s| s.id);
    assert_eq!(join, source.map(|s| vec![s, s]), "both inputs come from the one source");
    let mut got: Vec<KeyedJoinPair> = run("self-join", &p)?;
    got.sort();
    let all = events(&p, p.generator.seed);
    let mut expected = Vec::new();
    for (l, _) in &all {
        for (r, _) in &all {
            if l.key == r.key {
                expected.push(KeyedJoinPair { key: l.key, left_seq: l.seq, right_seq: r.seq });
            }
        }
    }
    expected.sort();
    assert!(expected.len() > all.len());
    assert_eq!(got, expected);
    Ok(())
}

/// Running totals per key, then per group `key % 16` the number of totals so far: a group's
/// counts are 1, 2, … up to the records of its keys.
#[test]
fn two_stage_aggregate_counts_each_groups_totals() -> Result<(), QueryError> {
    let mut p = params();
    p.generator.key_space = 40; // more keys than groups: a group holds 2 or 3 keys
    let got: Vec<GroupCount> = run("two-stage-aggregate", &p)?;
    let mut per_group: BTreeMap<u64, u64> = BTreeMap::new();
    for (e, _) in events(&p, p.generator.seed) {
        *per_group.entry(e.key % ROLLUP_GROUPS).or_default() += 1;
    }
    let expected: BTreeMap<u64, Vec<u64>> =
        per_group.into_iter().map(|(g, n)| (g, (1..=n).collect())).collect();
    let mut counts: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for g in &got {
        counts.entry(g.key).or_default().push(g.count);
    }
    assert_eq!(expected.len(), ROLLUP_GROUPS as usize);
    assert_eq!(counts, expected);
    Ok(())
}

/// The stateless "sample" drops the values divisible by 3 before the tumbling window.
#[test]
fn filtered_window_matches_grouped_totals_of_the_kept_values() -> Result<(), QueryError> {
    let p = params();
    let mut got: Vec<WindowTotal> = run("filtered-window", &p)?;
    got.sort();
    let all = events(&p, p.generator.seed);
    let kept: Vec<(KeyedEvent, u64)> = all.iter().filter(|(e, _)| e.value % 3 != 0).cloned().collect();
    assert!(kept.len() < all.len() && !kept.is_empty());
    assert_eq!(got, windows_of(kept, 50, 50));
    Ok(())
}

#[test]
fn discard_sink_writes_nothing() -> Result<(), QueryError> {
    let p = QueryParams { sink: SinkKind::Discard, ..params() };
    assert!(run::<KeyedTotal>("keyed-aggregate", &p)?.is_empty());
    Ok(())
}

#[test]
fn disorder_beyond_the_watermark_bound_is_rejected() {
    let mut p = params();
    p.source.max_disorder_ms = 1;
    let err = build_query("tumbling-window", &p).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("max_disorder_ms"), "{err}");
}
