//! The coordinator and the simulator plan a reconfiguration alike: for random rescales,
//! rebalances and migrations over random deployments, the plan the coordinator makes from the
//! request equals the plan the simulator makes from the bucket assignment it would request
//! (`Target::from_assignment`, what `sim/coordinator.rs` does): the same deployment, moves,
//! created, cancelled and retired tasks, upstreams and participants.

use std::collections::{BTreeMap, BTreeSet};

use koala_coordinator::config::PolicyName;
use koala_coordinator::reconfig::{neighbourhood, plan as coordinator_plan};
use koala_dataflow::{
    Dataflow, JobGraph, KeyedEvent, KeyedEvents, KeyedEventsConfig, SourceOptions, ValueState,
};
use koala_protocol::engine::assignment;
use koala_protocol::plan::{Target, plan};
use koala_protocol::{Deployment, Protocol, ReconfigRequest, RuntimeOptions};
use koala_types::{OperatorId, TaskId, WorkerId};
use proptest::prelude::*;

/// events → keyed count → sink: the simulated job's keyed operator, with consumers.
fn graph() -> (JobGraph, OperatorId) {
    let df = Dataflow::new();
    let config = KeyedEventsConfig { key_space: 3, records: Some(30), ..Default::default() };
    KeyedEvents::source(&df, "events", SourceOptions::default(), config)
        .key_by(|e: &KeyedEvent| e.key)
        .stateful_map("count", |key: &u64, _e: KeyedEvent, n: &mut ValueState<u64>| {
            (*key, n.update(|n| *n += 1))
        })
        .sink_json_lines("counts");
    let graph = df.build().expect("graph");
    let op = graph.by_name("count").expect("count").id;
    (graph, op)
}

/// A deployment drawn by [`deployment`], with the engine's retired tasks of the operator.
#[derive(Debug, Clone)]
struct Drawn {
    protocol: Protocol,
    num_buckets: u16,
    workers: u32,
    /// The operator's live tasks, in deployment order (a migration leaves them unsorted).
    live: Vec<u32>,
    /// Bucket → index into `live`, after every live task got one bucket.
    extra_owners: Vec<usize>,
    /// Worker of each live task, of each retired task, of the sink's tasks.
    workers_of: Vec<u32>,
    retired: BTreeSet<u32>,
    /// Which live tasks finished (their inputs ended).
    finished: Vec<bool>,
    sink_tasks: u32,
}

fn drawn() -> impl Strategy<Value = Drawn> {
    (
        prop::sample::select(vec![
            Protocol::Koala,
            Protocol::StopAndRestart,
            Protocol::Remote,
            Protocol::Drrs,
        ]),
        prop::sample::select(vec![4u16, 8, 16]),
        1u32..4,
        Just((0u32..10).collect::<Vec<_>>()).prop_shuffle(),
        1usize..5,
        prop::collection::vec(any::<prop::sample::Index>(), 16),
        prop::collection::vec(0u32..3, 20),
        prop::collection::vec(any::<bool>(), 10),
        prop::collection::vec(prop::bool::weighted(0.15), 10),
        1u32..3,
    )
        .prop_map(
            |(protocol, num_buckets, workers, indices, n, owners, workers_of, retire, finish, sink)| {
                let n = n.min(usize::from(num_buckets));
                let live: Vec<u32> = indices[..n].to_vec();
                let retired =
                    indices[n..].iter().zip(&retire).filter(|(_, r)| **r).map(|(i, _)| *i).collect();
                Drawn {
                    protocol,
                    num_buckets,
                    workers,
                    extra_owners: owners.iter().map(|o| o.index(n)).collect(),
                    workers_of: workers_of.iter().map(|w| w % workers).collect(),
                    live,
                    retired,
                    finished: finish,
                    sink_tasks: sink,
                }
            },
        )
}

fn deployment(graph: &JobGraph, op: OperatorId, x: &Drawn) -> Deployment {
    let nb = usize::from(x.num_buckets);
    let routing: Vec<u32> =
        (0..nb).map(|b| if b < x.live.len() { x.live[b] } else { x.live[x.extra_owners[b]] }).collect();
    let mut d = Deployment {
        run: "t".into(),
        query: String::new(),
        query_params: String::new(),
        workers: (0..x.workers).map(|w| (WorkerId(w), format!("127.0.0.1:{w}"))).collect(),
        placement: BTreeMap::new(),
        tasks: BTreeMap::new(),
        epoch: 3,
        routing: BTreeMap::from([(op, routing)]),
        num_buckets: x.num_buckets,
        protocol: x.protocol,
        extra_keys: 0,
        drain_keys_per_sec: 0,
        finished: Default::default(),
        options: RuntimeOptions {
            batch_records: 1,
            linger_ms: 0,
            channel_capacity: 1,
            sink_dir: ".".into(),
            capacity: Default::default(),
            max_queued_records: 1,
            checkpoint: Default::default(),
        },
    };
    let mut w = x.workers_of.iter().cycle().map(|w| WorkerId(*w));
    for o in &graph.operators {
        let tasks: Vec<u32> = if o.id == op {
            x.live.clone()
        } else if o.is_source() {
            vec![0, 1]
        } else {
            (0..x.sink_tasks).collect()
        };
        let retired: Vec<u32> = if o.id == op { x.retired.iter().copied().collect() } else { Vec::new() };
        for &i in tasks.iter().chain(&retired) {
            d.placement.insert(TaskId::new(o.id, i), w.next().unwrap_or(WorkerId(0)));
        }
        d.tasks.insert(o.id, tasks);
    }
    for (&i, _) in x.live.iter().zip(&x.finished).filter(|(_, f)| **f) {
        d.finished.insert(TaskId::new(op, i));
    }
    d
}

fn request(live: Vec<u32>, num_buckets: u16) -> impl Strategy<Value = ReconfigRequest> {
    let task = prop::sample::select(live.clone());
    let bucket_sets = prop::collection::vec(
        (prop::collection::btree_set(0..num_buckets, 1..4), prop::sample::select(live)),
        1..3,
    );
    prop_oneof![
        (1u32..7).prop_map(|parallelism| ReconfigRequest::Rescale { operator: "count".into(), parallelism }),
        bucket_sets.prop_map(|moves| ReconfigRequest::Rebalance {
            operator: "count".into(),
            moves: moves.into_iter().map(|(b, t)| (b.into_iter().collect(), t)).collect(),
        }),
        (task, 0u32..3).prop_map(|(task, worker)| ReconfigRequest::Migrate {
            operator: "count".into(),
            task,
            worker
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn coordinator_and_simulator_plan_alike(
        (x, req) in drawn().prop_flat_map(|x| {
            let r = request(x.live.clone(), x.num_buckets);
            (Just(x), r)
        }),
        policy in prop::sample::select(vec![PolicyName::Consistent, PolicyName::Uniform, PolicyName::Interleaved]),
    ) {
        let (graph, op) = graph();
        let current = deployment(&graph, op, &x);
        let retired = BTreeMap::from([(op, x.retired.clone())]);
        let next_index = BTreeMap::from([(op, 10)]);
        let epoch = current.epoch + 1;
        // Requests the coordinator rejects (same parallelism, same worker, ...) plan nothing.
        let Ok(planned) = coordinator_plan(&req, &current, &graph, policy, epoch, &next_index, &retired) else {
            return Ok(());
        };
        let new = &planned.plan.deployment;
        let live_after: BTreeSet<u32> = new.tasks[&op].iter().copied().collect();
        let owners: BTreeSet<u32> = new.routing[&op].iter().copied().collect();
        // The simulator requests assignments only: a live task owning no bucket is not one.
        prop_assume!(live_after == owners);

        let mut target = Target::from_assignment(&current, op, &assignment(new, op), WorkerId(0));
        // Where created tasks run is the placement policy's choice, not the plan's.
        for (i, w) in target.placement.iter_mut() {
            *w = new.placement[&TaskId::new(op, *i)];
        }
        let simulated = plan(&current, op, target, &x.retired, epoch, &neighbourhood(&graph, op))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&simulated, &planned);

        // And what both agree on is the rule: created and cancelled are the difference of the
        // live sets, every unreleased cancelled task takes part, nobody waits for a finished one.
        let before: BTreeSet<u32> = x.live.iter().copied().collect();
        let p = &planned.plan;
        prop_assert_eq!(p.created.clone(), live_after.difference(&before).copied().collect::<Vec<_>>());
        prop_assert_eq!(p.cancelled.clone(), before.difference(&live_after).copied().collect::<Vec<_>>());
        let retired_now: Vec<u32> = x.retired.union(&before.difference(&live_after).copied().collect()).copied().collect();
        prop_assert_eq!(p.retired.clone(), retired_now);
        let unfinished: Vec<TaskId> =
            x.live.iter().map(|&i| TaskId::new(op, i)).filter(|t| !current.finished.contains(t)).collect();
        prop_assert_eq!(planned.participants.old_targets.clone(), unfinished);
        prop_assert_eq!(planned.participants.consumers.len(), x.sink_tasks as usize);
        prop_assert_eq!(p.upstreams.len(), 2);
        prop_assert!(p.created.iter().all(|i| new.placement.contains_key(&TaskId::new(op, *i))));
    }
}
