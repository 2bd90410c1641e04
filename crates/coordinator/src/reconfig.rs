//! Turning a reconfiguration request into a plan (new deployment + the policy's `moves`) and
//! naming who takes part, from the job graph (docs/protocols.md §2). The phases themselves are
//! driven by the sans-IO cores in `koala_protocol` (`phases`, `koala`).

use std::collections::{BTreeMap, BTreeSet};

use koala_dataflow::JobGraph;
use koala_protocol::engine::assignment;
use koala_protocol::phases::Participants;
use koala_protocol::{Deployment, ReconfigPlan, ReconfigRequest, moves_between};
use koala_types::{Epoch, OperatorId, TaskId, WorkerId};

use crate::config::PolicyName;
use crate::partition::assign;
use crate::placement::least_loaded;

/// What kind of change a plan makes, for metrics and progress lines.
pub fn kind_name(old: usize, new: usize, req: &ReconfigRequest) -> &'static str {
    match req {
        ReconfigRequest::Rescale { .. } if new > old => "scale_out",
        ReconfigRequest::Rescale { .. } => "scale_in",
        ReconfigRequest::Rebalance { .. } => "rebalance",
        ReconfigRequest::Migrate { .. } => "migrate",
    }
}

fn live(d: &Deployment, op: OperatorId) -> Vec<u32> {
    d.tasks.get(&op).cloned().unwrap_or_default()
}

/// The live tasks of `op` in `d` that have not finished.
fn running(d: &Deployment, op: OperatorId) -> Vec<u32> {
    live(d, op).into_iter().filter(|&i| !d.finished.contains(&TaskId::new(op, i))).collect()
}

/// Validates a request against the current deployment and computes its plan. Errors name what
/// is wrong and how to fix it; nothing changes on error.
pub fn plan(
    req: &ReconfigRequest,
    current: &Deployment,
    graph: &JobGraph,
    policy: PolicyName,
    epoch: Epoch,
    next_index: &BTreeMap<OperatorId, u32>,
    retired: &BTreeMap<OperatorId, BTreeSet<u32>>,
) -> Result<ReconfigPlan, String> {
    let name = req.operator();
    let names: Vec<&str> = graph.operators.iter().map(|o| o.name.as_str()).collect();
    let spec = graph.by_name(name).ok_or_else(|| {
        format!("operator: no operator {name:?}; this job's operators are {}", names.join(", "))
    })?;
    if spec.is_source() {
        return Err(format!("operator: {name:?} is a source; sources cannot be reconfigured yet"));
    }
    if matches!(spec.kind, koala_dataflow::OperatorKind::Sink { .. }) {
        return Err(format!("operator: {name:?} is a sink; sinks cannot be reconfigured yet"));
    }
    let op = spec.id;
    if !spec.is_stateful() {
        let one_to_one = |consumer: OperatorId, input: usize, from: OperatorId| {
            let c = graph.operator(consumer);
            let u = graph.operator(from);
            matches!(
                c.and_then(|c| c.inputs.get(input)).map(|i| &i.partitioning),
                Some(koala_dataflow::Partitioning::Forward)
            ) && !c.is_some_and(|c| c.is_stateful())
                && !u.is_some_and(|u| u.is_stateful())
                && live(current, from) == live(current, consumer)
        };
        let touches = spec.inputs.iter().enumerate().any(|(i, input)| one_to_one(op, i, input.from))
            || graph.consumers(op).into_iter().any(|(c, i)| one_to_one(c, i, op));
        if touches {
            return Err(format!(
                "operator: {name:?} is connected one-to-one (forward edge, equal parallelism) to a neighbour; \
                 reconfigure that neighbour together or give the two operators different parallelism"
            ));
        }
    }
    let old_live = live(current, op);
    let nb = current.num_buckets;
    let mut d = current.clone();
    d.epoch = epoch;
    let mut created = Vec::new();
    let mut cancelled = Vec::new();
    let worker_ids: Vec<WorkerId> = current.workers.keys().copied().collect();
    let mut next = next_index.get(&op).copied().unwrap_or(0);
    match req {
        ReconfigRequest::Rescale { parallelism, .. } => {
            let p = *parallelism;
            if p == 0 {
                return Err("parallelism: 0 tasks cannot run an operator; use 1 or more".into());
            }
            if spec.is_stateful() && p > u32::from(nb) {
                return Err(format!(
                    "parallelism: {p} tasks exceed num_buckets = {nb}; a task would own no bucket"
                ));
            }
            let now = old_live.len() as u32;
            if p == now {
                return Err(format!("parallelism: {name:?} already has {p} tasks"));
            }
            let mut new_live = old_live.clone();
            if p > now {
                for _ in now..p {
                    let worker = least_loaded(&d, &worker_ids);
                    let task = TaskId::new(op, next);
                    d.placement.insert(task, worker);
                    created.push(next);
                    new_live.push(next);
                    next += 1;
                }
            } else {
                new_live.sort_unstable();
                cancelled = new_live.split_off(p as usize);
            }
            d.tasks.insert(op, new_live);
        }
        ReconfigRequest::Rebalance { moves: wanted, .. } => {
            if !spec.is_stateful() {
                return Err(format!(
                    "operator: {name:?} holds no keyed state; rebalance moves buckets of stateful operators"
                ));
            }
            if wanted.is_empty() {
                return Err("moves: give at least one `buckets:task` move".into());
            }
            let running = running(current, op);
            let table = d.routing.get_mut(&op).ok_or("operator has no routing table")?;
            for (buckets, to) in wanted {
                if !old_live.contains(to) {
                    return Err(format!(
                        "moves: task {to} of {name:?} does not exist; live tasks are {old_live:?}"
                    ));
                }
                // Its inputs ended and it exited: no upstream has a channel to it any more, so
                // nothing could route its buckets' records there (the epoch would wait for ever).
                if current.finished.contains(&TaskId::new(op, *to)) {
                    return Err(format!(
                        "moves: task {to} of {name:?} has finished (its inputs ended and it exited) and can take no \
                         buckets; give them to a running task: {running:?}"
                    ));
                }
                for b in buckets {
                    let slot = table
                        .get_mut(usize::from(*b))
                        .ok_or_else(|| format!("moves: bucket {b} is out of range; buckets are 0..{nb}"))?;
                    *slot = *to;
                }
            }
        }
        ReconfigRequest::Migrate { task, worker, .. } => {
            if !old_live.contains(task) {
                return Err(format!("task: {name:?} has no task {task}; live tasks are {old_live:?}"));
            }
            if current.finished.contains(&TaskId::new(op, *task)) {
                return Err(format!(
                    "task: task {task} of {name:?} has finished (its inputs ended and it exited); \
                     there is nothing to migrate; running tasks are {:?}",
                    running(current, op)
                ));
            }
            let to = WorkerId(*worker);
            if !current.workers.contains_key(&to) {
                return Err(format!(
                    "worker: no worker {worker}; workers are {}",
                    worker_ids.iter().map(|w| w.0.to_string()).collect::<Vec<_>>().join(", ")
                ));
            }
            if current.placement.get(&TaskId::new(op, *task)) == Some(&to) {
                return Err(format!("worker: task {task} of {name:?} already runs on worker {worker}"));
            }
            d.placement.insert(TaskId::new(op, next), to);
            created.push(next);
            cancelled.push(*task);
            let new_live: Vec<u32> = old_live.iter().map(|t| if t == task { next } else { *t }).collect();
            d.tasks.insert(op, new_live);
            if let Some(table) = d.routing.get_mut(&op) {
                for t in table.iter_mut().filter(|t| **t == *task) {
                    *t = next;
                }
            }
        }
    }
    if spec.is_stateful() && matches!(req, ReconfigRequest::Rescale { .. }) {
        d.routing.insert(op, assign(policy, nb, &live(&d, op)));
    }
    let bucket_moves =
        moves_between(&assignment(current, op), &assignment(&d, op)).map_err(|e| e.to_string())?;
    if matches!(req, ReconfigRequest::Rebalance { .. }) && bucket_moves.is_empty() {
        return Err("moves: every bucket already belongs to the task given; nothing would move".into());
    }
    // Cancelled tasks keep their placement: under Koala they serve state until released.
    let mut retired_now: Vec<u32> =
        retired.get(&op).into_iter().flatten().copied().chain(cancelled.iter().copied()).collect();
    retired_now.sort_unstable();
    retired_now.dedup();
    Ok(ReconfigPlan {
        epoch,
        operator: op,
        deployment: d,
        moves: bucket_moves,
        upstreams: upstream_tasks(current, graph, op),
        created,
        cancelled,
        retired: retired_now,
    })
}

/// Who takes part in `plan` besides what the plan names, from the job graph.
pub fn participants(plan: &ReconfigPlan, current: &Deployment, graph: &JobGraph) -> Participants {
    let op = plan.operator;
    let d = &plan.deployment;
    Participants {
        stateful: graph.operator(op).is_some_and(|o| o.is_stateful()),
        // A finished task (every input ended) moves nothing and is gone: nobody waits for it.
        old_targets: live(current, op)
            .into_iter()
            .map(|i| TaskId::new(op, i))
            .filter(|t| !current.finished.contains(t))
            .collect(),
        consumers: graph
            .consumers(op)
            .into_iter()
            .flat_map(|(c, _)| live(d, c).into_iter().map(move |i| TaskId::new(c, i)))
            .filter(|t| !d.finished.contains(t))
            .collect(),
    }
}

/// The live, unfinished tasks of every operator feeding `op` (a self-join's upstream counted
/// once): the tasks that switch routing in a reconfiguration of `op`.
pub fn upstream_tasks(d: &Deployment, graph: &JobGraph, op: OperatorId) -> Vec<TaskId> {
    let froms = graph.operator(op).into_iter().flat_map(|spec| spec.inputs.iter().map(|i| i.from));
    koala_protocol::engine::upstream_tasks(d, froms)
}

/// Every operator's upstream operators, as the reconfiguration engine needs them.
pub fn operator_inputs(graph: &JobGraph) -> BTreeMap<OperatorId, BTreeSet<OperatorId>> {
    graph.operators.iter().map(|o| (o.id, o.inputs.iter().map(|i| i.from).collect())).collect()
}

#[cfg(test)]
mod tests {
    use koala_dataflow::{Dataflow, KeyedEvent, KeyedEvents, KeyedEventsConfig, SourceOptions, ValueState};
    use koala_protocol::{Deployment, Protocol, RuntimeOptions};

    use super::*;

    /// A keyed count behind a source, its operator `count` on three tasks owning 4 buckets.
    fn job() -> (JobGraph, Deployment, OperatorId) {
        let df = Dataflow::new();
        let config = KeyedEventsConfig { key_space: 3, records: Some(30), ..Default::default() };
        KeyedEvents::source(&df, "events", SourceOptions::default(), config)
            .key_by(|e: &KeyedEvent| e.key)
            .stateful_map("count", |key: &u64, _e: KeyedEvent, n: &mut ValueState<u64>| {
                (
                    *key,
                    n.update(|n| {
                        *n += 1;
                        *n
                    }),
                )
            })
            .sink_json_lines("counts");
        let graph = df.build().expect("graph");
        let op = graph.by_name("count").expect("count").id;
        let mut d = Deployment {
            run: "t".into(),
            query: String::new(),
            query_params: String::new(),
            workers: BTreeMap::from([(WorkerId(0), "127.0.0.1:0".into())]),
            placement: BTreeMap::new(),
            tasks: BTreeMap::new(),
            epoch: 0,
            routing: BTreeMap::from([(op, vec![0, 1, 2, 2])]),
            num_buckets: 4,
            protocol: Protocol::Koala,
            extra_keys: 0,
            drain_keys_per_sec: 0,
            finished: Default::default(),
            options: RuntimeOptions {
                batch_records: 1,
                linger_ms: 0,
                channel_capacity: 1,
                sink_dir: ".".into(),
                capacity: Default::default(),
                max_queued_records: koala_protocol::koala::DEFAULT_MAX_QUEUED_RECORDS,
                checkpoint: Default::default(),
            },
        };
        for o in &graph.operators {
            let n = if o.id == op { 3 } else { 1 };
            d.tasks.insert(o.id, (0..n).collect());
            for i in 0..n {
                d.placement.insert(TaskId::new(o.id, i), WorkerId(0));
            }
        }
        (graph, d, op)
    }

    fn plan_of(req: &ReconfigRequest, d: &Deployment, graph: &JobGraph) -> Result<ReconfigPlan, String> {
        plan(req, d, graph, PolicyName::Uniform, 1, &BTreeMap::new(), &BTreeMap::new())
    }

    /// A rebalance may not give buckets to a task that finished (its inputs ended and it exited:
    /// no channel leads there any more), nor migrate it; the error names the task, why, and the
    /// running tasks. The same requests to a running task plan.
    #[test]
    fn buckets_never_go_to_a_finished_task() {
        let (graph, mut d, op) = job();
        let rebalance =
            |to: u32| ReconfigRequest::Rebalance { operator: "count".into(), moves: vec![(vec![3], to)] };
        let migrate = ReconfigRequest::Migrate { operator: "count".into(), task: 1, worker: 0 };
        assert!(plan_of(&rebalance(1), &d, &graph).is_ok());
        d.finished.insert(TaskId::new(op, 1));
        let error = plan_of(&rebalance(1), &d, &graph).expect_err("task 1 finished");
        assert!(error.starts_with("moves: task 1 of \"count\" has finished"), "{error}");
        assert!(error.ends_with("running task: [0, 2]"), "{error}");
        assert!(plan_of(&rebalance(0), &d, &graph).is_ok(), "task 0 still runs");
        let error = plan_of(&migrate, &d, &graph).expect_err("task 1 finished");
        assert!(error.contains("task 1 of \"count\" has finished"), "{error}");
    }
}
