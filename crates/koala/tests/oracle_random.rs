//! Random-schedule oracle: a seeded generator (splitmix64, below) draws a job and a schedule of
//! 3–6 mixed reconfigurations of the query's stateful operator(s) — rescale to 1..=5 tasks
//! (including to 1, and scale-in followed by scale-out), rebalance of random bucket subsets to a
//! random live task, migration of a random live task to the other worker, several at the same
//! `at_s` (back to back), between 0.2 and 1.5 s — plus random `[runtime] batch_records`
//! (1..=256), `channel_capacity` (1..=64), `linger_ms`, `partition_policy`, source, operator and
//! sink parallelism, and the state backend (fjall behind the default cache, behind a 1 MiB one,
//! without one, or memory; under `remote`, a state server without a client cache or behind a
//! 1 MiB or 64 MiB one). Every stateful query family runs, under Koala with `extra_keys = 0`
//! (fetch on demand only), Koala with `extra_keys = 8`, stop-and-restart, the Remote baseline
//! (`remote`), and DRRS (always with the uniform policy, as the paper's DRRS; random `[drrs]
//! wait_records` 1..=64, and for half the seeds the original DRRS's `schedule = "overlapping"`,
//! for the others the ported one with `subscales` 0..=3). The schedule depends on the seed only, so one
//! seed can be replayed under each protocol.
//!
//! Requests are generated against a model of the coordinator's bookkeeping
//! (`common::model`: live task indices, placement, routing), so every request is one the
//! coordinator accepts; the run must complete all of them. The sink output is compared per key,
//! as multisets, with the expected output computed in-process by plain loops over the generator
//! (`common::expected`), not by a second run. The metrics DB must show the protocol and
//! `extra_keys` asked for, each reconfiguration with the kind and bucket count the model implies,
//! created tasks that processed records, and moved state (`common::verify`). A run that does not
//! end within [`TIMEOUT`] is killed and fails with its log. A failure message starts with
//! `random schedule failed: seed N, <variant>, <query>` and the first error line, then the full
//! config text.
//!
//! The normal suite is 45 schedules (9 per protocol variant, one per query family), plus three
//! late-data cases with `allowed_lateness_ms`. The soak set is `#[ignore]`d, one test per schedule
//! (300 per variant, family `seed % 9`) so nextest's per-test time-out applies to each:
//!
//! ```sh
//! # everything (1200 runs, ~27 min on 2 cores; 30 per variant take ~3 min)
//! cargo nextest run -p koala --cargo-profile ci --test oracle_random --run-ignored only
//! # 30 schedules per variant
//! cargo nextest run -p koala --cargo-profile ci --test oracle_random --run-ignored only \
//!     -E 'test(/^soak_.*::seed_00([0-2][0-9]|30)$/)' --no-fail-fast
//! # one seed under one variant
//! cargo nextest run -p koala --cargo-profile ci --test oracle_random --run-ignored only \
//!     -E 'test(=soak_koala_n0::seed_0042)'
//! ```

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::expected::{QueryShape, expected_rows};
use common::model::{Model, Request, parse_config};
use common::oracle::{RunSpec, compare_rows, rows_per_key, verify_run};
use common::{config_top, run_koala, skipped_after_the_input_ended, strip_ansi};
use koala_dataflow::KeyedEventsConfig;
use koala_protocol::sim::SplitMix64;

/// A run that takes longer than this (a normal one takes a few seconds) counts as hung.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The simulator's splitmix64, with the helpers the schedules need.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed ^ 0x6b6f_616c_615f_7273))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

/// Protocol variants.
#[derive(Clone, Copy, Debug)]
enum Variant {
    /// Koala, fetch on demand only.
    KoalaN0,
    /// Koala, progressive migration with 8 extra keys per fetch.
    KoalaN8,
    /// The stop-and-restart baseline.
    StopAndRestart,
    /// The Remote baseline: stop-and-restart over a state server (`[state] backend = "remote"`).
    Remote,
    /// The DRRS baseline (uniform policy).
    Drrs,
}

impl Variant {
    fn protocol(self) -> &'static str {
        match self {
            Self::KoalaN0 | Self::KoalaN8 => "koala",
            Self::StopAndRestart => "stop-and-restart",
            Self::Remote => "remote",
            Self::Drrs => "drrs",
        }
    }

    /// Top-level config lines (stop-and-restart leaves `extra_keys` at its default).
    fn top(self) -> String {
        match self {
            Self::KoalaN0 => "protocol = \"koala\"\nextra_keys = 0\n".into(),
            Self::KoalaN8 => "protocol = \"koala\"\nextra_keys = 8\n".into(),
            Self::StopAndRestart => "protocol = \"stop-and-restart\"\n".into(),
            // Dotted, so it stands before any table; the client cache is drawn in `generate`.
            Self::Remote => "protocol = \"remote\"\nstate.backend = \"remote\"\n".into(),
            Self::Drrs => "protocol = \"drrs\"\n".into(),
        }
    }
}

/// A query family: its operators, parameters and input.
struct Family {
    query: &'static str,
    /// Source operators (joins have two).
    sources: &'static [&'static str],
    /// Stateful operators the schedule reconfigures.
    stateful: &'static [&'static str],
    /// Other operators between sources and sink (not reconfigured).
    other: &'static [&'static str],
    params: &'static str,
    shape: QueryShape,
    records: u64,
    rate: u64,
    key_space: u64,
    hot_keys: bool,
    max_disorder_ms: u64,
}

const fn shape(window_ms: u64, slide_ms: u64) -> QueryShape {
    QueryShape { window_ms, slide_ms, last_n: 3 }
}

const fn family(
    query: &'static str,
    sources: &'static [&'static str],
    stateful: &'static [&'static str],
    params: &'static str,
    shape: QueryShape,
) -> Family {
    Family {
        query,
        sources,
        stateful,
        other: &[],
        params,
        shape,
        records: 20_000,
        rate: 8_000,
        key_space: 300,
        hot_keys: true,
        max_disorder_ms: 20,
    }
}

const ONE: &[&str] = &["source"];
const TWO: &[&str] = &["left", "right"];

/// Every stateful query family; a soak seed runs family `seed % 9`.
const FAMILIES: [Family; 9] = [
    family("keyed-aggregate", ONE, &["aggregate"], "", shape(300, 300)),
    family("last-n", ONE, &["last_n"], "last_n = 3\n", shape(300, 300)),
    family("tumbling-window", ONE, &["window"], "window_ms = 300\n", shape(300, 300)),
    family("sliding-window", ONE, &["window"], "window_ms = 400\nslide_ms = 100\n", shape(400, 100)),
    family("window-join", TWO, &["join"], "window_ms = 300\n", shape(300, 300)),
    // Unwindowed: every pair of a key over the whole input, so fewer records per key.
    Family {
        records: 12_000,
        rate: 6_000,
        key_space: 3_000,
        hot_keys: false,
        ..family("keyed-join", TWO, &["join"], "", shape(300, 300))
    },
    family("two-stage-aggregate", ONE, &["aggregate", "rollup"], "", shape(300, 300)),
    Family {
        other: &["sample"],
        ..family("filtered-window", ONE, &["window"], "window_ms = 300\n", shape(300, 300))
    },
    // One source on both inputs of the join; every pair of a key, as for keyed-join.
    Family {
        records: 12_000,
        rate: 6_000,
        key_space: 3_000,
        hot_keys: false,
        ..family("self-join", ONE, &["join"], "", shape(300, 300))
    },
];

/// Late data: wide disorder (150 ms of event time) and windows kept 200 ms past their end.
/// `koala run` rejects a generator disorder above the source's bound, so no record is ever behind
/// the watermark of a correct run; a reconfiguration that makes one late (and re-emits or drops a
/// window) changes the output.
const LATE: Family = Family {
    max_disorder_ms: 150,
    ..family(
        "tumbling-window",
        ONE,
        &["window"],
        "window_ms = 300\nallowed_lateness_ms = 200\n",
        shape(300, 300),
    )
};

fn family_named(query: &str) -> &'static Family {
    FAMILIES.iter().find(|f| f.query == query).unwrap_or_else(|| panic!("no family {query}"))
}

/// One generated case.
struct Case {
    text: String,
    top: String,
    generator: KeyedEventsConfig,
    sources: u32,
    steps: usize,
}

/// Draws the job and the schedule of `seed` (independent of the variant) and writes the config.
fn generate(dir: &std::path::Path, variant: Variant, f: &Family, seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let sources = rng.range(1, 3) as u32;
    let mut parallelism: Vec<(&str, u32)> = f.sources.iter().map(|s| (*s, sources)).collect();
    for op in f.other {
        parallelism.push((op, rng.range(1, 3) as u32));
    }
    for op in f.stateful {
        parallelism.push((op, rng.range(1, 4) as u32));
    }
    parallelism.push(("sink", rng.range(1, 2) as u32));
    let policy = rng.pick(&["consistent", "uniform", "interleaved"]);
    // DRRS runs with the uniform policy only (the draw above keeps other seeds' schedules).
    let policy = if matches!(variant, Variant::Drrs) { "uniform" } else { policy };
    let runtime = format!(
        "\n[runtime]\nbatch_records = {}\nchannel_capacity = {}\nlinger_ms = {}\n",
        rng.range(1, 256),
        rng.range(1, 64),
        rng.range(1, 10)
    );
    let generator = KeyedEventsConfig {
        key_space: f.key_space,
        hot_keys: if f.hot_keys { 10 } else { 0 },
        hot_key_ratio: if f.hot_keys { 0.2 } else { 0.0 },
        records: Some(f.records),
        seed,
        time_step_ms: Some(1),
        max_disorder_ms: f.max_disorder_ms,
        ..Default::default()
    };
    // Remote: one state server, without a client cache, behind a 1 MiB one, or a 64 MiB one
    // (from the state backend's own stream, below).
    let cache = match variant {
        Variant::Remote => Rng::new(seed ^ 0x57A7_E000).pick(&[
            "state.cache_mb = 0\n",
            "state.cache_mb = 1\n",
            "state.cache_mb = 64\n",
        ]),
        _ => "",
    };
    let top = format!("{}{cache}partition_policy = \"{policy}\"\n", variant.top());
    let rate = format!("rate = [{{ at_ms = 0, records_per_sec = {}.0 }}]\n", f.rate);
    let base = config_top(dir, f.query, &top, &parallelism, &generator, f.params) + &rate + &runtime;

    let (config, graph) = parse_config(&base);
    let mut model = Model::new(&config, graph);
    let steps = rng.range(3, 6) as usize;
    let mut times: Vec<u64> = (0..steps).map(|_| rng.range(20, 150)).collect();
    times.sort_unstable();
    for i in 1..steps {
        if rng.chance(0.3) {
            times[i] = times[i - 1];
        }
    }
    let mut schedule = String::new();
    let mut last_kind: BTreeMap<&str, &str> = BTreeMap::new();
    for at in times {
        let op = rng.pick(f.stateful);
        let (req, applied) = next_request(&mut rng, &mut model, op, last_kind.get(op).copied());
        last_kind.insert(op, applied);
        schedule.push_str(&format!(
            "\n[[reconfigurations]]\nat_s = {}.{:02}\noperator = \"{op}\"\n{}",
            at / 100,
            at % 100,
            req.toml()
        ));
    }
    // The state backend, from its own stream so the schedules of existing seeds stay as they were:
    // fjall behind the default cache (the task's share of the worker budget), behind a 1 MiB one (evicting on the larger key spaces),
    // without a cache, or memory.
    let state = match variant {
        Variant::Remote => "",
        _ => Rng::new(seed ^ 0x57A7_E000).pick(&[
            "",
            "\n[state]\ncache_mb = 1\n",
            "\n[state]\ncache_mb = 0\n",
            "\n[state]\nbackend = \"memory\"\n",
        ]),
    };
    // DRRS knobs, from their own stream: subscales (0 = one per pair) and the wait buffer; half
    // the schedules run the original DRRS's overlapping schedule (one subscale per pair) instead.
    let drrs = if matches!(variant, Variant::Drrs) {
        let mut r = Rng::new(seed ^ 0xD225_0000);
        let (subscales, wait_records) = (r.range(0, 3), r.range(1, 64));
        if r.chance(0.5) {
            format!("\n[drrs]\nschedule = \"overlapping\"\nwait_records = {wait_records}\n")
        } else {
            format!("\n[drrs]\nsubscales = {subscales}\nwait_records = {wait_records}\n")
        }
    } else {
        String::new()
    };
    Case { text: base + state + &drrs + &schedule, top, generator, sources, steps }
}

/// Draws one request of `op` that the coordinator accepts and applies it to the model.
fn next_request(rng: &mut Rng, model: &mut Model, op: &str, last: Option<&str>) -> (Request, &'static str) {
    for _ in 0..20 {
        let live = model.live(op).to_vec();
        let n = live.len() as u64;
        let req = if last == Some("scale_in") && n < 5 && rng.chance(0.6) {
            Request::Rescale(rng.range(n + 1, 5) as u32)
        } else {
            match rng.range(0, 9) {
                0..=3 => {
                    let p = if n > 1 && rng.chance(0.2) { 1 } else { rng.range(1, 5) };
                    if p == n {
                        continue;
                    }
                    Request::Rescale(p as u32)
                }
                4..=6 => {
                    let nb = u64::from(model.num_buckets);
                    let moves = (0..rng.range(1, 2))
                        .map(|_| {
                            let mut all: Vec<u16> = (0..model.num_buckets).collect();
                            let k = rng.range(1, 40) as usize;
                            for i in 0..k {
                                let j = rng.range(i as u64, nb - 1) as usize;
                                all.swap(i, j);
                            }
                            let mut b = all[..k].to_vec();
                            b.sort_unstable();
                            (b, rng.pick(&live))
                        })
                        .collect();
                    Request::Rebalance(moves)
                }
                _ => {
                    let task = rng.pick(&live);
                    let on = model.worker_of(op, task).expect("live task is placed");
                    Request::Migrate { task, worker: (on + 1) % model.workers() }
                }
            }
        };
        if let Ok(applied) = model.apply(op, &req) {
            return (req, applied.kind);
        }
    }
    panic!("the generator found no acceptable request for {op}");
}

/// Generates, runs and checks one schedule; panics with the seed, variant, config and log.
fn run_case(variant: Variant, f: &Family, seed: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let case = generate(dir.path(), variant, f, seed);
    let fail = |what: String, log: &str| -> ! {
        panic!(
            "random schedule failed: seed {seed}, {variant:?} ({}), {}: {what}\nconfig:\n{}\n{log}",
            variant.protocol(),
            f.query,
            case.text
        )
    };
    let out = run_koala(dir.path(), &case.text, TIMEOUT);
    let tail = |s: &str, n: usize| {
        let lines: Vec<String> = s.lines().map(strip_ansi).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    };
    let log = format!("stdout (tail):\n{}\nstderr (tail):\n{}", tail(&out.stdout, 40), tail(&out.stderr, 80));
    if !out.success() {
        fail(out.failure(), &log);
    }
    let completed = out
        .stdout
        .lines()
        .filter(|l| l.contains("] reconfiguration ") && l.contains(" completed in "))
        .count();
    let skipped = skipped_after_the_input_ended(&out.stdout).unwrap_or_else(|e| fail(e, &log));
    if completed + skipped != case.steps {
        fail(
            format!(
                "{completed} of {} reconfigurations completed ({skipped} skipped as they came after \
                 the input ended); first error: {}",
                case.steps,
                out.first_error()
            ),
            &log,
        );
    }
    let spec = RunSpec {
        protocol: variant.protocol(),
        top: &case.top,
        query: f.query,
        generator: &case.generator,
        sources: case.sources,
        input_ms: f.records * 1000 / f.rate,
    };
    let out_dir = dir.path().join("out");
    let record = verify_run(&out_dir, &case.text, &spec).unwrap_or_else(|e| fail(e, &log));
    println!(
        "seed {seed}, {variant:?}, {}: run took {:.1} s; reconfigurations (epoch, kind, operator, ms, buckets, bytes):",
        f.query,
        out.elapsed.as_secs_f64()
    );
    for r in &record.reconfigurations {
        let ms = r.completed_ms.map_or(-1, |c| c as i64 - r.started_ms as i64);
        println!("  {} {} {} {ms} {} {}", r.epoch, r.kind, r.operator, r.buckets_moved, r.bytes_moved);
    }
    println!("checked: {}", record.checked.join(", "));
    println!("config:\n{}", case.text);
    let expected = expected_rows(f.query, &case.generator, case.sources, f.shape);
    assert!(!expected.is_empty(), "the expected output is empty; the test proves nothing");
    let got = rows_per_key(&out_dir);
    if let Err(e) = compare_rows(&expected, &got) {
        let late = record.total(koala_types::metric::LATE_DROPPED);
        fail(format!("output differs: {e} (late records dropped: {late})"), &log);
    }
}

#[test]
fn skipped_requests_count_only_after_the_input_ended() {
    let line = |ended: &str, came: &str| {
        format!(
            "[reconfiguration] rejected: skipped: every upstream task of \"join\" has finished (its input \
             ended at {ended} s, the request came at {came} s); nothing is left to reconfigure\n"
        )
    };
    assert_eq!(skipped_after_the_input_ended(&line("1.200", "1.500")), Ok(1));
    assert_eq!(skipped_after_the_input_ended("no rejection\n"), Ok(0));
    assert!(!common::schedule_outlasted_input(&line("1.200", "1.500")), "a request after the end");
    assert!(common::schedule_outlasted_input(&line("1.500", "1.200")), "a request before the end");
    let early = skipped_after_the_input_ended(&line("1.500", "1.200")).expect_err("came before the end");
    assert!(early.contains("came at 1.200 s, before its input ended at 1.500 s"), "{early}");
    assert!(
        skipped_after_the_input_ended(&line("-1.000", "1.200")).is_err(),
        "an end the coordinator never heard"
    );
}

/// The normal suite: `module: variant => [test = (seed, query), …]`.
macro_rules! random_suite {
    ($($module:ident: $variant:expr => [$($name:ident = ($seed:literal, $query:literal)),* $(,)?];)*) => {
        $(
            mod $module {
                use super::*;
                $(
                    #[test]
                    fn $name() {
                        run_case($variant, family_named($query), $seed);
                    }
                )*
            }
        )*
    };
}

random_suite! {
    koala_n0: Variant::KoalaN0 => [
        seed_01_last_n = (1, "last-n"),
        seed_02_tumbling_window = (2, "tumbling-window"),
        seed_03_sliding_window = (3, "sliding-window"),
        seed_04_window_join = (4, "window-join"),
        seed_05_keyed_join = (5, "keyed-join"),
        seed_06_two_stage_aggregate = (6, "two-stage-aggregate"),
        seed_07_filtered_window = (7, "filtered-window"),
        seed_08_keyed_aggregate = (8, "keyed-aggregate"),
        seed_25_self_join = (25, "self-join"),
    ];
    koala_n8: Variant::KoalaN8 => [
        seed_09_last_n = (9, "last-n"),
        seed_10_tumbling_window = (10, "tumbling-window"),
        seed_11_sliding_window = (11, "sliding-window"),
        seed_12_window_join = (12, "window-join"),
        seed_13_keyed_join = (13, "keyed-join"),
        seed_14_two_stage_aggregate = (14, "two-stage-aggregate"),
        seed_15_filtered_window = (15, "filtered-window"),
        seed_16_keyed_aggregate = (16, "keyed-aggregate"),
        seed_26_self_join = (26, "self-join"),
    ];
    stop_and_restart: Variant::StopAndRestart => [
        seed_17_last_n = (17, "last-n"),
        seed_18_tumbling_window = (18, "tumbling-window"),
        seed_19_sliding_window = (19, "sliding-window"),
        seed_20_window_join = (20, "window-join"),
        seed_21_keyed_join = (21, "keyed-join"),
        seed_22_two_stage_aggregate = (22, "two-stage-aggregate"),
        seed_23_filtered_window = (23, "filtered-window"),
        seed_24_keyed_aggregate = (24, "keyed-aggregate"),
        seed_27_self_join = (27, "self-join"),
    ];
    remote: Variant::Remote => [
        seed_28_last_n = (28, "last-n"),
        seed_29_tumbling_window = (29, "tumbling-window"),
        seed_30_sliding_window = (30, "sliding-window"),
        seed_31_window_join = (31, "window-join"),
        seed_32_keyed_join = (32, "keyed-join"),
        seed_33_two_stage_aggregate = (33, "two-stage-aggregate"),
        seed_34_filtered_window = (34, "filtered-window"),
        seed_35_keyed_aggregate = (35, "keyed-aggregate"),
        seed_36_self_join = (36, "self-join"),
    ];
    drrs: Variant::Drrs => [
        seed_28_last_n = (28, "last-n"),
        seed_29_tumbling_window = (29, "tumbling-window"),
        seed_30_sliding_window = (30, "sliding-window"),
        seed_31_window_join = (31, "window-join"),
        seed_32_keyed_join = (32, "keyed-join"),
        seed_33_two_stage_aggregate = (33, "two-stage-aggregate"),
        seed_34_filtered_window = (34, "filtered-window"),
        seed_35_keyed_aggregate = (35, "keyed-aggregate"),
        seed_36_self_join = (36, "self-join"),
    ];
}

#[test]
fn late_data_allowed_lateness_koala() {
    run_case(Variant::KoalaN8, &LATE, 501);
}

#[test]
fn late_data_allowed_lateness_stop_and_restart() {
    run_case(Variant::StopAndRestart, &LATE, 501);
}

#[test]
fn late_data_allowed_lateness_drrs() {
    run_case(Variant::Drrs, &LATE, 501);
}

/// The harness itself: a run that does not end (an unbounded source) is killed at the time-out
/// together with its worker processes, and reported as hung rather than blocking the suite.
#[test]
fn a_hung_run_is_killed_with_its_workers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "query = \"keyed-aggregate\"\nworkers = 2\noutput_dir = \"{}\"\n[parallelism]\nsource = 1\naggregate = 1\nsink = 1\n\
         [params]\nsink = \"discard\"\n[params.source]\nrate = [{{ at_ms = 0, records_per_sec = 1000.0 }}]\n",
        dir.path().join("out").display()
    );
    let out = run_koala(dir.path(), &text, Duration::from_secs(3));
    assert!(out.timed_out && !out.success(), "an unbounded run must time out: {}", out.log());
    assert!(out.failure().contains("hung"), "{}", out.failure());
    // Killed orphans are reaped by init shortly after.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while common::group_alive(out.group) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!common::group_alive(out.group), "processes of koala run's group survived the time-out");
}

/// The generator only draws requests the model accepts, and the model agrees with itself when
/// it re-reads the written config: a cheap check of the generator, no run.
#[test]
fn generated_schedules_are_accepted_by_the_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    for seed in 1..=400 {
        for variant in [Variant::KoalaN0, Variant::StopAndRestart, Variant::Remote, Variant::Drrs] {
            let f = &FAMILIES[seed as usize % FAMILIES.len()];
            let case = generate(dir.path(), variant, f, seed);
            let (_, applied) = common::model::apply_schedule(&case.text)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", case.text));
            assert_eq!(applied.len(), case.steps, "seed {seed}");
            assert!((3..=6).contains(&case.steps), "seed {seed}");
        }
    }
}

/// The soak set: one ignored test per seed and variant (family `seed % 9`).
macro_rules! soak {
    ($($name:ident = $seed:literal),* $(,)?) => {
        mod soak_koala_n0 {
            use super::*;
            $( #[test] #[ignore = "soak; see the module docs"] fn $name() { run_case(Variant::KoalaN0, &FAMILIES[$seed % FAMILIES.len()], $seed) } )*
        }
        mod soak_koala_n8 {
            use super::*;
            $( #[test] #[ignore = "soak; see the module docs"] fn $name() { run_case(Variant::KoalaN8, &FAMILIES[$seed % FAMILIES.len()], $seed) } )*
        }
        mod soak_stop_and_restart {
            use super::*;
            $( #[test] #[ignore = "soak; see the module docs"] fn $name() { run_case(Variant::StopAndRestart, &FAMILIES[$seed % FAMILIES.len()], $seed) } )*
        }
        mod soak_remote {
            use super::*;
            $( #[test] #[ignore = "soak; see the module docs"] fn $name() { run_case(Variant::Remote, &FAMILIES[$seed % FAMILIES.len()], $seed) } )*
        }
        mod soak_drrs {
            use super::*;
            $( #[test] #[ignore = "soak; see the module docs"] fn $name() { run_case(Variant::Drrs, &FAMILIES[$seed % FAMILIES.len()], $seed) } )*
        }
    };
}

soak! {
    seed_0001 = 1, seed_0002 = 2, seed_0003 = 3, seed_0004 = 4, seed_0005 = 5,
    seed_0006 = 6, seed_0007 = 7, seed_0008 = 8, seed_0009 = 9, seed_0010 = 10,
    seed_0011 = 11, seed_0012 = 12, seed_0013 = 13, seed_0014 = 14, seed_0015 = 15,
    seed_0016 = 16, seed_0017 = 17, seed_0018 = 18, seed_0019 = 19, seed_0020 = 20,
    seed_0021 = 21, seed_0022 = 22, seed_0023 = 23, seed_0024 = 24, seed_0025 = 25,
    seed_0026 = 26, seed_0027 = 27, seed_0028 = 28, seed_0029 = 29, seed_0030 = 30,
    seed_0031 = 31, seed_0032 = 32, seed_0033 = 33, seed_0034 = 34, seed_0035 = 35,
    seed_0036 = 36, seed_0037 = 37, seed_0038 = 38, seed_0039 = 39, seed_0040 = 40,
    seed_0041 = 41, seed_0042 = 42, seed_0043 = 43, seed_0044 = 44, seed_0045 = 45,
    seed_0046 = 46, seed_0047 = 47, seed_0048 = 48, seed_0049 = 49, seed_0050 = 50,
    seed_0051 = 51, seed_0052 = 52, seed_0053 = 53, seed_0054 = 54, seed_0055 = 55,
    seed_0056 = 56, seed_0057 = 57, seed_0058 = 58, seed_0059 = 59, seed_0060 = 60,
    seed_0061 = 61, seed_0062 = 62, seed_0063 = 63, seed_0064 = 64, seed_0065 = 65,
    seed_0066 = 66, seed_0067 = 67, seed_0068 = 68, seed_0069 = 69, seed_0070 = 70,
    seed_0071 = 71, seed_0072 = 72, seed_0073 = 73, seed_0074 = 74, seed_0075 = 75,
    seed_0076 = 76, seed_0077 = 77, seed_0078 = 78, seed_0079 = 79, seed_0080 = 80,
    seed_0081 = 81, seed_0082 = 82, seed_0083 = 83, seed_0084 = 84, seed_0085 = 85,
    seed_0086 = 86, seed_0087 = 87, seed_0088 = 88, seed_0089 = 89, seed_0090 = 90,
    seed_0091 = 91, seed_0092 = 92, seed_0093 = 93, seed_0094 = 94, seed_0095 = 95,
    seed_0096 = 96, seed_0097 = 97, seed_0098 = 98, seed_0099 = 99, seed_0100 = 100,
    seed_0101 = 101, seed_0102 = 102, seed_0103 = 103, seed_0104 = 104, seed_0105 = 105,
    seed_0106 = 106, seed_0107 = 107, seed_0108 = 108, seed_0109 = 109, seed_0110 = 110,
    seed_0111 = 111, seed_0112 = 112, seed_0113 = 113, seed_0114 = 114, seed_0115 = 115,
    seed_0116 = 116, seed_0117 = 117, seed_0118 = 118, seed_0119 = 119, seed_0120 = 120,
    seed_0121 = 121, seed_0122 = 122, seed_0123 = 123, seed_0124 = 124, seed_0125 = 125,
    seed_0126 = 126, seed_0127 = 127, seed_0128 = 128, seed_0129 = 129, seed_0130 = 130,
    seed_0131 = 131, seed_0132 = 132, seed_0133 = 133, seed_0134 = 134, seed_0135 = 135,
    seed_0136 = 136, seed_0137 = 137, seed_0138 = 138, seed_0139 = 139, seed_0140 = 140,
    seed_0141 = 141, seed_0142 = 142, seed_0143 = 143, seed_0144 = 144, seed_0145 = 145,
    seed_0146 = 146, seed_0147 = 147, seed_0148 = 148, seed_0149 = 149, seed_0150 = 150,
    seed_0151 = 151, seed_0152 = 152, seed_0153 = 153, seed_0154 = 154, seed_0155 = 155,
    seed_0156 = 156, seed_0157 = 157, seed_0158 = 158, seed_0159 = 159, seed_0160 = 160,
    seed_0161 = 161, seed_0162 = 162, seed_0163 = 163, seed_0164 = 164, seed_0165 = 165,
    seed_0166 = 166, seed_0167 = 167, seed_0168 = 168, seed_0169 = 169, seed_0170 = 170,
    seed_0171 = 171, seed_0172 = 172, seed_0173 = 173, seed_0174 = 174, seed_0175 = 175,
    seed_0176 = 176, seed_0177 = 177, seed_0178 = 178, seed_0179 = 179, seed_0180 = 180,
    seed_0181 = 181, seed_0182 = 182, seed_0183 = 183, seed_0184 = 184, seed_0185 = 185,
    seed_0186 = 186, seed_0187 = 187, seed_0188 = 188, seed_0189 = 189, seed_0190 = 190,
    seed_0191 = 191, seed_0192 = 192, seed_0193 = 193, seed_0194 = 194, seed_0195 = 195,
    seed_0196 = 196, seed_0197 = 197, seed_0198 = 198, seed_0199 = 199, seed_0200 = 200,
    seed_0201 = 201, seed_0202 = 202, seed_0203 = 203, seed_0204 = 204, seed_0205 = 205,
    seed_0206 = 206, seed_0207 = 207, seed_0208 = 208, seed_0209 = 209, seed_0210 = 210,
    seed_0211 = 211, seed_0212 = 212, seed_0213 = 213, seed_0214 = 214, seed_0215 = 215,
    seed_0216 = 216, seed_0217 = 217, seed_0218 = 218, seed_0219 = 219, seed_0220 = 220,
    seed_0221 = 221, seed_0222 = 222, seed_0223 = 223, seed_0224 = 224, seed_0225 = 225,
    seed_0226 = 226, seed_0227 = 227, seed_0228 = 228, seed_0229 = 229, seed_0230 = 230,
    seed_0231 = 231, seed_0232 = 232, seed_0233 = 233, seed_0234 = 234, seed_0235 = 235,
    seed_0236 = 236, seed_0237 = 237, seed_0238 = 238, seed_0239 = 239, seed_0240 = 240,
    seed_0241 = 241, seed_0242 = 242, seed_0243 = 243, seed_0244 = 244, seed_0245 = 245,
    seed_0246 = 246, seed_0247 = 247, seed_0248 = 248, seed_0249 = 249, seed_0250 = 250,
    seed_0251 = 251, seed_0252 = 252, seed_0253 = 253, seed_0254 = 254, seed_0255 = 255,
    seed_0256 = 256, seed_0257 = 257, seed_0258 = 258, seed_0259 = 259, seed_0260 = 260,
    seed_0261 = 261, seed_0262 = 262, seed_0263 = 263, seed_0264 = 264, seed_0265 = 265,
    seed_0266 = 266, seed_0267 = 267, seed_0268 = 268, seed_0269 = 269, seed_0270 = 270,
    seed_0271 = 271, seed_0272 = 272, seed_0273 = 273, seed_0274 = 274, seed_0275 = 275,
    seed_0276 = 276, seed_0277 = 277, seed_0278 = 278, seed_0279 = 279, seed_0280 = 280,
    seed_0281 = 281, seed_0282 = 282, seed_0283 = 283, seed_0284 = 284, seed_0285 = 285,
    seed_0286 = 286, seed_0287 = 287, seed_0288 = 288, seed_0289 = 289, seed_0290 = 290,
    seed_0291 = 291, seed_0292 = 292, seed_0293 = 293, seed_0294 = 294, seed_0295 = 295,
    seed_0296 = 296, seed_0297 = 297, seed_0298 = 298, seed_0299 = 299, seed_0300 = 300,
}
