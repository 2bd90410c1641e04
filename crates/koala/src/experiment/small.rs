//! `small-state` (Figures 19–20, Appendix D.3): the Nexmark queries whose state stays small
//! (windows bound it, or the key space is tiny) under every protocol, in the [`Surge`] setting
//! without warm state; and `large-scale` (Figure 9, §5.3.1): Q6* scaled out with more tasks and
//! more state than `scale-out-queries`, scaled down to one machine.

use koala_coordinator::config::PolicyName;

use super::engine::{Plan, RunSpec};
use super::scale_out::{Surge, against_stop_and_restart};
use super::scenario::{Scenario, Step};
use super::{Info, Mode, Runner};

/// (name, query, source, other operators with their tasks, target, `[params]` lines).
type Small =
    (&'static str, &'static str, &'static str, &'static [(&'static str, u32)], &'static str, &'static str);

const SMALL: [Small; 6] = [
    ("Q4", "nexmark-q4", "events", &[("category", 2)], "closed_auction", ""),
    ("Q4*", "nexmark-q4star", "closed_auctions", &[], "category", ""),
    // Q5's "count" emits one record per auction per window end, and "hottest" (one task: it is
    // keyed by the window end) is capped like every stateful task; with a 1 s slide over 10 000
    // active auctions that is ~19 000 records/s into a task capped at 5 000, so the job never
    // drained (and Koala's scale-out waited 224 s behind it). A 5 s slide over 1 000 active
    // auctions (plus the ~900/s new ones) keeps it near 2 000/s.
    ("Q5", "nexmark-q5", "bids", &[("hottest", 1)], "count", "window_ms = 10000\nslide_ms = 5000\n"),
    ("Q6", "nexmark-q6", "events", &[("closed_auction", 2)], "seller", ""),
    ("Q7", "nexmark-q7", "bids", &[("highest", 1)], "max_bid", "window_ms = 10000\n"),
    ("Q8", "nexmark-q8", "events", &[], "new_users", "new_user_period_ms = 10000\n"),
];

fn small_plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    let (surge, names) = mode.pick::<(Surge, &[&str])>(
        (Surge { phases_s: [2, 2, 4], tasks: (1, 2), task_records_per_sec: 3_000.0 }, &["Q5"]),
        (Surge { phases_s: [8, 6, 14], tasks: (2, 4), task_records_per_sec: 5_000.0 }, &["Q5", "Q8"]),
        (
            Surge { phases_s: [120, 60, 420], tasks: (4, 8), task_records_per_sec: 5_000.0 },
            &["Q4", "Q4*", "Q5", "Q6", "Q7", "Q8"],
        ),
    );
    let mut runs = Vec::new();
    let mut settings = vec![
        format!(
            "queries: {} ({}); no warm state (the state a query builds while it runs); link_mb_per_sec = 10 per worker",
            names.join(", "),
            if mode == Mode::Full { "all six" } else { "a subset: --quick runs two of the six" }
        ),
        format!(
            "phases {:?} s (70 % of capacity, 2×, then the target {} → {} at {} s), task_records_per_sec = {}",
            surge.phases_s,
            surge.tasks.0,
            surge.tasks.1,
            surge.at_s(),
            surge.task_records_per_sec
        ),
    ];
    for (name, query, source, others, target, params) in SMALL.iter().filter(|s| names.contains(&s.0)) {
        let mut parallelism = vec![(*source, 2), (*target, surge.tasks.0)];
        parallelism.extend(others.iter().copied());
        parallelism.push(("sink", 1));
        let scenario = Scenario {
            query,
            params: format!("sink = \"discard\"\n{params}"),
            param_tables: format!(
                "[params.nexmark]\nhot_ratio = 0.1\nactive_people = 1000\nactive_auctions = {}\nextra_payload_bytes = 0\n",
                if *name == "Q5" { 1_000 } else { 10_000 }
            ),
            source: "max_disorder_ms = 0\n".into(),
            parallelism,
            target,
            workers: surge.tasks.1,
            duration_s: surge.duration_s(),
            steps: vec![Step::Rescale {
                at_s: surge.at_s(),
                operator: (*target).into(),
                tasks: surge.tasks.1,
            }],
            rates: surge.rates(),
            task_records_per_sec: surge.task_records_per_sec,
            link_mb_per_sec: Some(10.0),
            extra_keys: None,
            warm_keys: 0,
            value_bytes: 0,
        };
        settings.push(format!(
            "{name}: {query} ({}) → target {target}, offered {}",
            format!("{}{}", params, scenario.param_tables.lines().skip(1).collect::<Vec<_>>().join(", "))
                .replace('\n', ", "),
            scenario.rates_line()
        ));
        for p in protocols {
            runs.push(RunSpec {
                label: format!("{name} {p}"),
                group: (*name).into(),
                protocol: p.clone(),
                scenario: scenario.clone(),
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

/// `koala experiment small-state`.
pub const SMALL_STATE: Info = Info {
    name: "small-state",
    figure: "Figures 19-20",
    shows: "the small-state Nexmark queries (Q4, Q4*, Q5, Q6, Q7, Q8) scaled out under every protocol: throughput, lag, per-batch latency",
    quick: "Q5 and Q8 only, 2 → 4 tasks, 28 s per run: 8 runs, about 4.5 minutes",
    full: "all six, 4 → 8 tasks, 10 minutes per run: 24 runs, about 4 hours",
    protocols: super::ALL4,
    runner: Runner::Jobs(small_plan),
};

fn large_plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    let (surge, keys) = mode.pick(
        (Surge { phases_s: [2, 2, 4], tasks: (2, 4), task_records_per_sec: 2_000.0 }, 4_000),
        (Surge { phases_s: [20, 10, 30], tasks: (4, 8), task_records_per_sec: 2_500.0 }, 128_000),
        (Surge { phases_s: [120, 60, 420], tasks: (8, 16), task_records_per_sec: 2_500.0 }, 2_000_000),
    );
    let q = super::queries::QUERIES.iter().find(|q| q.name == "Q6*").expect("Q6* is listed");
    let scenario = super::queries::scenario(q, surge, keys, 2048);
    Ok(Plan {
        settings: vec![
            format!(
                "Q6*, {keys} warm sellers × 2 KB = {}, seller {} → {} on {} workers (the paper: 16 → 32 tasks over ~320 GB on a cluster; here the tasks are halved (full) or quartered (--quick) and the state cut to fit one 2-core machine, with the same link rule as scale-out-queries)",
                crate::human::human_bytes(keys * 2048),
                surge.tasks.0,
                surge.tasks.1,
                surge.tasks.1
            ),
            surge.line("seller", keys as f64 * 2048.0),
        ],
        runs: RunSpec::per_protocol(protocols, "Q6*", &scenario),
        default_policy: PolicyName::Interleaved,
        policy_required: false,
        measured_step: 0,
        per_task_of: None,
        conclude: against_stop_and_restart,
    })
}

/// `koala experiment large-scale`.
pub const LARGE_SCALE: Info = Info {
    name: "large-scale",
    figure: "Figure 9",
    shows: "a scale-out of Q6* with more tasks and state than scale-out-queries (the paper's 16 → 32 tasks over 320 GB, scaled down): Koala's recovery should match the smaller setting's",
    quick: "4 → 8 tasks on 8 workers, 256 MB warm, 60 s, Koala only: about 1.5 minutes",
    full: "8 → 16 tasks on 16 workers, 4 GB warm, 10 minutes",
    protocols: &["koala"],
    runner: Runner::Jobs(large_plan),
};
