//! Turning the tasks a partition policy chose for one operator into a reconfiguration plan and
//! the tasks that take part in it (docs/protocols.md §2). The coordinator validates a request
//! against the job graph, lets its policy choose the new tasks, routing and placement, and calls
//! [`plan`]; the simulator turns its requested bucket assignments into the same [`Target`]
//! ([`Target::from_assignment`]) and calls the same function, so what it checks is what runs.
//!
//! ```
//! use std::collections::{BTreeMap, BTreeSet};
//! use koala_protocol::plan::{Edge, Neighbourhood, Target, plan};
//! use koala_protocol::{Deployment, Protocol};
//! use koala_types::{OperatorId, TaskId, WorkerId};
//!
//! let (up, op) = (OperatorId(0), OperatorId(1));
//! # let options = koala_protocol::RuntimeOptions { batch_records: 1, linger_ms: 0, channel_capacity: 1,
//! #     sink_dir: ".".into(), capacity: Default::default(), max_queued_records: 1, checkpoint: Default::default() };
//! let current = Deployment {
//!     tasks: BTreeMap::from([(up, vec![0]), (op, vec![0])]),
//!     routing: BTreeMap::from([(op, vec![0, 0])]),
//!     num_buckets: 2,
//! #   run: "r".into(), query: String::new(), query_params: String::new(), workers: BTreeMap::new(),
//! #   placement: BTreeMap::new(), epoch: 0, options, protocol: Protocol::Koala, extra_keys: 0,
//! #   drain_keys_per_sec: 0, finished: Default::default(),
//!     // …
//! };
//! let job = Neighbourhood { stateful: true, inputs: vec![Edge::new(up, op, false)], outputs: vec![] };
//! // Scale out to two tasks: task 1 takes bucket 1.
//! let target = Target {
//!     tasks: BTreeSet::from([0, 1]),
//!     routing: Some(vec![0, 1]),
//!     placement: BTreeMap::from([(1, WorkerId(0))]),
//! };
//! let planned = plan(&current, op, target, &BTreeSet::new(), 1, &job).unwrap();
//! assert_eq!(planned.plan.created, vec![1]);
//! assert_eq!(planned.plan.upstreams, vec![TaskId::new(up, 0)]);
//! assert_eq!(planned.participants.old_targets, vec![TaskId::new(op, 0)]);
//! ```

use std::collections::{BTreeMap, BTreeSet};

use koala_types::{Epoch, InputChannel, OperatorId, TaskId, WorkerId};

use crate::control::{Deployment, ReconfigPlan};
use crate::engine::{assignment, upstream_tasks};
use crate::moves::{AssignmentMismatch, moves_between};
use crate::phases::Participants;

pub use crate::common::edge::Edge;

/// Whether `edge` connects task i to task i only in `d`: a forward edge between two stateless
/// operators whose live tasks are the same. Edges touching a stateful operator never are, so
/// stateful operators can always be reconfigured. The runtime opens its channels by this rule and
/// [`plan`] refuses to reconfigure a stateless operator one such edge touches.
pub fn is_one_to_one(d: &Deployment, edge: &Edge) -> bool {
    edge.forward_stateless && d.live(edge.from) == d.live(edge.to)
}

/// The job graph around the reconfigured operator: what [`plan`] needs of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbourhood {
    /// Whether the operator holds keyed state.
    pub stateful: bool,
    /// Its inputs (a self-join's upstream appears once per input).
    pub inputs: Vec<Edge>,
    /// The inputs of other operators it feeds.
    pub outputs: Vec<Edge>,
}

/// What the partition policy chose for the reconfigured operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its live tasks afterwards. Tasks not live now are created, live ones left out cancelled.
    pub tasks: BTreeSet<u32>,
    /// Its routing table afterwards (bucket → task index); `None` keeps the current one (a
    /// stateless operator has none).
    pub routing: Option<Vec<u32>>,
    /// Where each created task runs.
    pub placement: BTreeMap<u32, WorkerId>,
}

impl Target {
    /// Keyed operator `operator` moving to `assignment` (bucket → task): its live tasks are those
    /// owning a bucket, and created ones run on `worker` (the simulator's requests).
    pub fn from_assignment(
        current: &Deployment,
        operator: OperatorId,
        assignment: &[TaskId],
        worker: WorkerId,
    ) -> Self {
        let tasks: BTreeSet<u32> = assignment.iter().map(|t| t.index).collect();
        let old = current.live(operator);
        let placement = tasks.iter().filter(|i| !old.contains(i)).map(|&i| (i, worker)).collect();
        Self { tasks, routing: Some(assignment.iter().map(|t| t.index).collect()), placement }
    }
}

/// A plan and who takes part in it besides what it names.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// The plan every worker receives.
    pub plan: ReconfigPlan,
    /// Who else the engine waits for.
    pub participants: Participants,
}

/// Why a target cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A one-to-one edge touches the (stateless) operator.
    #[error("the edge {} → {} is one-to-one (forward edge, equal tasks)", edge.from, edge.to)]
    OneToOne {
        /// The edge.
        edge: Edge,
    },
    /// No task would run the operator.
    #[error("no task would run the operator")]
    NoTasks,
    /// A created task has no placement.
    #[error("created task {0} has no worker")]
    NotPlaced(u32),
    /// The routing table names a task that is not live afterwards.
    #[error("the routing table names task {0}, which is not live")]
    NotLive(u32),
    /// The routing table has another number of buckets.
    #[error(transparent)]
    Buckets(#[from] AssignmentMismatch),
}

/// Refuses to reconfigure a stateless operator a one-to-one edge touches in `current`: its task i
/// would have to change together with its neighbour's task i.
pub fn check_edges(current: &Deployment, job: &Neighbourhood) -> Result<(), PlanError> {
    match job.inputs.iter().chain(&job.outputs).find(|e| !job.stateful && is_one_to_one(current, e)) {
        Some(e) => Err(PlanError::OneToOne { edge: *e }),
        None => Ok(()),
    }
}

/// The plan that moves `operator` from `current` to `target` at `epoch`, and its participants.
///
/// `retired` are the engine's cancelled tasks of the operator not yet released (Koala keeps them
/// serving state). The plan's `retired` adds this plan's cancelled tasks under every protocol:
/// the engine waits for `Prepare` from the live, cancelled and retired tasks alike, and outside
/// Koala `retired` is otherwise empty, so the plan does not depend on the protocol. Cancelled
/// tasks keep their placement. The live tasks keep their order; a created task takes the place
/// of a cancelled one (ascending), the rest are appended.
pub fn plan(
    current: &Deployment,
    operator: OperatorId,
    target: Target,
    retired: &BTreeSet<u32>,
    epoch: Epoch,
    job: &Neighbourhood,
) -> Result<Planned, PlanError> {
    check_edges(current, job)?;
    if target.tasks.is_empty() {
        return Err(PlanError::NoTasks);
    }
    let old = current.live(operator);
    let created: Vec<u32> = target.tasks.iter().copied().filter(|i| !old.contains(i)).collect();
    let cancelled: Vec<u32> = {
        let mut c: Vec<u32> = old.iter().copied().filter(|i| !target.tasks.contains(i)).collect();
        c.sort_unstable();
        c
    };
    let mut d = current.clone();
    d.epoch = epoch;
    let mut incoming = created.iter().copied();
    let mut tasks: Vec<u32> = old
        .iter()
        .filter_map(|i| if target.tasks.contains(i) { Some(*i) } else { incoming.next() })
        .collect();
    tasks.extend(incoming);
    for &i in &created {
        let worker = target.placement.get(&i).ok_or(PlanError::NotPlaced(i))?;
        d.placement.insert(TaskId::new(operator, i), *worker);
    }
    d.tasks.insert(operator, tasks);
    if let Some(routing) = target.routing {
        if let Some(t) = routing.iter().find(|t| !target.tasks.contains(t)) {
            return Err(PlanError::NotLive(*t));
        }
        d.routing.insert(operator, routing);
    }
    let moves = moves_between(&assignment(current, operator), &assignment(&d, operator))?;
    let mut retired: Vec<u32> = retired.iter().chain(&cancelled).copied().collect();
    retired.sort_unstable();
    retired.dedup();
    let participants = Participants {
        stateful: job.stateful,
        // A finished task (every input ended) moves nothing and is gone: nobody waits for it.
        old_targets: old
            .iter()
            .map(|&i| TaskId::new(operator, i))
            .filter(|t| !current.finished.contains(t))
            .collect(),
        consumers: consumers(&d, job),
    };
    let plan = ReconfigPlan {
        epoch,
        operator,
        upstreams: upstream_tasks(current, job.inputs.iter().map(|e| e.from)),
        deployment: d,
        moves,
        created,
        cancelled,
        retired,
    };
    Ok(Planned { plan, participants })
}

/// The live, unfinished tasks of the operators fed by the job's outputs in `d` (each once): they
/// open channels to the new tasks.
fn consumers(d: &Deployment, job: &Neighbourhood) -> Vec<TaskId> {
    let mut ops: Vec<OperatorId> = Vec::new();
    for e in &job.outputs {
        if !ops.contains(&e.to) {
            ops.push(e.to);
        }
    }
    ops.into_iter()
        .flat_map(|c| d.live(c).iter().map(move |&i| TaskId::new(c, i)))
        .filter(|t| !d.finished.contains(t))
        .collect()
}

/// What consumer task `consumer` adds at `plan`'s `Prepare`, where `edge` (the reconfigured
/// operator → the consumer's operator) is its input `input`: the channels from the created tasks
/// it receives on afterwards (by [`is_one_to_one`], only from the created task of its own index),
/// or `None` if it is not a live, unfinished task of the plan's deployment and is told nothing.
/// A consumer told `Some` acks `Prepared` once it added them, even none. The runtime's workers
/// send this as `AddInputs`; the simulator's consumers follow it too.
pub fn consumer_inputs(
    plan: &ReconfigPlan,
    edge: &Edge,
    input: usize,
    consumer: TaskId,
) -> Option<Vec<InputChannel>> {
    let d = &plan.deployment;
    if consumer.operator != edge.to
        || !d.live(edge.to).contains(&consumer.index)
        || d.finished.contains(&consumer)
    {
        return None;
    }
    let one_to_one = is_one_to_one(d, edge);
    let channels = plan
        .created
        .iter()
        .filter(|&&i| !one_to_one || i == consumer.index)
        .map(|&i| TaskId::new(plan.operator, i))
        .filter(|from| !d.finished.contains(from))
        .map(|from| InputChannel { input, from })
        .collect();
    Some(channels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Protocol;

    const UP: OperatorId = OperatorId(0);
    const OP: OperatorId = OperatorId(1);
    const DOWN: OperatorId = OperatorId(2);

    fn t(i: u32) -> TaskId {
        TaskId::new(OP, i)
    }

    /// `OP` on tasks 3, 1, 2 (a migration left them unsorted) between one upstream and one
    /// downstream task.
    fn current(stateful: bool) -> Deployment {
        let tasks = BTreeMap::from([(UP, vec![0]), (OP, vec![3, 1, 2]), (DOWN, vec![0])]);
        let routing = if stateful { BTreeMap::from([(OP, vec![3, 1, 2, 2])]) } else { BTreeMap::new() };
        Deployment::for_tests(tasks, routing, 4, Protocol::Koala)
    }

    fn job(stateful: bool, forward: bool) -> Neighbourhood {
        Neighbourhood {
            stateful,
            inputs: vec![Edge::new(UP, OP, forward)],
            outputs: vec![Edge::new(OP, DOWN, forward)],
        }
    }

    fn target(tasks: &[u32], routing: Option<Vec<u32>>, created: &[u32]) -> Target {
        Target {
            tasks: tasks.iter().copied().collect(),
            routing,
            placement: created.iter().map(|&i| (i, WorkerId(1))).collect(),
        }
    }

    /// A migration's new task takes the old one's place; a scale-in keeps the others' order.
    #[test]
    fn created_tasks_take_the_cancelled_tasks_places() {
        let d = current(true);
        let migrate = target(&[1, 2, 4], Some(vec![4, 1, 2, 2]), &[4]);
        let p = plan(&d, OP, migrate, &BTreeSet::new(), 1, &job(true, false)).expect("plans").plan;
        assert_eq!(p.deployment.tasks[&OP], vec![4, 1, 2]);
        assert_eq!((p.created.clone(), p.cancelled.clone(), p.retired.clone()), (vec![4], vec![3], vec![3]));
        assert_eq!(p.deployment.placement.get(&t(4)), Some(&WorkerId(1)));
        assert_eq!(p.moves, BTreeMap::from([((t(3), t(4)), vec![0])]));
        let scale_in = target(&[1, 3], Some(vec![3, 1, 1, 3]), &[]);
        let retired = BTreeSet::from([7]);
        let p = plan(&d, OP, scale_in, &retired, 1, &job(true, false)).expect("plans").plan;
        assert_eq!(p.deployment.tasks[&OP], vec![3, 1]);
        assert_eq!((p.cancelled.clone(), p.retired.clone()), (vec![2], vec![2, 7]));
    }

    /// A stateless operator joined one-to-one to a neighbour is refused; with different tasks on
    /// the two ends, or once stateful, it plans.
    #[test]
    fn one_to_one_edges_refuse_a_stateless_operator() {
        let mut d = current(false);
        d.tasks.insert(DOWN, vec![3, 1, 2]);
        let scale_out = || target(&[1, 2, 3, 4], None, &[4]);
        let refused = plan(&d, OP, scale_out(), &BTreeSet::new(), 1, &job(false, true));
        assert_eq!(refused, Err(PlanError::OneToOne { edge: Edge::new(OP, DOWN, true) }));
        d.tasks.insert(DOWN, vec![0]);
        let planned = plan(&d, OP, scale_out(), &BTreeSet::new(), 1, &job(false, true)).expect("plans");
        assert_eq!(planned.participants.consumers, vec![TaskId::new(DOWN, 0)]);
        assert!(!planned.participants.stateful);
    }

    /// A consumer adds the created tasks' channels, from its own index only over a one-to-one
    /// edge; a consumer that is not live or finished is told nothing.
    #[test]
    fn consumers_add_the_created_tasks_channels() {
        let d = current(true);
        let scale_out = target(&[1, 2, 3, 4], Some(vec![4, 1, 2, 3]), &[4]);
        let p = plan(&d, OP, scale_out, &BTreeSet::new(), 1, &job(true, false)).expect("plans").plan;
        let edge = Edge::new(OP, DOWN, false);
        let from_4 = InputChannel { input: 1, from: t(4) };
        assert_eq!(consumer_inputs(&p, &edge, 1, TaskId::new(DOWN, 0)), Some(vec![from_4]));
        assert_eq!(consumer_inputs(&p, &edge, 1, TaskId::new(DOWN, 1)), None);
        let mut finished = p.clone();
        finished.deployment.finished.insert(TaskId::new(DOWN, 0));
        assert_eq!(consumer_inputs(&finished, &edge, 1, TaskId::new(DOWN, 0)), None);
        // Stateless on both ends with equal tasks: task i hears only from task i.
        let mut d = current(false);
        d.tasks.insert(DOWN, vec![1, 2, 3, 4]);
        d.tasks.insert(OP, vec![1, 2, 3]);
        let mut one_to_one =
            plan(&d, OP, target(&[1, 2, 3, 4], None, &[4]), &BTreeSet::new(), 1, &job(false, false))
                .expect("plans")
                .plan;
        let edge = Edge::new(OP, DOWN, true);
        assert_eq!(consumer_inputs(&one_to_one, &edge, 0, TaskId::new(DOWN, 2)), Some(vec![]));
        let from_4 = InputChannel { input: 0, from: t(4) };
        assert_eq!(consumer_inputs(&one_to_one, &edge, 0, TaskId::new(DOWN, 4)), Some(vec![from_4]));
        one_to_one.deployment.tasks.insert(DOWN, vec![1, 2, 3, 4, 5]);
        assert_eq!(consumer_inputs(&one_to_one, &edge, 0, TaskId::new(DOWN, 2)), Some(vec![from_4]));
    }

    /// A created task needs a worker, and the routing table may name only live tasks.
    #[test]
    fn targets_that_cannot_run_are_refused() {
        let d = current(true);
        let unplaced = target(&[1, 2, 3, 4], Some(vec![4, 1, 2, 3]), &[]);
        assert_eq!(
            plan(&d, OP, unplaced, &BTreeSet::new(), 1, &job(true, false)),
            Err(PlanError::NotPlaced(4))
        );
        let dangling = target(&[1, 2], Some(vec![3, 1, 2, 2]), &[]);
        assert_eq!(
            plan(&d, OP, dangling, &BTreeSet::new(), 1, &job(true, false)),
            Err(PlanError::NotLive(3))
        );
    }
}
