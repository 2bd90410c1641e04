//! Turning a reconfiguration request into a plan (new deployment + the policy's `moves`), and
//! driving stop-and-restart through its phases by typed acks (docs/protocols.md §2, §7).
//!
//! Stop-and-restart phases: **Prepare** (new tasks start, target tasks learn what they send and
//! receive, consumers learn their new input channels) → **Drain** (upstream tasks send a marker
//! and pause; target tasks that saw every marker send moved buckets and their timers over peer
//! channels and delete them) → **Resume** (upstream tasks switch routing and resume; cancelled
//! tasks get end of stream and finish). Koala shares Prepare, then hands a keyed operator's
//! epoch to the protocol's coordinator core.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use koala_dataflow::JobGraph;
use koala_protocol::{
    CoordinatorMessage, Deployment, Moves, Protocol, ReconfigPlan, ReconfigRequest, TaskAck, moves_between,
};
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
            let table = d.routing.get_mut(&op).ok_or("operator has no routing table")?;
            for (buckets, to) in wanted {
                if !old_live.contains(to) {
                    return Err(format!(
                        "moves: task {to} of {name:?} does not exist; live tasks are {old_live:?}"
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
    let owners = |table: &Vec<u32>| table.iter().map(|i| TaskId::new(op, *i)).collect::<Vec<_>>();
    let bucket_moves = match (current.routing.get(&op), d.routing.get(&op)) {
        (Some(old), Some(new)) => moves_between(&owners(old), &owners(new)).map_err(|e| e.to_string())?,
        _ => Moves::new(),
    };
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

/// The acks a phase waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Expect {
    Prepared,
    Paused,
    StateSent,
    StateReceived,
    Resumed,
    Switched,
}

impl Expect {
    fn of(ack: &TaskAck) -> Option<Self> {
        Some(match ack {
            TaskAck::Prepared => Self::Prepared,
            TaskAck::Paused => Self::Paused,
            TaskAck::StateSent { .. } => Self::StateSent,
            TaskAck::StateReceived => Self::StateReceived,
            TaskAck::Resumed => Self::Resumed,
            TaskAck::Switched => Self::Switched,
            TaskAck::PeerReady
            | TaskAck::Done
            | TaskAck::LocationDrained { .. }
            | TaskAck::InputsEnded
            | TaskAck::ProtocolError { .. } => return None,
        })
    }
}

/// Where a running reconfiguration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for `Prepared`.
    Preparing,
    /// Stop-and-restart: waiting for `Paused`, `StateSent`, `StateReceived`.
    Draining,
    /// Stop-and-restart: waiting for `Resumed`.
    Resuming,
    /// Koala, stateless operator: waiting for `Switched` from upstreams and `StateSent` from the
    /// old tasks (they passed every marker).
    Switching,
    /// Koala, keyed operator: every task is prepared; the Koala coordinator core
    /// (`koala_protocol::koala::KoalaCoordinator`, the one the simulator checks) drives the
    /// epoch from here to its completion.
    Delegated,
    /// Finished.
    Complete,
}

/// Drives one reconfiguration from acks (no I/O: it returns what to send). Every protocol
/// starts with Prepare (new tasks start, every task that may be asked for state learns the new
/// placement, consumers open channels to new tasks). Stop-and-restart then runs Drain → Resume;
/// Koala hands a keyed operator's epoch to its coordinator core ([`Phase::Delegated`]) and
/// switches a stateless operator's upstreams with markers.
pub struct Reconfiguring {
    protocol: Protocol,
    /// Whether the operator holds keyed state (a stateless one only switches routing).
    stateful: bool,
    /// The plan.
    pub plan: ReconfigPlan,
    phase: Phase,
    waiting: HashSet<(TaskId, Expect)>,
    /// State bytes the target tasks reported sending.
    pub bytes_moved: u64,
    upstream: Vec<TaskId>,
    old_targets: Vec<TaskId>,
    receivers: Vec<TaskId>,
}

impl Reconfiguring {
    /// Starts: returns the driver and the message to broadcast (`Prepare`).
    pub fn start(plan: ReconfigPlan, current: &Deployment, graph: &JobGraph) -> (Self, CoordinatorMessage) {
        let protocol = plan.deployment.protocol;
        let op = plan.operator;
        let stateful = graph.operator(op).is_some_and(|o| o.is_stateful());
        let d = &plan.deployment;
        let upstream = plan.upstreams.clone();
        let old_targets: Vec<TaskId> = live(current, op).into_iter().map(|i| TaskId::new(op, i)).collect();
        let mut receivers: Vec<TaskId> = plan.moves.keys().map(|(_, to)| *to).collect();
        receivers.sort_unstable();
        receivers.dedup();
        let mut waiting = HashSet::new();
        let targets =
            live(d, op).into_iter().chain(plan.cancelled.iter().copied()).chain(plan.retired.iter().copied());
        let consumers = graph
            .consumers(op)
            .into_iter()
            .flat_map(|(c, _)| live(d, c).into_iter().map(move |i| TaskId::new(c, i)));
        for task in targets.map(|i| TaskId::new(op, i)).chain(consumers) {
            if !d.finished.contains(&task) {
                waiting.insert((task, Expect::Prepared));
            }
        }
        let msg = CoordinatorMessage::Prepare(Box::new(plan.clone()));
        let me = Self {
            protocol,
            stateful,
            plan,
            phase: Phase::Preparing,
            waiting,
            bytes_moved: 0,
            upstream,
            old_targets,
            receivers,
        };
        (me, msg)
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Applies an ack; returns the message to broadcast when a phase completes. An ack this
    /// reconfiguration does not wait for is an error (a protocol bug, never ignored).
    pub fn on_ack(&mut self, task: TaskId, ack: &TaskAck) -> Result<Option<CoordinatorMessage>, String> {
        if let TaskAck::StateSent { bytes, .. } = ack {
            self.bytes_moved += bytes;
        }
        let expected = Expect::of(ack).is_some_and(|e| self.waiting.remove(&(task, e)));
        if !expected {
            return Err(format!("unexpected ack {ack:?} from {task} in phase {:?}", self.phase));
        }
        if !self.waiting.is_empty() {
            return Ok(None);
        }
        let epoch = self.plan.epoch;
        Ok(match self.phase {
            Phase::Preparing if self.protocol == Protocol::Koala && !self.stateful => {
                // A stateless operator under Koala: nothing to hand over; upstreams switch with
                // markers, and the old tasks are done once they passed every marker.
                self.phase = Phase::Switching;
                self.waiting.extend(self.upstream.iter().map(|t| (*t, Expect::Switched)));
                self.waiting.extend(self.old_targets.iter().map(|t| (*t, Expect::StateSent)));
                Some(CoordinatorMessage::Switch { epoch })
            }
            Phase::Preparing if self.protocol == Protocol::Koala => {
                self.phase = Phase::Delegated;
                None
            }
            Phase::Preparing => {
                self.phase = Phase::Draining;
                self.waiting.extend(self.upstream.iter().map(|t| (*t, Expect::Paused)));
                self.waiting.extend(self.old_targets.iter().map(|t| (*t, Expect::StateSent)));
                self.waiting.extend(self.receivers.iter().map(|t| (*t, Expect::StateReceived)));
                Some(CoordinatorMessage::Drain { epoch })
            }
            Phase::Draining => {
                self.phase = Phase::Resuming;
                self.waiting.extend(self.upstream.iter().map(|t| (*t, Expect::Resumed)));
                Some(CoordinatorMessage::Resume { epoch })
            }
            Phase::Resuming | Phase::Switching | Phase::Delegated | Phase::Complete => {
                self.phase = Phase::Complete;
                None
            }
        })
    }

    /// Whether this driver waits for `ack` from `task` (acks it does not wait for belong to the
    /// Koala core or are not an error in this phase).
    pub fn waits_for(&self, task: TaskId, ack: &TaskAck) -> bool {
        Expect::of(ack).is_some_and(|e| self.waiting.contains(&(task, e)))
    }

    /// Tasks whose acks are still awaited (for timeouts and error messages).
    pub fn waiting_for(&self) -> Vec<String> {
        let mut v: Vec<String> = self.waiting.iter().map(|(t, e)| format!("{t}:{e:?}")).collect();
        v.sort();
        v
    }

    /// Upstream tasks of the reconfigured operator (they must still be running to start).
    pub fn upstream(&self) -> &[TaskId] {
        &self.upstream
    }
}

/// The live, unfinished tasks of every operator feeding `op` (a self-join's upstream counted
/// once): the tasks that switch routing in a reconfiguration of `op`.
pub fn upstream_tasks(d: &Deployment, graph: &JobGraph, op: OperatorId) -> Vec<TaskId> {
    let Some(spec) = graph.operator(op) else { return Vec::new() };
    let froms: BTreeSet<OperatorId> = spec.inputs.iter().map(|i| i.from).collect();
    froms
        .into_iter()
        .flat_map(|from| live(d, from).into_iter().map(move |i| TaskId::new(from, i)))
        .filter(|t| !d.finished.contains(t))
        .collect()
}
