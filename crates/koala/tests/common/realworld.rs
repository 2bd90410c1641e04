//! The output-equivalence oracle (docs/testing.md §1) for the real-world queries (Twitch, Taxi,
//! Azure, Borg): a run with a reconfiguration of the query's target operator must write the
//! same sink output as a run deployed with the final configuration from the start, under every
//! protocol; both runs must prove they used their parameters ([`super::verify`]). One source
//! task keeps each key's records in order, so the per-key lists ("recent" readings) and running
//! counts are deterministic; Twitch's "loyalty" is fed by two "engagement" tasks whose
//! interleaving no run controls, so it is compared on what no interleaving changes.

use std::collections::{BTreeMap, BTreeSet};

use koala_workloads::realworld::{Azure, Borg, RealWorldConfig, Taxi, Twitch, events_of};
use serde_json::Value;

use super::oracle::{compare_rows, remote_state, rows_per_key};
use super::run_job_logged;
use super::verify::{KeyBytes, key_bytes};

/// One query of the matrix.
struct Query {
    name: &'static str,
    source: &'static str,
    target: &'static str,
    /// Operators between source and sink other than the target, with their tasks.
    others: &'static [(&'static str, u32)],
    params: &'static str,
    /// Per key, equal row multisets; else Twitch's running comparison.
    rows: bool,
}

const QUERIES: &[Query] = &[
    Query {
        name: "twitch",
        source: "events",
        target: "loyalty",
        others: &[("engagement", 2)],
        params: "loyal_watch_ms = 600000\nstate_padding_bytes = 64\n",
        rows: false,
    },
    Query {
        name: "taxi",
        source: "trips",
        target: "median_trip",
        others: &[],
        params: "taxi_partition = \"pickup_area\"\nrecent = 20\nstate_padding_bytes = 64\n",
        rows: true,
    },
    Query {
        name: "azure",
        source: "readings",
        target: "cpu_stats",
        others: &[],
        params: "recent = 8\nstate_padding_bytes = 64\n",
        rows: true,
    },
    Query {
        name: "borg",
        source: "usage",
        target: "task_stats",
        others: &[],
        params: "recent = 5\nstate_padding_bytes = 256\n",
        rows: true,
    },
];

/// Records per run and per second: ~0.75 s of input, the reconfiguration at 0.3 s; the
/// rebalance-then-scale-in runs 1 s of input ([`events_of_scenario`]).
const EVENTS: u64 = 6_000;
const RATE: u64 = 8_000;

/// Records of a run of `scenario`: the rebalance-then-scale-in runs 8 000 (1 s), so that its
/// second reconfiguration, at 0.5 s, starts ≥ 300 ms before the input ends and the run checks
/// must see it move state.
fn events_of_scenario(scenario: &str) -> u64 {
    if scenario == "rebalance-in" { 8_000 } else { EVENTS }
}

/// The generator of every case: 16 fixed hot keys take a quarter of the records (so every
/// moved bucket set holds keys accessed again), the rest slide through 2 000 keys.
fn generator(query: &str, events: u64) -> RealWorldConfig {
    RealWorldConfig {
        events: Some(events),
        seed: 11,
        keys: (query != "taxi").then_some(if query == "twitch" { 200 } else { 2_000 }),
        active_keys: Some(if query == "taxi" { 40 } else { 100 }),
        active_shift_events: 10,
        hot_ratio: 0.25,
        hot_keys: 16,
        viewers: 40,
        ..Default::default()
    }
}

/// The keys `op` holds state for, encoded as `key_by` encodes them (Twitch's "engagement" is
/// keyed by (streamer, viewer) pairs).
fn operator_keys(query: &str, op: &str, events: u64) -> BTreeSet<KeyBytes> {
    let g = generator(query, events);
    match (query, op) {
        ("twitch", "loyalty") => key_bytes(events_of::<Twitch>(&g, 0, 1).iter().map(|e| e.streamer)),
        ("twitch", "engagement") => {
            key_bytes(events_of::<Twitch>(&g, 0, 1).iter().map(|e| (e.streamer, e.viewer)))
        }
        ("taxi", "median_trip") => key_bytes(events_of::<Taxi>(&g, 0, 1).iter().map(|t| t.pickup)),
        ("azure", "cpu_stats") => key_bytes(events_of::<Azure>(&g, 0, 1).iter().map(|r| r.vm)),
        ("borg", "task_stats") => key_bytes(events_of::<Borg>(&g, 0, 1).iter().map(|u| u.task)),
        _ => BTreeSet::new(),
    }
}

/// `others_tasks`: the other operators' tasks instead of `Query::others`' (Twitch's two-operator
/// scale-out); `(rate, events)`: records per second and records.
fn config(
    dir: &std::path::Path,
    protocol: &str,
    q: &Query,
    target_tasks: u32,
    others_tasks: Option<u32>,
    schedule: &str,
    (rate, events): (u64, u64),
) -> String {
    let policy = if protocol == "drrs" { "partition_policy = \"uniform\"\n" } else { "" };
    let mut text = format!(
        "query = \"{}\"\nworkers = 2\noutput_dir = \"{}\"\nprotocol = \"{protocol}\"\n{}{policy}\n[parallelism]\n{} = 1\n{} = {target_tasks}\n",
        q.name,
        dir.join("out").display(),
        remote_state(protocol),
        q.source,
        q.target,
    );
    for (op, n) in q.others {
        text.push_str(&format!("{op} = {}\n", others_tasks.unwrap_or(*n)));
    }
    let g = generator(q.name, events);
    let keys = g.keys.map(|k| format!("keys = {k}\n")).unwrap_or_default();
    text.push_str(&format!(
        "sink = 1\n\n{schedule}\n[params]\nsink = \"jsonl\"\n{}\n[params.generator]\nevents = {events}\nseed = {}\n{keys}active_keys = {}\nactive_shift_events = {}\nhot_ratio = {}\nhot_keys = {}\nviewers = {}\n\n[params.source]\nrate = [{{ at_ms = 0, records_per_sec = {rate}.0 }}]\nmax_disorder_ms = 0\nwatermark_interval_ms = 20\n",
        q.params,
        g.seed,
        g.active_keys.unwrap_or(1),
        g.active_shift_events,
        g.hot_ratio,
        g.hot_keys,
        g.viewers,
    ));
    text
}

/// Runs `query` under `protocol` with `scenario` (scale-out 2 → 4, scale-in 4 → 2, a rebalance
/// of 40 buckets, Twitch's two operators scaled out together, or `rebalance-in`: 4 tasks
/// rebalanced at 0.25 s — buckets 0–31 to task 3, 100–107 to task 0 — then scaled in 4 → 2 at
/// 0.5 s) and against the final deployment, and compares their outputs.
pub fn scenario(protocol: &str, query: &str, scenario: &str) {
    let q = QUERIES.iter().find(|q| q.name == query).unwrap_or_else(|| panic!("no query {query}"));
    let op = q.target;
    let events = events_of_scenario(scenario);
    // Twitch's both operators at once (the paper's Figure 21): "engagement" 2 → 4 too.
    let others = (scenario == "scale-out-both").then_some((2, 4));
    let (start, end, schedule) = match scenario {
        "scale-out-both" => (
            2,
            4,
            format!(
                "[[reconfigurations]]\nat_s = 0.3\noperator = \"{op}\"\nparallelism = 4\n\n[[reconfigurations]]\nat_s = 0.3\noperator = \"engagement\"\nparallelism = 4\n"
            ),
        ),
        "rebalance-in" => {
            let (_, _, rebalance) = super::scenario_schedule("rebalance", op, 0.25);
            let rebalance = rebalance.replace("to = 1 }", "to = 3 }");
            (
                4,
                2,
                format!(
                    "{rebalance}\n[[reconfigurations]]\nat_s = 0.5\noperator = \"{op}\"\nparallelism = 2\n"
                ),
            )
        }
        other => super::scenario_schedule(other, op, 0.3),
    };
    // Every stateful operator's keys, Twitch's (streamer, viewer) pairs too: the run checks place
    // them in buckets, so its "engagement" moves are checked as the target's are.
    let keys: BTreeMap<&str, BTreeSet<KeyBytes>> = std::iter::once(op)
        .chain(q.others.iter().map(|(o, _)| *o))
        .map(|o| (o, operator_keys(query, o, events)))
        .collect();
    let keys_of = |o: &str| keys.get(o).cloned().unwrap_or_default();
    let min_state_keys = |_: &str| 20;
    // The hot keys are accessed throughout, and 16 of them land in any moved bucket set here
    // (Twitch's hot streamers have viewers in every moved bucket set of "engagement" too);
    // neither operator's state expires.
    let permanent = |o: &str| keys.contains_key(o);
    let top = format!("protocol = \"{protocol}\"\n");
    let verify = |out: &std::path::Path, text: &str, input_ms: u64| {
        let expect = super::verify::Expect {
            config_text: text,
            protocol,
            extra_keys: super::verify::extra_keys_of(&top),
            input_ms,
            keys: &keys_of,
            min_state_keys: &min_state_keys,
            permanent_state: &permanent,
        };
        super::verify::check_run(out, &expect)
    };

    let run = super::run_scheduled(RATE as u32, |dir, rate| {
        config(dir, protocol, q, start, others.map(|o| o.0), &schedule, (u64::from(rate), events))
    });
    let input_ms = events * 1000 / u64::from(run.rate);
    let (text, out_a, log) = (&run.text, &run.out, &run.log);
    match verify(out_a, text, input_ms) {
        Ok(rec) => {
            println!("{query} ({protocol}, {scenario}): checked {}", rec.checked.join(", "));
            if scenario == "rebalance-in" {
                assert_moved_state(
                    protocol,
                    &rec,
                    text,
                    &keys_of,
                    &format!("{query} ({protocol}, {scenario})"),
                );
            }
        }
        Err(e) => panic!("{query} ({protocol}, {scenario}): {e}\nconfig:\n{text}\nlog:\n{log}"),
    }
    let reference = tempfile::tempdir().expect("tempdir");
    let ref_text =
        config(reference.path(), protocol, q, end, others.map(|o| o.1), "", (u64::from(run.rate), events));
    let (out_b, ref_log) = run_job_logged(reference.path(), &ref_text);
    if let Err(e) = verify(&out_b, &ref_text, input_ms) {
        panic!("{query} ({protocol}) reference run: {e}\nconfig:\n{ref_text}\nlog:\n{ref_log}");
    }
    let (a, b) = (rows_per_key(out_a), rows_per_key(&out_b));
    assert!(
        b.len() >= 20,
        "{query}: the reference run wrote rows for {} keys; the test proves little",
        b.len()
    );
    assert_eq!(b.values().map(Vec::len).sum::<usize>() as u64, events, "{query}: one row per record");
    let result = if q.rows { compare_rows(&b, &a) } else { compare_loyalty(&b, &a) };
    if let Err(e) = result {
        panic!("{query} ({protocol}, {scenario}): {e}\nconfig:\n{text}\nlog:\n{log}");
    }
}

/// That every reconfiguration of a rebalance-then-scale-in run moved buckets holding keys with
/// state (≥ 20 of the operator's keys, the 16 hot ones among those with state from the first
/// records on, counted from the generator with the model's routing), and that the run shows it
/// as its protocol does, whenever in the input the reconfiguration ran (the state never
/// expires): stop-and-restart moved bytes in each epoch, DRRS's senders pushed state; under
/// remote no state goes from task to task (checked by [`super::verify`]) and the new owners read
/// it from the state servers, which the compared outputs judge.
fn assert_moved_state(
    protocol: &str,
    rec: &super::verify::RunRecord,
    text: &str,
    keys_of: &dyn Fn(&str) -> BTreeSet<KeyBytes>,
    case: &str,
) {
    let (model, applied) = super::model::apply_schedule(text)
        .unwrap_or_else(|e| panic!("{case}: the schedule is rejected: {e}"));
    assert_eq!(applied.len(), 2, "{case}: a rebalance and a scale-in");
    for (a, row) in applied.iter().zip(&rec.reconfigurations) {
        let moved: BTreeSet<u16> = a.moved.iter().copied().collect();
        let keys = keys_of(&a.operator)
            .iter()
            .filter(|k| moved.contains(&koala_types::bucket_of(k, model.num_buckets)))
            .count();
        assert!(
            keys >= 20,
            "{case}: epoch {} ({}) moved {} buckets holding {keys} keys; the case proves little",
            row.epoch,
            a.kind,
            moved.len()
        );
        assert!(
            protocol != "stop-and-restart" || row.bytes_moved > 0,
            "{case}: epoch {} ({}) moved {} buckets holding {keys} keys but 0 state bytes",
            row.epoch,
            a.kind,
            moved.len()
        );
    }
    let pushed = rec.total(koala_types::metric::STATE_BYTES_BACKGROUND);
    assert!(
        protocol != "drrs" || pushed > 0.0,
        "{case}: DRRS moved buckets holding keys but pushed no state"
    );
}

/// What no interleaving of a streamer's engagement signals changes: its running counts are
/// exactly 1..=n, its (viewer, watch_ms) signals are equal multisets, and its last row's totals
/// and score are equal.
type Facets = (Vec<u64>, Vec<(u64, u64)>, Option<Vec<u64>>);

fn compare_loyalty(
    expected: &BTreeMap<String, Vec<String>>,
    got: &BTreeMap<String, Vec<String>>,
) -> Result<(), String> {
    let facets = |rows: &[String]| -> Result<Facets, String> {
        let (mut counts, mut signals, mut last) = (Vec::new(), Vec::new(), None::<(u64, Vec<u64>)>);
        for row in rows {
            let v: Value = serde_json::from_str(row).map_err(|e| format!("bad row {row}: {e}"))?;
            let field =
                |f: &str| v.get(f).and_then(Value::as_u64).ok_or_else(|| format!("row {row} has no {f}"));
            let count = field("count")?;
            counts.push(count);
            signals.push((field("viewer")?, field("watch_ms")?));
            if last.as_ref().is_none_or(|(c, _)| count > *c) {
                let totals = ["total_watch_ms", "interactions", "loyal_viewers", "score"].map(field);
                last = Some((count, totals.into_iter().collect::<Result<_, _>>()?));
            }
        }
        counts.sort_unstable();
        signals.sort_unstable();
        Ok((counts, signals, last.map(|(_, t)| t)))
    };
    for (key, exp) in expected {
        let (exp_counts, exp_signals, exp_last) = facets(exp)?;
        let (counts, signals, last) = facets(got.get(key).map(Vec::as_slice).unwrap_or_default())?;
        if counts != (1..=exp_counts.len() as u64).collect::<Vec<_>>() {
            return Err(format!(
                "streamer {key}: running counts {counts:?}, {} rows expected",
                exp_counts.len()
            ));
        }
        if signals != exp_signals || last != exp_last {
            return Err(format!("streamer {key}: signals or final totals differ: {last:?} vs {exp_last:?}"));
        }
    }
    let extra: Vec<&String> = got.keys().filter(|k| !expected.contains_key(*k)).take(5).collect();
    if extra.is_empty() { Ok(()) } else { Err(format!("keys only in the reconfigured run: {extra:?}")) }
}

/// The real-world oracle tests of one protocol: every query × scale-out, scale-in, rebalance.
/// `koala` runs them all in the normal suite; the baselines run the scale-outs there and, per
/// query, one run that rebalances and then scales in (each a separate epoch, both moving keys
/// with state: `assert_moved_state`), and the separate scale-ins and rebalances `#[ignore]`d
/// (the suite's time budget, docs/testing.md §7).
#[macro_export]
macro_rules! realworld_matrix {
    ($protocol:literal, all) => {
        $crate::realworld_matrix!(@scale_out $protocol, allow(unused));
        $crate::realworld_matrix!(@others $protocol, allow(unused));
    };
    ($protocol:literal, scale_out) => {
        $crate::realworld_matrix!(@scale_out $protocol, allow(unused));
        $crate::realworld_matrix!(@tests $protocol; allow(unused);
            twitch_rebalanced_then_scaled_in: "twitch", "rebalance-in";
            taxi_rebalanced_then_scaled_in: "taxi", "rebalance-in";
            azure_rebalanced_then_scaled_in: "azure", "rebalance-in";
            borg_rebalanced_then_scaled_in: "borg", "rebalance-in";
        );
        $crate::realworld_matrix!(@others $protocol, ignore = "time budget: run with --run-ignored only (docs/testing.md §7)");
    };
    (@scale_out $protocol:literal, $attr:meta) => {
        $crate::realworld_matrix!(@tests $protocol; $attr;
            twitch_scale_out: "twitch", "scale-out";
            twitch_scale_out_both_operators: "twitch", "scale-out-both";
            taxi_scale_out: "taxi", "scale-out";
            azure_scale_out: "azure", "scale-out";
            borg_scale_out: "borg", "scale-out";
        );
    };
    (@others $protocol:literal, $attr:meta) => {
        $crate::realworld_matrix!(@tests $protocol; $attr;
            twitch_scale_in: "twitch", "scale-in";
            twitch_rebalance: "twitch", "rebalance";
            taxi_scale_in: "taxi", "scale-in";
            taxi_rebalance: "taxi", "rebalance";
            azure_scale_in: "azure", "scale-in";
            azure_rebalance: "azure", "rebalance";
            borg_scale_in: "borg", "scale-in";
            borg_rebalance: "borg", "rebalance";
        );
    };
    (@tests $protocol:literal; $attr:meta; $($name:ident: $query:literal, $scenario:literal;)*) => {
        $(
            #[test]
            #[$attr]
            fn $name() {
                common::realworld::scenario($protocol, $query, $scenario);
            }
        )*
    };
}
