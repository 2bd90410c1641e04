//! Turning a reconfiguration request into a plan: validating it against the job graph and the
//! current deployment, and letting the partition policy and placement choose the operator's new
//! tasks, routing and workers (docs/protocols.md §2). The plan itself and who takes part in it
//! follow from that choice in `koala_protocol::plan`, the code the simulator checks; the phases
//! are driven by the sans-IO cores in `koala_protocol` (`phases`, `koala`).

use std::collections::{BTreeMap, BTreeSet};

use koala_dataflow::JobGraph;
use koala_protocol::plan::{Edge, Neighbourhood, PlanError, Planned, Target};
use koala_protocol::{Deployment, ReconfigRequest};
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

/// The job graph around `op`, as `koala_protocol::plan` needs it.
pub fn neighbourhood(graph: &JobGraph, op: OperatorId) -> Neighbourhood {
    let edge = |from: OperatorId, consumer: OperatorId, input: usize| {
        Edge::new(from, consumer, graph.is_forward_stateless(consumer, input))
    };
    let spec = graph.operator(op);
    Neighbourhood {
        stateful: spec.is_some_and(|s| s.is_stateful()),
        inputs: spec
            .into_iter()
            .flat_map(|s| s.inputs.iter().enumerate())
            .map(|(i, input)| edge(input.from, op, i))
            .collect(),
        outputs: graph.consumers(op).into_iter().map(|(c, i)| edge(op, c, i)).collect(),
    }
}

/// Validates a request against the current deployment and computes its plan and participants.
/// `retired` are the engine's retired tasks per operator. Errors name what is wrong and how to
/// fix it; nothing changes on error.
pub fn plan(
    req: &ReconfigRequest,
    current: &Deployment,
    graph: &JobGraph,
    policy: PolicyName,
    epoch: Epoch,
    next_index: &BTreeMap<OperatorId, u32>,
    retired: &BTreeMap<OperatorId, BTreeSet<u32>>,
) -> Result<Planned, String> {
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
    let job = neighbourhood(graph, op);
    let explain = |e: PlanError| match e {
        PlanError::OneToOne { .. } => format!(
            "operator: {name:?} is connected one-to-one (forward edge, equal parallelism) to a neighbour; \
             reconfigure that neighbour together or give the two operators different parallelism"
        ),
        e => format!("operator: {name:?}: {e}"),
    };
    koala_protocol::plan::check_edges(current, &job).map_err(explain)?;
    let target = choose(req, current, spec, policy, next_index)?;
    let retired = retired.get(&op).cloned().unwrap_or_default();
    let planned = koala_protocol::plan::plan(current, op, target, &retired, epoch, &job).map_err(explain)?;
    if matches!(req, ReconfigRequest::Rebalance { .. }) && planned.plan.moves.is_empty() {
        return Err("moves: every bucket already belongs to the task given; nothing would move".into());
    }
    Ok(planned)
}

/// The policy's choice for `req`: the operator's tasks, routing and the workers of created tasks.
fn choose(
    req: &ReconfigRequest,
    current: &Deployment,
    spec: &koala_dataflow::OperatorSpec,
    policy: PolicyName,
    next_index: &BTreeMap<OperatorId, u32>,
) -> Result<Target, String> {
    let (name, op) = (spec.name.as_str(), spec.id);
    let old_live = live(current, op);
    let nb = current.num_buckets;
    let mut tasks: BTreeSet<u32> = old_live.iter().copied().collect();
    let mut routing = current.routing.get(&op).cloned();
    let mut placement = BTreeMap::new();
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
            if p > now {
                // Each new task goes to the least loaded worker, counting the ones placed before it.
                let mut placed = current.clone();
                for _ in now..p {
                    let worker = least_loaded(&placed, &worker_ids);
                    placed.placement.insert(TaskId::new(op, next), worker);
                    placement.insert(next, worker);
                    tasks.insert(next);
                    next += 1;
                }
            } else {
                // The highest task indices go.
                tasks = tasks.into_iter().take(p as usize).collect();
            }
            if spec.is_stateful() {
                routing = Some(assign(policy, nb, &tasks.iter().copied().collect::<Vec<_>>()));
            }
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
            let table = routing.as_mut().ok_or("operator has no routing table")?;
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
            // A new task on `to` takes over the task's buckets and its place.
            placement.insert(next, to);
            tasks.remove(task);
            tasks.insert(next);
            for t in routing.iter_mut().flatten().filter(|t| **t == *task) {
                *t = next;
            }
        }
    }
    Ok(Target { tasks, routing, placement })
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

    fn plan_of(req: &ReconfigRequest, d: &Deployment, graph: &JobGraph) -> Result<Planned, String> {
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
