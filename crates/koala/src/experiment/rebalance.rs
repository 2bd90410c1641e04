//! `koala experiment rebalance` (Figure 11, §5.3.3): skew mitigation on Taxi partitioned by
//! pickup zone (`taxi_partition = "pickup_area"`), whose 8 busy zones take 60 % of the trips.
//! The paper starts with one of four tasks holding most hot keys, near its capacity without a
//! backlog; the rate rises by 50 % (a backlog forms at that task), and a minute later a
//! skew-aware rebalance spreads the hot zones' buckets over the tasks.
//!
//! The starting point is made, not found: our partition policies spread the 8 hot zones over the
//! tasks, so a first rebalance at 1 s gathers their buckets on task 0 (labelled "setup" in the
//! plots; it moves the little state those buckets hold by then). The skew-aware rebalance is the
//! second one; it knows the generator's hot zones (as a skew-aware policy knows the hot buckets
//! from its per-bucket load; the controller is not part of the protocol) and deals their buckets
//! out round-robin. The table's recovery and dip columns are the second one's.

use koala_coordinator::config::PolicyName;
use koala_types::{DEFAULT_NUM_BUCKETS, bucket_of, encode};
use koala_workloads::realworld::TAXI_ZONES;

use super::engine::{Plan, RunSpec};
use super::scenario::{Scenario, Step};
use super::{Info, Mode, Runner};

const TASKS: u32 = 4;
const HOT_ZONES: u64 = 8;
const HOT_RATIO: f64 = 0.6;

/// The buckets of the hot zones (the generator's hot key `i` is zone `i · (zones / hot keys)`),
/// without repeats, in zone order.
fn hot_buckets() -> anyhow::Result<Vec<u16>> {
    let mut buckets = Vec::new();
    for i in 0..HOT_ZONES {
        let b = bucket_of(&encode(&(i * (TAXI_ZONES / HOT_ZONES)))?, DEFAULT_NUM_BUCKETS);
        if !buckets.contains(&b) {
            buckets.push(b);
        }
    }
    Ok(buckets)
}

fn plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    let (before, rise, after, per_task) =
        mode.pick((3u64, 2u64, 5u64, 2_000.0), (20, 15, 40, 4_000.0), (120, 60, 420, 4_000.0));
    let owners =
        koala_coordinator::partition::assign(PolicyName::Interleaved, DEFAULT_NUM_BUCKETS, &[0, 1, 2, 3]);
    let hot = hot_buckets()?;
    let gather: Vec<u16> = hot.iter().copied().filter(|b| owners[usize::from(*b)] != 0).collect();
    let spread: Vec<(Vec<u16>, u32)> = (1..TASKS)
        .map(|t| {
            (hot.iter().enumerate().filter(|(i, _)| *i as u32 % TASKS == t).map(|(_, b)| *b).collect(), t)
        })
        .filter(|(b, _): &(Vec<u16>, u32)| !b.is_empty())
        .collect();
    // Task 0 after the gathering: all hot trips and a quarter of the rest. At 90 % of its
    // capacity before the rise; the rise by half overloads it.
    let share = HOT_RATIO + (1.0 - HOT_RATIO) / f64::from(TASKS);
    let rate = 0.9 * per_task / share;
    let mut steps = Vec::new();
    if !gather.is_empty() {
        steps.push(Step::Rebalance {
            at_s: 1.0,
            operator: "median_trip".into(),
            moves: vec![(gather.clone(), 0)],
        });
    }
    steps.push(Step::Rebalance {
        at_s: (before + rise) as f64,
        operator: "median_trip".into(),
        moves: spread.clone(),
    });
    let scenario = Scenario {
        query: "taxi",
        params: "sink = \"discard\"\ntaxi_partition = \"pickup_area\"\nrecent = 150\n".into(),
        param_tables: format!("[params.generator]\nhot_ratio = {HOT_RATIO}\nhot_keys = {HOT_ZONES}\n"),
        source: "max_disorder_ms = 0\n".into(),
        parallelism: vec![("trips", 2), ("median_trip", TASKS), ("sink", 1)],
        target: "median_trip",
        workers: TASKS,
        duration_s: before + rise + after,
        steps,
        rates: vec![(0.0, rate), (before as f64, 1.5 * rate)],
        task_records_per_sec: per_task,
        link_mb_per_sec: Some(10.0),
        extra_keys: None,
        warm_keys: TAXI_ZONES,
        value_bytes: 2048,
    };
    let measured_step = usize::from(!gather.is_empty());
    Ok(Plan {
        settings: vec![
            format!(
                "Taxi partitioned by pickup zone: {TAXI_ZONES} zones (warm, 2 KB each), {HOT_ZONES} hot zones take {:.0} % of the trips; {TASKS} median_trip tasks on {TASKS} workers, interleaved policy",
                HOT_RATIO * 100.0
            ),
            format!(
                "setup at 1 s: the hot zones' buckets {gather:?} gathered on task 0 (the paper's starting point); offered {} (task 0 at 90 % of its {per_task} records/s, then 135 %)",
                scenario.rates_line()
            ),
            format!(
                "skew-aware rebalance at {} s: hot buckets {hot:?} dealt out round-robin ({})",
                before + rise,
                spread.iter().map(|(b, t)| format!("{b:?} → task {t}")).collect::<Vec<_>>().join(", ")
            ),
            "link_mb_per_sec = 10 per worker; per-task plots: records into each median_trip task per second"
                .into(),
        ],
        runs: RunSpec::per_protocol(protocols, "Taxi", &scenario),
        default_policy: PolicyName::Interleaved,
        policy_required: true,
        measured_step,
        per_task_of: Some("median_trip"),
        conclude: |done| {
            done.iter()
                .map(|d| {
                    let step = d.report.reconfigurations.len().saturating_sub(1);
                    let c = d.report.reconfigurations.get(step);
                    format!(
                        "{}: after the skew-aware rebalance, recovery (e2e p99) {}, on source lag {}, lowest rate {}; per-task throughput in tasks-{}.png",
                        d.report.run.protocol,
                        c.and_then(|c| c.recovery_s).map_or("not seen".into(), |s| format!("{s} s")),
                        c.and_then(|c| c.lag_recovery_s).map_or("not seen".into(), |s| format!("{s} s")),
                        c.and_then(|c| c.dip).map_or("-".into(), |x| x.short()),
                        super::engine::slug(&d.spec.label)
                    )
                })
                .collect()
        },
    })
}

/// `koala experiment rebalance`.
pub const REBALANCE: Info = Info {
    name: "rebalance",
    figure: "Figure 11",
    shows: "skew-aware rebalance of Taxi partitioned by pickup area: per-task throughput and lag before and after",
    quick: "4 tasks, 75 s, Koala only: about 1.5 minutes",
    full: "4 tasks, 10 minutes",
    protocols: &["koala"],
    runner: Runner::Jobs(plan),
};
