//! `koala experiment migration` (Figure 12, §5.3.4): one of Q6*'s seller tasks moves to a
//! worker of its own at a steady, sustainable rate, under Koala with N = 0, 25 and 50 extra keys
//! per pull (`extra_keys`: fetch on demand only; the paper's progressive-default, about the
//! batch's keys; progressive-large, twice that). Shows throughput and the state moved over time,
//! and how long the task's state took to follow it.

use koala_coordinator::config::PolicyName;

use super::engine::{Done, Plan, RunSpec};
use super::scenario::{Scenario, Step};
use super::{Info, Mode, Runner};

/// (seller tasks, seconds before the migration, seconds after, records/s per task, warm keys,
/// value bytes, seconds the task's whole state takes to cross the link).
fn setup(mode: Mode) -> (u32, u64, u64, f64, u64, usize, f64) {
    mode.pick(
        (2, 2, 5, 2_000.0, 2_000, 256, 2.0),
        (2, 12, 48, 4_000.0, 64_000, 2048, 20.0),
        (4, 120, 480, 4_000.0, 1_000_000, 2048, 150.0),
    )
}

const EXTRA_KEYS: [(usize, &str); 3] =
    [(0, "fetch-on-demand"), (25, "progressive-default"), (50, "progressive-large")];

fn plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    super::only("migration", protocols, &["koala"])?;
    let (tasks, before, after, per_task, keys, bytes, transfer_s) = setup(mode);
    let task_state = keys as f64 * bytes as f64 / f64::from(tasks);
    let link = ((task_state / 1e6 / transfer_s * 10.0).round() / 10.0).max(0.1);
    // Workers 0..tasks host the seller tasks round-robin; worker `tasks` hosts none of them.
    let base = Scenario {
        query: "nexmark-q6star",
        params: "sink = \"discard\"\nstate_padding_bytes = 2048\n".into(),
        param_tables: "[params.nexmark]\nhot_ratio = 0.1\nactive_people = 1000\nactive_auctions = 10000\nextra_payload_bytes = 0\n".into(),
        source: "max_disorder_ms = 0\n".into(),
        parallelism: vec![("closed_auctions", 2), ("seller", tasks), ("sink", 1)],
        target: "seller",
        workers: tasks + 1,
        duration_s: before + after,
        steps: vec![Step::Migrate { at_s: before as f64, operator: "seller".into(), task: 0, worker: tasks }],
        rates: vec![(0.0, 0.7 * f64::from(tasks) * per_task)],
        task_records_per_sec: per_task,
        link_mb_per_sec: Some(link),
        extra_keys: None,
        warm_keys: keys,
        value_bytes: bytes,
    };
    let runs = EXTRA_KEYS
        .iter()
        .map(|(n, name)| RunSpec {
            label: format!("{name} (N = {n})"),
            group: "Q6*".into(),
            protocol: "koala".into(),
            scenario: Scenario { extra_keys: Some(*n), ..base.clone() },
        })
        .collect();
    Ok(Plan {
        settings: vec![
            format!(
                "Q6*: {keys} warm sellers × {bytes} B over {tasks} seller tasks (≈ {} per task); seller.0 moves to worker {tasks} (no seller task there) at {before} s; {after} s after",
                crate::human::human_bytes(task_state as u64)
            ),
            format!(
                "offered {}; task_records_per_sec = {per_task}; link_mb_per_sec = {link} per worker (the task's whole state crosses it in {transfer_s} s)",
                base.rates_line()
            ),
            "runs: extra_keys = 0 (fetch on demand), 25 (progressive-default), 50 (progressive-large)".into(),
        ],
        runs,
        default_policy: PolicyName::Interleaved,
        policy_required: false,
        measured_step: 0,
        per_task_of: None,
        conclude: moved_until,
    })
}

/// Per run: the state moved and the last second some moved, after the migration started.
fn moved_until(done: &[Done]) -> Vec<String> {
    done.iter()
        .map(|d| {
            let task_state = d.spec.scenario.warm_keys as f64 * d.spec.scenario.value_bytes as f64
                / f64::from(d.spec.scenario.parallelism[1].1);
            let start = d.measured(0).map_or(0, |c| c.start_t_s);
            let last = d.report.table.rows.iter().filter(|r| r.state_bytes_moved > 0.0).map(|r| r.t_s).max();
            let input_last = d.report.input_last_t_s.unwrap_or(0);
            format!(
                "{}: moved {} ({:.0} % of the task's warm state); state moved until {} after the migration started; lowest rate {}",
                d.spec.label,
                crate::human::human_bytes(d.report.state_moved.total() as u64),
                100.0 * d.report.state_moved.total() / task_state.max(1.0),
                match last {
                    Some(t) if t >= input_last => format!("the end of the input (> {} s)", t - start),
                    Some(t) => format!("{} s", t - start),
                    None => "never".into(),
                },
                d.measured(0).and_then(|c| c.dip).map_or("-".into(), |x| x.short())
            )
        })
        .collect()
}

/// `koala experiment migration`.
pub const MIGRATION: Info = Info {
    name: "migration",
    figure: "Figure 12",
    shows: "task migration of a Q6* seller task under Koala with N = 0 / 25 / 50 extra keys per pull: throughput and state moved over time",
    quick: "2 seller tasks, 128 MB warm, 60 s per run, 3 runs: about 3.5 minutes",
    full: "4 seller tasks, 2 GB warm, 10 minutes per run: about 31 minutes",
    protocols: &["koala"],
    runner: Runner::Jobs(plan),
};
