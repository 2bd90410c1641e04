//! The §5.2 comparison over the six large-state queries — `scale-out-queries` (Figures 6–8,
//! 17–18) — and Twitch's two stateful operators reconfigured at once — `two-operators`
//! (Figure 21). Each query starts from warm state of its own layout (`koala warmup`) whose keys
//! are the ones its generator draws (the key space is the warm keys where the generator has one),
//! then runs the [`Surge`] schedule once per protocol.

use koala_coordinator::config::PolicyName;

use super::engine::{Plan, RunSpec};
use super::scale_out::{Surge, against_stop_and_restart};
use super::scenario::{Scenario, Step};
use super::{Info, Mode, Runner};

/// One query of the comparison.
pub(super) struct Query {
    pub(super) name: &'static str,
    query: &'static str,
    params: &'static str,
    source_op: &'static str,
    /// Operators between the source and the target, with the source's tasks.
    middle: &'static [&'static str],
    target: &'static str,
    /// The most warm keys the query's key space holds (Taxi: 263 × 263 routes).
    max_keys: u64,
}

pub(super) const QUERIES: [Query; 6] = [
    Query {
        name: "Q3",
        query: "nexmark-q3",
        params: "sink = \"discard\"\nstate_padding_bytes = 2048\n",
        source_op: "events",
        middle: &["filter"],
        target: "join",
        max_keys: u64::MAX,
    },
    Query {
        name: "Q6*",
        query: "nexmark-q6star",
        params: "sink = \"discard\"\nstate_padding_bytes = 2048\n",
        source_op: "closed_auctions",
        middle: &[],
        target: "seller",
        max_keys: u64::MAX,
    },
    Query {
        name: "Twitch",
        query: "twitch",
        params: "sink = \"discard\"\nstate_padding_bytes = 1024\n",
        source_op: "events",
        middle: &[],
        target: "engagement",
        max_keys: u64::MAX,
    },
    Query {
        name: "Taxi",
        query: "taxi",
        params: "sink = \"discard\"\nrecent = 150\n",
        source_op: "trips",
        middle: &[],
        target: "median_trip",
        max_keys: 263 * 263,
    },
    Query {
        name: "Azure",
        query: "azure",
        params: "sink = \"discard\"\nrecent = 80\nstate_padding_bytes = 256\n",
        source_op: "readings",
        middle: &[],
        target: "cpu_stats",
        max_keys: u64::MAX,
    },
    Query {
        name: "Borg",
        query: "borg",
        params: "sink = \"discard\"\nrecent = 10\nstate_padding_bytes = 4096\n",
        source_op: "usage",
        middle: &[],
        target: "task_stats",
        max_keys: u64::MAX,
    },
];

/// The generator's table for `q` with `keys` warm keys.
fn tables(q: &Query, keys: u64) -> String {
    match q.query {
        "nexmark-q3" | "nexmark-q6star" => {
            "[params.nexmark]\nhot_ratio = 0.1\nactive_people = 1000\nactive_auctions = 10000\nextra_payload_bytes = 0\n".into()
        }
        // 1 000 streamers: warm pair k is (k mod 1 000, k / 1 000), so the warm viewers are the
        // first keys / 1 000, where the viewers' active window starts.
        "twitch" => "[params.generator]\nkeys = 1000\nactive_keys = 100\nviewers = 1000000\nhot_ratio = 0.25\nhot_keys = 16\n".into(),
        "taxi" => "[params.generator]\nhot_ratio = 0.25\nhot_keys = 16\n".into(),
        _ => format!("[params.generator]\nkeys = {keys}\nactive_keys = {}\nhot_ratio = 0.1\n", (keys / 10).max(1)),
    }
}

pub(super) fn scenario(q: &Query, surge: Surge, warm_keys: u64, value_bytes: usize) -> Scenario {
    let keys = warm_keys.min(q.max_keys);
    let state = keys as f64 * value_bytes as f64;
    let mut parallelism = vec![(q.source_op, 2)];
    parallelism.extend(q.middle.iter().map(|op| (*op, 2)));
    parallelism.push((q.target, surge.tasks.0));
    if q.query == "twitch" {
        parallelism.push(("loyalty", surge.tasks.0));
    }
    parallelism.push(("sink", 1));
    Scenario {
        query: q.query,
        // `Scenario::params_text` sets `state_padding_bytes` to `value_bytes`.
        params: q.params.into(),
        param_tables: tables(q, keys),
        source: "max_disorder_ms = 0\n".into(),
        parallelism,
        target: q.target,
        workers: surge.tasks.1,
        duration_s: surge.duration_s(),
        steps: vec![Step::Rescale { at_s: surge.at_s(), operator: q.target.into(), tasks: surge.tasks.1 }],
        rates: surge.rates(),
        task_records_per_sec: surge.task_records_per_sec,
        link_mb_per_sec: Some(surge.link_mb_per_sec(state)),
        extra_keys: None,
        warm_keys: keys,
        value_bytes,
    }
}

/// (surge, warm keys, value bytes, queries) of a mode.
fn setup(mode: Mode) -> (Surge, u64, usize, &'static [&'static str]) {
    mode.pick::<(Surge, u64, usize, &'static [&'static str])>(
        (Surge { phases_s: [2, 2, 4], tasks: (1, 2), task_records_per_sec: 3_000.0 }, 2_000, 256, &["Q6*"]),
        // 64 MB per query, 32 s per run, 8 runs.
        (
            Surge { phases_s: [10, 8, 14], tasks: (2, 4), task_records_per_sec: 5_000.0 },
            32_000,
            2048,
            &["Q6*", "Borg"],
        ),
        // 1 GB per query, the paper's 10 minutes per run and 4 → 8 tasks.
        (
            Surge { phases_s: [120, 60, 420], tasks: (4, 8), task_records_per_sec: 5_000.0 },
            500_000,
            2048,
            &["Q3", "Q6*", "Twitch", "Taxi", "Azure", "Borg"],
        ),
    )
}

fn plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    let (surge, keys, bytes, names) = setup(mode);
    let mut runs = Vec::new();
    let mut settings = vec![
        format!(
            "queries: {} ({}); warm state per query: up to {keys} keys × {bytes} B of padding ({} of padding; Taxi has at most 263² routes)",
            names.join(", "),
            if mode == Mode::Full {
                "all six"
            } else {
                "a subset: --quick runs two of the six, the full variant all"
            },
            crate::human::human_bytes(keys * bytes as u64)
        ),
        surge.line("each query's target", keys as f64 * bytes as f64),
    ];
    for q in QUERIES.iter().filter(|q| names.contains(&q.name)) {
        let s = scenario(q, surge, keys, bytes);
        settings.push(format!("{}: {} → target {}, offered {}", q.name, q.query, q.target, s.rates_line()));
        for p in protocols {
            runs.push(RunSpec {
                label: format!("{} {p}", q.name),
                group: q.name.into(),
                protocol: p.clone(),
                scenario: s.clone(),
            });
        }
    }
    Ok(Plan {
        settings,
        runs,
        default_policy: PolicyName::Interleaved,
        policy_required: false,
        measured_step: 0,
        per_task_of: None,
        conclude: against_stop_and_restart,
    })
}

/// `koala experiment scale-out-queries`.
pub const SCALE_OUT_QUERIES: Info = Info {
    name: "scale-out-queries",
    figure: "Figures 6-8, 17-18",
    shows: "the §5.2 scale-out of the large-state queries (Q3, Q6*, Twitch, Taxi, Azure, Borg) under every protocol: recovery on the end-to-end p99, state moved, throughput, per-batch latency per query",
    quick: "Q6* and Borg only, 64 MB warm each, 2 → 4 tasks, 32 s per run: 8 runs, about 5 minutes",
    full: "all six queries, 1 GB warm each, 4 → 8 tasks, 10 minutes per run: 24 runs, about 4.5 hours",
    protocols: super::ALL4,
    runner: Runner::Jobs(plan),
};

fn two_plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    let (surge, keys, bytes, _) = setup(mode);
    let q = QUERIES.iter().find(|q| q.query == "twitch").expect("twitch is listed");
    let one = scenario(q, surge, keys, bytes);
    let mut both = one.clone();
    both.steps.push(Step::Rescale { at_s: surge.at_s(), operator: "loyalty".into(), tasks: surge.tasks.1 });
    let mut runs = Vec::new();
    for p in protocols {
        runs.push(RunSpec {
            label: format!("engagement only {p}"),
            group: "Twitch".into(),
            protocol: p.clone(),
            scenario: one.clone(),
        });
        runs.push(RunSpec {
            label: format!("both operators {p}"),
            group: "Twitch".into(),
            protocol: p.clone(),
            scenario: both.clone(),
        });
    }
    Ok(Plan {
        settings: vec![
            format!("Twitch, {keys} warm keys × {bytes} B per operator's key (engagement pairs; loyalty for the first 1 000 streamers)"),
            surge.line("engagement (and loyalty)", keys as f64 * bytes as f64),
            "runs: the engagement operator alone, then engagement and loyalty rescaled at the same second (two reconfigurations back to back)".into(),
        ],
        runs,
        default_policy: PolicyName::Interleaved,
        policy_required: false,
        measured_step: 0,
        per_task_of: None,
        conclude: |done| {
            done.chunks(2)
                .filter_map(|pair| {
                    let [a, b] = pair else { return None };
                    let last = |d: &super::engine::Done| {
                        d.report.reconfigurations.iter().filter_map(|c| c.recovery_s).max()
                    };
                    Some(format!(
                        "{}: recovery (e2e p99) {} (one operator) vs {} (both; the later of the two reconfigurations')",
                        a.report.run.protocol,
                        last(a).map_or("not seen".into(), |s| format!("{s} s")),
                        last(b).map_or("not seen".into(), |s| format!("{s} s"))
                    ))
                })
                .collect()
        },
    })
}

/// `koala experiment two-operators`.
pub const TWO_OPERATORS: Info = Info {
    name: "two-operators",
    figure: "Figure 21",
    shows: "Twitch with both stateful operators scaled out at once, against the engagement operator alone",
    quick: "64 MB warm, 2 → 4 tasks, 32 s per run, Koala only: 2 runs, about 1.5 minutes",
    full: "1 GB warm, 4 → 8 tasks, 10 minutes per run: about 22 minutes",
    protocols: &["koala"],
    runner: Runner::Jobs(two_plan),
};
