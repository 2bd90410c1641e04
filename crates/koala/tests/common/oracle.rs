//! The output-equivalence oracle (docs/testing.md §1): a run with reconfigurations must produce the
//! same sink output as a run deployed with the final configuration from the start. Outputs are
//! compared per key as multisets of rows; order-sensitive operators (running aggregates, last-N
//! lists) carry their processing order in the rows themselves (a count, a list), so a reordered
//! or lost or duplicated record changes the rows and fails the comparison.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::{config_top, run_job_logged, sink_output};

/// One oracle case.
pub struct Case<'a> {
    /// `koala`, `stop-and-restart` or `remote` (which adds `state.backend = "remote"`).
    pub protocol: &'a str,
    /// More top-level config lines (e.g. `extra_keys = 0`).
    pub top: &'a str,
    /// Query name.
    pub query: &'a str,
    /// Tasks per operator at start.
    pub start: &'a [(&'a str, u32)],
    /// Tasks per operator after the last reconfiguration.
    pub end: &'a [(&'a str, u32)],
    /// `[[reconfigurations]]` blocks (TOML).
    pub schedule: &'a str,
    /// Extra `[params]` lines.
    pub params: &'a str,
    /// Records, seed.
    pub records: u64,
    /// Generator seed.
    pub seed: u64,
    /// Reconfigurations that must complete.
    pub expect_reconfigurations: usize,
}

/// Records per second of the oracle runs: slow enough that reconfigurations land mid-stream.
const RATE: u32 = 8_000;

/// The sink output of a run as JSON rows per key (the key as JSON text), each key's rows sorted.
pub fn rows_per_key(dir: &Path) -> BTreeMap<String, Vec<String>> {
    rows_per_key_by(dir, "key")
}

/// Like [`rows_per_key`], the key read from the rows' field `field` (e.g. `auction`).
pub fn rows_per_key_by(dir: &Path, field: &str) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in sink_output::<Value>(dir, "sink") {
        let key = row.get(field).map(Value::to_string).unwrap_or_default();
        map.entry(key).or_default().push(row.to_string());
    }
    for rows in map.values_mut() {
        rows.sort();
    }
    map
}

/// Rows of `expected` not in `got` and rows of `got` not in `expected`, counting duplicates.
fn multiset_diff<'a>(expected: &'a [String], got: &'a [String]) -> (Vec<&'a String>, Vec<&'a String>) {
    let mut left: Vec<&String> = expected.iter().collect();
    let mut extra = Vec::new();
    for row in got {
        match left.iter().position(|r| *r == row) {
            Some(i) => {
                left.swap_remove(i);
            }
            None => extra.push(row),
        }
    }
    left.truncate(3);
    extra.truncate(3);
    (left, extra)
}

/// Keys with state that a moved bucket set must hold before the run must show moved state.
pub fn min_state_keys(operator: &str) -> usize {
    match operator {
        "rollup" => 1,
        "aggregate" | "last_n" => 3,
        _ => 20,
    }
}

/// Whether `operator` of `query` keeps a key's state for the rest of the run once it has some.
pub fn permanent_state(query: &str, operator: &str) -> bool {
    matches!(
        (query, operator),
        ("keyed-aggregate" | "two-stage-aggregate", "aggregate")
            | ("two-stage-aggregate", "rollup")
            | ("last-n", "last_n")
            | ("keyed-join" | "self-join", "join")
    )
}

/// The source parallelism a config's `[parallelism]` gives (`source`, or `left` of joins).
fn source_parallelism(parallelism: &[(&str, u32)]) -> u32 {
    parallelism.iter().find(|(op, _)| *op == "source" || *op == "left").map_or(1, |(_, p)| *p)
}

/// What a run was asked to do, for [`verify_run`].
pub struct RunSpec<'a> {
    /// `koala` or `stop-and-restart`.
    pub protocol: &'a str,
    /// The top-level lines the config got (`extra_keys` is read from them).
    pub top: &'a str,
    /// Query name.
    pub query: &'a str,
    /// The generator of the source(s).
    pub generator: &'a koala_dataflow::KeyedEventsConfig,
    /// Source parallelism.
    pub sources: u32,
    /// Wall-clock milliseconds of the rate-limited input.
    pub input_ms: u64,
}

/// Checks the metrics DB of a run of `text` against what it was asked to do; `Err` names the
/// failed check.
pub fn verify_run(out: &Path, text: &str, spec: &RunSpec<'_>) -> Result<super::verify::RunRecord, String> {
    let keys = |op: &str| {
        super::verify::key_bytes(super::expected::operator_keys(spec.query, op, spec.generator, spec.sources))
    };
    let permanent = |op: &str| permanent_state(spec.query, op);
    let expect = super::verify::Expect {
        config_text: text,
        protocol: spec.protocol,
        extra_keys: super::verify::extra_keys_of(spec.top),
        input_ms: spec.input_ms,
        keys: &keys,
        min_state_keys: &min_state_keys,
        permanent_state: &permanent,
    };
    super::verify::check_run(out, &expect)
}

/// The input of a case: 300 keys with hot keys; an unwindowed join emits every pair of a key, so
/// the input of a self-join or keyed join spreads over 3 000 keys without hot keys (a few records
/// per key).
fn case_generator(case: &Case<'_>) -> koala_dataflow::KeyedEventsConfig {
    let mut generator = super::generator(case.records, case.seed);
    generator.key_space = 300;
    if matches!(case.query, "self-join" | "keyed-join") {
        generator.key_space = 3_000;
        generator.hot_keys = 0;
        generator.hot_key_ratio = 0.0;
    }
    generator
}

/// The top-level config lines of a case: its protocol, then its own lines.
fn top_lines(case: &Case<'_>) -> String {
    format!(
        "protocol = \"{}\"\n{}{}{}",
        case.protocol,
        remote_state(case.protocol),
        drrs_policy(case),
        case.top
    )
}

/// DRRS runs with the uniform partition policy (docs/protocols.md §11); a case that sets a
/// policy itself keeps it.
fn drrs_policy(case: &Case<'_>) -> &'static str {
    if case.protocol == "drrs" && !case.top.contains("partition_policy") {
        "partition_policy = \"uniform\"\n"
    } else {
        ""
    }
}

/// The state backend the `remote` protocol needs, as a top-level dotted key before the case's
/// `top` (which may add e.g. `state.cache_mb = 1`, or open a table).
pub fn remote_state(protocol: &str) -> &'static str {
    if protocol == "remote" { "state.backend = \"remote\"\n" } else { "" }
}

/// Runs both deployments and asserts equal outputs; returns the reconfigured run's stdout. Both
/// runs must have used the case's protocol and `extra_keys`; the reconfigured one must have
/// completed every scheduled reconfiguration, each with effect (see [`super::verify`]).
pub fn check(case: &Case<'_>) -> String {
    let generator = case_generator(case);
    let rate_line = |rate: u32| format!("rate = [{{ at_ms = 0, records_per_sec = {rate}.0 }}]\n");
    let top = top_lines(case);
    let run = super::run_scheduled(RATE, |dir, rate| {
        config_top(dir, case.query, &top, case.start, &generator, case.params)
            + &rate_line(rate)
            + case.schedule
    });
    let (text, out_a, log) = (&run.text, &run.out, &run.log);
    let rate = rate_line(run.rate);
    let input_ms = case.records * 1000 / u64::from(run.rate);
    let completed =
        log.lines().filter(|l| l.contains("] reconfiguration ") && l.contains(" completed in ")).count();
    assert_eq!(
        completed, case.expect_reconfigurations,
        "{} reconfigurations completed, expected {}; log:\n{log}",
        completed, case.expect_reconfigurations
    );
    let spec = RunSpec {
        protocol: case.protocol,
        top: &top,
        query: case.query,
        generator: &generator,
        sources: source_parallelism(case.start),
        input_ms,
    };
    match verify_run(out_a, text, &spec) {
        Ok(rec) => println!("{} ({}): checked {}", case.query, case.protocol, rec.checked.join(", ")),
        Err(e) => panic!("{} ({}): {e}\nconfig:\n{text}\nlog:\n{log}", case.query, case.protocol),
    }

    let reference = tempfile::tempdir().expect("tempdir");
    let ref_text = config_top(reference.path(), case.query, &top, case.end, &generator, case.params) + &rate;
    let (out_b, ref_log) = run_job_logged(reference.path(), &ref_text);
    if let Err(e) = verify_run(&out_b, &ref_text, &spec) {
        panic!("{} ({}) reference run: {e}\nconfig:\n{ref_text}\nlog:\n{ref_log}", case.query, case.protocol);
    }

    let (a, b) = (rows_per_key(out_a), rows_per_key(&out_b));
    assert!(!b.is_empty(), "the reference run wrote nothing; the test proves nothing");
    if let Err(e) = compare_rows(&b, &a) {
        panic!("{} ({}): {e}\nlog:\n{log}", case.query, case.protocol);
    }
    run.log.clone()
}

/// Compares per key as multisets (each key's rows sorted): `Err` names the first key that
/// differs, with up to 3 missing and 3 extra rows, or keys only in `got`.
pub fn compare_rows(
    expected: &BTreeMap<String, Vec<String>>,
    got: &BTreeMap<String, Vec<String>>,
) -> Result<(), String> {
    for (key, exp) in expected {
        let g = got.get(key).map(Vec::as_slice).unwrap_or_default();
        if g != exp.as_slice() {
            let (missing, extra) = multiset_diff(exp, g);
            return Err(format!(
                "key {key}: {} rows under reconfiguration vs {} expected; missing {missing:?}; extra {extra:?}",
                g.len(),
                exp.len()
            ));
        }
    }
    let extra: Vec<&String> = got.keys().filter(|k| !expected.contains_key(*k)).take(5).collect();
    if !extra.is_empty() {
        return Err(format!("keys only in the reconfigured run: {extra:?}"));
    }
    Ok(())
}

/// Query, its stateful operator, its sources, extra params.
const QUERIES: &[(&str, &str, &[&str], &str)] = &[
    ("keyed-aggregate", "aggregate", &["source"], ""),
    ("last-n", "last_n", &["source"], "last_n = 3\n"),
    ("tumbling-window", "window", &["source"], "window_ms = 300\n"),
    ("sliding-window", "window", &["source"], "window_ms = 400\nslide_ms = 100\n"),
    ("window-join", "join", &["left", "right"], "window_ms = 300\n"),
];

fn parallelism<'a>(sources: &[&'a str], op: &'a str, n: u32) -> Vec<(&'a str, u32)> {
    let mut v: Vec<(&str, u32)> = sources.iter().map(|s| (*s, 2)).collect();
    v.push((op, n));
    v.push(("sink", 1));
    v
}

/// One protocol × scenario × query oracle test.
pub fn scenario(protocol: &str, query: &str, scenario: &str) {
    let (q, op, sources, params) =
        QUERIES.iter().find(|(q, ..)| *q == query).copied().unwrap_or_else(|| panic!("no query {query}"));
    let (start, end, schedule) = match scenario {
        "scale-out" => {
            (2, 4, format!("[[reconfigurations]]\nat_s = 0.6\noperator = \"{op}\"\nparallelism = 4\n"))
        }
        "scale-in" => {
            (4, 2, format!("[[reconfigurations]]\nat_s = 0.6\noperator = \"{op}\"\nparallelism = 2\n"))
        }
        "rebalance" => (
            2,
            2,
            format!(
                "[[reconfigurations]]\nat_s = 0.6\noperator = \"{op}\"\nmoves = [{{ buckets = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31], to = 1 }}, {{ buckets = [100, 101, 102, 103, 104, 105, 106, 107], to = 0 }}]\n"
            ),
        ),
        "migrate" => {
            (2, 2, format!("[[reconfigurations]]\nat_s = 0.6\noperator = \"{op}\"\ntask = 0\nworker = 1\n"))
        }
        other => panic!("no scenario {other}"),
    };
    check(&Case {
        protocol,
        top: "",
        query: q,
        start: &parallelism(sources, op, start),
        end: &parallelism(sources, op, end),
        schedule: &schedule,
        params,
        records: 16_000,
        seed: 21,
        expect_reconfigurations: 1,
    });
}

/// The tests of one protocol: 4 scenarios × 5 operator families; the delete-then-return case,
/// a stateless rescale, the all-bucket swap; and one fixed scale-out, rebalance and scale-in of
/// `keyed-join`, `filtered-window` and `two-stage-aggregate` each ([`rescaled_and_rebalanced`]).
#[macro_export]
macro_rules! oracle_matrix {
    ($protocol:literal) => {
        $crate::oracle_matrix!(@tests $protocol;
            scale_out_keyed_aggregate: "keyed-aggregate", "scale-out";
            scale_in_keyed_aggregate: "keyed-aggregate", "scale-in";
            rebalance_keyed_aggregate: "keyed-aggregate", "rebalance";
            migrate_keyed_aggregate: "keyed-aggregate", "migrate";
            scale_out_last_n: "last-n", "scale-out";
            scale_in_last_n: "last-n", "scale-in";
            rebalance_last_n: "last-n", "rebalance";
            migrate_last_n: "last-n", "migrate";
            scale_out_tumbling_window: "tumbling-window", "scale-out";
            scale_in_tumbling_window: "tumbling-window", "scale-in";
            rebalance_tumbling_window: "tumbling-window", "rebalance";
            migrate_tumbling_window: "tumbling-window", "migrate";
            scale_out_sliding_window: "sliding-window", "scale-out";
            scale_in_sliding_window: "sliding-window", "scale-in";
            rebalance_sliding_window: "sliding-window", "rebalance";
            migrate_sliding_window: "sliding-window", "migrate";
            scale_out_window_join: "window-join", "scale-out";
            scale_in_window_join: "window-join", "scale-in";
            rebalance_window_join: "window-join", "rebalance";
            migrate_window_join: "window-join", "migrate";
        );
    };
    (@tests $protocol:literal; $($name:ident: $query:literal, $scenario:literal;)*) => {
        $(
            #[test]
            fn $name() {
                common::oracle::scenario($protocol, $query, $scenario);
            }
        )*

        #[test]
        fn cleared_state_does_not_come_back_when_the_bucket_returns() {
            common::oracle::cleared_state_does_not_come_back($protocol);
        }

        #[test]
        fn stateless_operator_rescaled() {
            common::oracle::stateless_operator_rescaled($protocol);
        }

        #[test]
        fn every_bucket_swapped_between_workers_with_one_message_queues() {
            common::oracle::swap_with_one_message_queues($protocol, "");
        }

        #[test]
        fn keyed_join_scaled_out_rebalanced_scaled_in() {
            common::oracle::rescaled_and_rebalanced($protocol, "", "keyed-join");
        }

        #[test]
        fn filtered_window_scaled_out_rebalanced_scaled_in() {
            common::oracle::rescaled_and_rebalanced($protocol, "", "filtered-window");
        }

        #[test]
        fn two_stage_aggregate_scaled_out_rebalanced_scaled_in() {
            common::oracle::rescaled_and_rebalanced($protocol, "", "two-stage-aggregate");
        }
    };
}

/// Delete-then-return: a key's window state is deleted when its windows fire after its bucket
/// moved away; when the bucket moves back, the old location must not serve a stale copy (one
/// live copy). Short windows make every key's state come and go between the two moves. Checked
/// by mutation: with the sender's delete removed (stop-and-restart) or a fetch served without
/// deleting (Koala), this case fails with resurrected windows.
pub fn cleared_state_does_not_come_back(protocol: &str) {
    check(&Case {
        protocol,
        top: "",
        query: "tumbling-window",
        start: &[("source", 2), ("window", 2), ("sink", 1)],
        end: &[("source", 2), ("window", 2), ("sink", 1)],
        schedule: "[[reconfigurations]]\nat_s = 0.4\noperator = \"window\"\nparallelism = 4\n\
                   [[reconfigurations]]\nat_s = 1.2\noperator = \"window\"\nparallelism = 2\n",
        params: "window_ms = 50\n",
        records: 20_000,
        seed: 9,
        expect_reconfigurations: 2,
    });
}

/// A stateless operator rescaled (3 → 5 tasks, then 5 → 2): no state moves, only routing; the
/// windowed output downstream is unchanged.
pub fn stateless_operator_rescaled(protocol: &str) {
    check(&Case {
        protocol,
        top: "",
        query: "filtered-window",
        start: &[("source", 2), ("sample", 3), ("window", 2), ("sink", 1)],
        end: &[("source", 2), ("sample", 2), ("window", 2), ("sink", 1)],
        schedule: "[[reconfigurations]]\nat_s = 0.4\noperator = \"sample\"\nparallelism = 5\n\
                   [[reconfigurations]]\nat_s = 1.0\noperator = \"sample\"\nparallelism = 2\n",
        params: "window_ms = 300\n",
        records: 16_000,
        seed: 4,
        expect_reconfigurations: 2,
    });
}

/// Two tasks on two workers swap every bucket with one-message queues (`channel_capacity = 1`,
/// so one-message peer lanes too): afterwards each task needs all of its state from the other, so
/// state moves both ways over TCP at once (Koala: fetches and forwarded records; stop-and-restart:
/// two transfers). With a blocking send into a bounded peer lane this could deadlock
/// (docs/architecture.md §4). `runtime` adds `[runtime]` lines (e.g. a queue bound).
pub fn swap_with_one_message_queues(protocol: &str, runtime: &str) {
    let buckets = |r: std::ops::Range<u32>| r.map(|b| b.to_string()).collect::<Vec<_>>().join(", ");
    let schedule = format!(
        "[[reconfigurations]]\nat_s = 0.6\noperator = \"last_n\"\nmoves = [{{ buckets = [{}], to = 1 }}, {{ buckets = [{}], to = 0 }}]\n",
        buckets(0..64),
        buckets(64..128)
    );
    let tasks = [("source", 2), ("last_n", 2), ("sink", 1)];
    let top = format!("partition_policy = \"uniform\"\n[runtime]\nchannel_capacity = 1\n{runtime}");
    check(&Case {
        protocol,
        top: &top,
        query: "last-n",
        start: &tasks,
        end: &tasks,
        schedule: &schedule,
        params: "last_n = 3\n",
        records: 16_000,
        seed: 13,
        expect_reconfigurations: 1,
    });
}

/// A self-join (the source feeds both inputs of "join") scaled out 2 → 4, rebalanced, and scaled
/// in 4 → 2 under `protocol` with the `top` lines: every source task marks both of its channels
/// to a join task at each switch, and cancelled join tasks get an end of stream on both.
pub fn self_join_rescaled_and_rebalanced(protocol: &str, top: &str) {
    rescaled_and_rebalanced(protocol, top, "self-join");
}

/// Start and end tasks, schedule, `[params]` lines, records per source, seed.
type Fixed<'a> = (Vec<(&'a str, u32)>, Vec<(&'a str, u32)>, String, &'a str, u64, u64);

/// One run of `query` under `protocol` with a fixed scale-out, rebalance and scale-in of its
/// stateful operator (each kind checked by epoch in the run's reconfiguration records,
/// [`super::verify`]):
/// - `self-join`, `keyed-join` ("join"), `filtered-window` ("window", behind the stateless
///   "sample"): 2 → 4 at 0.3 s, buckets 0–31 to task 3 and 100–107 to task 0 at 0.7 s, 4 → 2 at
///   1.1 s;
/// - `two-stage-aggregate`: "aggregate" 2 → 4 at 0.3 s, then its downstream "rollup" (16 groups,
///   fed by a stateful operator) rebalanced at 0.7 s and scaled in 4 → 2 at 1.1 s.
pub fn rescaled_and_rebalanced(protocol: &str, top: &str, query: &str) {
    let rebalance = |op: &str| {
        format!(
            "[[reconfigurations]]\nat_s = 0.7\noperator = \"{op}\"\nmoves = [{{ buckets = [{}], to = 3 }}, {{ buckets = [100, 101, 102, 103, 104, 105, 106, 107], to = 0 }}]\n",
            (0..32).map(|b| b.to_string()).collect::<Vec<_>>().join(", ")
        )
    };
    let rescale = |at: f64, op: &str, p: u32| {
        format!("[[reconfigurations]]\nat_s = {at}\noperator = \"{op}\"\nparallelism = {p}\n")
    };
    let out_rebalance_in = |op: &str| rescale(0.3, op, 4) + &rebalance(op) + &rescale(1.1, op, 2);
    let (start, end, schedule, params, records, seed): Fixed<'_> = match query {
        "self-join" => {
            let tasks = vec![("source", 2), ("join", 2), ("sink", 1)];
            (tasks.clone(), tasks, out_rebalance_in("join"), "", 12_000, 31)
        }
        "keyed-join" => {
            let tasks = vec![("left", 2), ("right", 2), ("join", 2), ("sink", 1)];
            (tasks.clone(), tasks, out_rebalance_in("join"), "", 12_000, 32)
        }
        "filtered-window" => {
            let tasks = vec![("source", 2), ("sample", 2), ("window", 2), ("sink", 1)];
            (tasks.clone(), tasks, out_rebalance_in("window"), "window_ms = 300\n", 12_000, 33)
        }
        "two-stage-aggregate" => (
            vec![("source", 2), ("aggregate", 2), ("rollup", 4), ("sink", 1)],
            vec![("source", 2), ("aggregate", 4), ("rollup", 2), ("sink", 1)],
            rescale(0.3, "aggregate", 4) + &rebalance("rollup") + &rescale(1.1, "rollup", 2),
            "",
            12_000,
            34,
        ),
        other => panic!("no fixed out/rebalance/in case for query {other}"),
    };
    check(&Case {
        protocol,
        top,
        query,
        start: &start,
        end: &end,
        schedule: &schedule,
        params,
        records,
        seed,
        expect_reconfigurations: 3,
    });
}
