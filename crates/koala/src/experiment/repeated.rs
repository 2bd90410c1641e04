//! `koala experiment repeated` (Figure 10, §5.3.2): Q6* through two rate increases, each
//! followed by a scale-out, then two rate reductions, each followed by a scale-in — the paper's
//! 4 → 8 → 12 → 9 → 6 tasks (halved with `--quick`: 2 → 4 → 6 → 5 → 3) — with the state each
//! step moved. The paper's point: Koala moves far less than the reassigned state at each step,
//! as cold state never moved to the new tasks need not move back.

use koala_coordinator::config::PolicyName;

use super::engine::{Done, Plan, RunSpec};
use super::scale_out::PAUSE_FRACTION;
use super::scenario::{Scenario, Step};
use super::{Info, Mode, Runner};

/// (tasks at each step, seconds per segment, seconds from a rate change to its reconfiguration,
/// records/s per task, warm keys, value bytes).
fn setup(mode: Mode) -> ([u32; 5], u64, u64, f64, u64, usize) {
    mode.pick(
        ([1, 2, 3, 2, 1], 4, 2, 2_000.0, 2_000, 256),
        ([2, 4, 6, 5, 3], 30, 8, 2_500.0, 32_000, 2048),
        ([4, 8, 12, 9, 6], 120, 60, 2_500.0, 500_000, 2048),
    )
}

fn plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    let (tasks, segment, delay, per_task, keys, bytes) = setup(mode);
    let duration = segment * tasks.len() as u64;
    let state = keys as f64 * bytes as f64;
    // The rate of segment i keeps 70 % of the tasks it will scale to busy: a rise overloads the
    // tasks before their scale-out; a fall comes before its scale-in.
    let rates: Vec<(f64, f64)> = tasks
        .iter()
        .enumerate()
        .map(|(i, n)| ((i as u64 * segment) as f64, 0.7 * f64::from(*n) * per_task))
        .collect();
    let steps: Vec<Step> = tasks
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, n)| Step::Rescale {
            at_s: (i as u64 * segment + delay) as f64,
            operator: "seller".into(),
            tasks: *n,
        })
        .collect();
    let most = *tasks.iter().max().unwrap_or(&1);
    let link = ((state / f64::from(tasks[1]) / 1e6 / (PAUSE_FRACTION * duration as f64) * 10.0).round()
        / 10.0)
        .max(0.1);
    let scenario = Scenario {
        query: "nexmark-q6star",
        params: "sink = \"discard\"\nstate_padding_bytes = 2048\n".into(),
        param_tables: "[params.nexmark]\nhot_ratio = 0.1\nactive_people = 1000\nactive_auctions = 10000\nextra_payload_bytes = 0\n".into(),
        source: "max_disorder_ms = 0\n".into(),
        parallelism: vec![("closed_auctions", 2), ("seller", tasks[0]), ("sink", 1)],
        target: "seller",
        workers: most,
        duration_s: duration,
        steps,
        rates,
        task_records_per_sec: per_task,
        link_mb_per_sec: Some(link),
        extra_keys: None,
        warm_keys: keys,
        value_bytes: bytes,
    };
    let records = rates_total(&scenario.rates, segment * 4 + delay);
    let sellers = (records / 3.0).max(keys as f64);
    Ok(Plan {
        settings: vec![
            format!(
                "Q6*: {keys} warm sellers × {bytes} B = {}; seller tasks {tasks:?}, a step every {segment} s, {delay} s after its rate change; {most} workers (one per task at the peak)",
                crate::human::human_bytes(state as u64)
            ),
            format!("offered: {}", scenario.rates_line()),
            format!(
                "task_records_per_sec = {per_task}, link_mb_per_sec = {link} per worker (from the warm state)"
            ),
            format!(
                "Q6*'s state grows while it runs: each auction's seller is one of the newest 1 000 people and a person is born every 3 auctions (the warm sellers are the first {keys}), so by the last step (~{:.0} k records) about {:.0} k sellers hold ~{} in all, which is why a step can move more than the warm state",
                records / 1e3,
                sellers / 1e3,
                crate::human::human_bytes((sellers * bytes as f64) as u64)
            ),
        ],
        runs: RunSpec::per_protocol(protocols, "Q6*", &scenario),
        default_policy: PolicyName::Interleaved,
        policy_required: false,
        measured_step: 0,
        per_task_of: None,
        conclude: per_step,
    })
}

/// Records offered before second `until` under `rates` (steps of `(start, records/s)`).
fn rates_total(rates: &[(f64, f64)], until: u64) -> f64 {
    let until = until as f64;
    rates
        .iter()
        .enumerate()
        .map(|(i, (at, r))| {
            let end = rates.get(i + 1).map_or(until, |n| n.0).min(until);
            (end - at).max(0.0) * r
        })
        .sum()
}

/// The state each step moved, per run.
fn per_step(done: &[Done]) -> Vec<String> {
    done.iter()
        .map(|d| {
            let warm = d.spec.scenario.warm_keys as f64 * d.spec.scenario.value_bytes as f64;
            let steps: Vec<String> = d
                .report
                .reconfigurations
                .iter()
                .zip(&d.spec.scenario.steps)
                .enumerate()
                .map(|(i, (c, s))| {
                    let tasks = match s {
                        Step::Rescale { tasks, .. } => tasks.to_string(),
                        _ => "?".into(),
                    };
                    format!(
                        "step {} (→ {tasks}): {} ({:.1}× the warm state), recovery {}",
                        i + 1,
                        crate::human::human_bytes(c.state_moved.total() as u64),
                        c.state_moved.total() / warm.max(1.0),
                        c.recovery_s.map_or("not seen".into(), |s| format!("{s} s"))
                    )
                })
                .collect();
            format!("{}: {}", d.report.run.protocol, steps.join("; "))
        })
        .collect()
}

/// `koala experiment repeated`.
pub const REPEATED: Info = Info {
    name: "repeated",
    figure: "Figure 10",
    shows: "repeated reconfigurations of Q6* with rate changes (4 → 8 → 12 → 9 → 6 tasks): throughput and the state moved at each step",
    quick: "2 → 4 → 6 → 5 → 3 tasks, 64 MB warm, 150 s, Koala only: about 3 minutes (add --protocols koala,stop-and-restart to see the reassigned state moved in full: about 6)",
    full: "4 → 8 → 12 → 9 → 6 tasks on 12 workers, 1 GB warm, 10 minutes per run",
    protocols: &["koala"],
    runner: Runner::Jobs(plan),
};
