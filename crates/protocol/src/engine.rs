//! The job's reconfiguration engine (docs/protocols.md §2): one sans-IO state machine per job
//! that owns the deployment and runs one reconfiguration at a time under either protocol — the
//! phase driver ([`crate::phases::Reconfiguring`]: Prepare, stop-and-restart's Drain → Resume, a
//! stateless operator's Switch) and, for a keyed operator under Koala, the Koala coordinator core
//! ([`crate::koala::KoalaCoordinator`]: Begin → PeerReady → Switch → Done, release per epoch) or,
//! under DRRS, the DRRS coordinator core ([`crate::drrs::DrrsCoordinator`]: the same per subscale).
//! It also decides what an upstream that finishes mid-reconfiguration means and when tasks
//! whose input ended may be released. The job's coordinator (`crates/coordinator`) and the
//! deterministic simulator (`koala::sim`) both drive this type, so the decisions they run are the
//! same code; the coordinator adds only I/O, planning from the job graph, metrics and timeouts.
//!
//! ```
//! use std::collections::{BTreeMap, BTreeSet};
//! use koala_protocol::engine::{Engine, EngineAction};
//! use koala_protocol::phases::Participants;
//! use koala_protocol::{CoordinatorMessage, Deployment, Protocol, ReconfigPlan, RuntimeOptions, TaskAck};
//! use koala_types::{OperatorId, TaskId};
//!
//! let (src, op) = (OperatorId(0), OperatorId(1));
//! let options = RuntimeOptions {
//!     batch_records: 1,
//!     linger_ms: 0,
//!     channel_capacity: 1,
//!     sink_dir: ".".into(),
//!     capacity: Default::default(),
//!     max_queued_records: 1024,
//!     checkpoint: Default::default(),
//! };
//! let deployment = Deployment {
//!     run: "r".into(), query: "q".into(), query_params: String::new(), workers: BTreeMap::new(),
//!     placement: BTreeMap::new(), tasks: BTreeMap::from([(src, vec![0]), (op, vec![0])]), epoch: 0,
//!     routing: BTreeMap::from([(op, vec![0, 0])]), num_buckets: 2, options,
//!     protocol: Protocol::StopAndRestart, extra_keys: 0, drain_keys_per_sec: 0, finished: BTreeSet::new(),
//! };
//! let inputs = BTreeMap::from([(op, BTreeSet::from([src]))]);
//! let mut engine = Engine::new(deployment.clone(), inputs).unwrap();
//! let (up, t0, t1) = (TaskId::new(src, 0), TaskId::new(op, 0), TaskId::new(op, 1));
//! let mut next = deployment.clone();
//! next.epoch = 1;
//! next.tasks.insert(op, vec![0, 1]);
//! next.routing.insert(op, vec![0, 1]);
//! let plan = ReconfigPlan {
//!     epoch: 1, operator: op, deployment: next, moves: BTreeMap::from([((t0, t1), vec![1])]),
//!     upstreams: vec![up], created: vec![1], cancelled: vec![], retired: vec![],
//! };
//! let who = Participants { stateful: true, old_targets: vec![t0], consumers: vec![] };
//! let first = engine.start(plan, who).unwrap();
//! assert!(matches!(&first[..], [EngineAction::Broadcast(CoordinatorMessage::Prepare(_))]));
//! engine.on_ack(t0, 1, TaskAck::Prepared).unwrap();
//! let drain = engine.on_ack(t1, 1, TaskAck::Prepared).unwrap();
//! assert_eq!(drain, vec![EngineAction::Broadcast(CoordinatorMessage::Drain { epoch: 1 })]);
//! engine.on_ack(up, 1, TaskAck::Paused).unwrap();
//! engine.on_ack(t0, 1, TaskAck::StateSent { bytes: 8, entries: 1 }).unwrap();
//! engine.on_ack(t1, 1, TaskAck::StateReceived).unwrap();
//! let done = engine.on_ack(up, 1, TaskAck::Resumed).unwrap();
//! assert_eq!(done, vec![EngineAction::Completed { epoch: 1, operator: op, bytes_moved: 8 }]);
//! assert_eq!(engine.deployment().tasks[&op], vec![0, 1]);
//! ```

use std::collections::{BTreeMap, BTreeSet};

use koala_types::{Epoch, OperatorId, TaskId};

use crate::control::{CoordinatorMessage, Deployment, Protocol, ReconfigPlan, TaskAck};
use crate::drrs::{DrrsCoordinator, DrrsOptions, DrrsStep};
use crate::koala::{CoordinatorAction, CoordinatorEvent, KeyedOperator, KoalaCoordinator, NewAssignment};
use crate::phases::{Participants, Phase, Reconfiguring};

mod ending;

pub use ending::Waiting;

/// What the engine asks its executor to do, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineAction {
    /// Send to every worker (each delivers it to the tasks it concerns).
    Broadcast(CoordinatorMessage),
    /// Tell `task` it may exit: it holds no state anyone will fetch.
    Release(TaskId),
    /// The running reconfiguration completed; the engine adopted its deployment.
    Completed {
        /// The epoch.
        epoch: Epoch,
        /// The reconfigured operator.
        operator: OperatorId,
        /// State bytes the tasks reported sending (stop-and-restart).
        bytes_moved: u64,
    },
}

/// Who a protocol error is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorSource {
    /// A task reported it, or sent what nobody waits for.
    Task(TaskId),
    /// The Koala core aborted the operator's epoch.
    Operator(OperatorId),
    /// The engine itself found an inconsistency.
    Engine,
}

/// A protocol error: the epoch is aborted and the job fails (there is no recovery yet).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("epoch {epoch} ({origin:?}): {error}")]
pub struct EngineError {
    /// The epoch it belongs to.
    pub epoch: Epoch,
    /// Who it is about.
    pub origin: ErrorSource,
    /// What went wrong.
    pub error: String,
}

/// Why a reconfiguration cannot start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// Another reconfiguration is running (the caller queues).
    #[error("reconfiguration epoch {running} is still running")]
    Busy {
        /// The running epoch.
        running: Epoch,
    },
    /// Every upstream task of the operator has finished: its input ended, nothing is left to
    /// reconfigure.
    #[error(
        "every upstream task of the operator has finished (its input ended); nothing is left to reconfigure"
    )]
    InputEnded,
    /// The plan does not follow the current deployment.
    #[error("the plan does not follow the deployment: {reason}")]
    Stale {
        /// What is wrong.
        reason: String,
    },
}

/// The running reconfiguration.
struct Active {
    driver: Reconfiguring,
    /// Upstream tasks that switched routing (or resumed) in it.
    switched: BTreeSet<TaskId>,
}

/// The job's reconfiguration engine: see the module docs.
pub struct Engine {
    deployment: Deployment,
    /// Upstream operators of every operator (a keyed operator's next epoch expects markers from
    /// their live, unfinished tasks).
    inputs: BTreeMap<OperatorId, BTreeSet<OperatorId>>,
    active: Option<Active>,
    koala: KoalaCoordinator,
    drrs: DrrsCoordinator,
    /// Tasks that reported `InputsEnded`, per operator: they wait for their release (Koala
    /// keyed tasks serve state until then).
    inputs_ended: BTreeMap<OperatorId, BTreeSet<u32>>,
    /// Koala keyed tasks that reported `InputsEnded`: their outputs ended (end of stream sent
    /// downstream) though they live on to serve state, so as upstreams they count as finished.
    outputs_ended: BTreeSet<TaskId>,
    /// Tasks released: every input of their operator ended, or (Koala) retired and drained by
    /// every live task. Each is told once.
    released: BTreeSet<TaskId>,
}

impl Engine {
    /// An engine for a deployed job; `inputs` names every operator's upstream operators. Under
    /// Koala every keyed operator (one with a routing table) is registered with the Koala core.
    pub fn new(
        deployment: Deployment,
        inputs: BTreeMap<OperatorId, BTreeSet<OperatorId>>,
    ) -> Result<Self, EngineError> {
        let mut engine = Self {
            deployment,
            inputs,
            active: None,
            koala: KoalaCoordinator::new(),
            drrs: DrrsCoordinator::default(),
            inputs_ended: BTreeMap::new(),
            outputs_ended: BTreeSet::new(),
            released: BTreeSet::new(),
        };
        if engine.deployment.protocol == Protocol::Koala {
            let keyed: Vec<OperatorId> = engine.deployment.routing.keys().copied().collect();
            for op in keyed {
                let spec = KeyedOperator {
                    operator: op,
                    assignment: assignment(&engine.deployment, op),
                    upstreams: engine.upstream_tasks(op).into_iter().collect(),
                };
                engine.koala.register(spec).map_err(|e| EngineError {
                    epoch: 0,
                    origin: ErrorSource::Operator(op),
                    error: e.to_string(),
                })?;
            }
        }
        Ok(engine)
    }

    /// Fault injection for the simulator's negative tests (see
    /// [`KoalaCoordinator::inject_fault_release_without_epoch`]).
    #[cfg(any(test, feature = "sim"))]
    #[doc(hidden)]
    pub fn inject_fault_release_without_epoch(&mut self) {
        self.koala.inject_fault_release_without_epoch();
    }

    /// DRRS knobs (subscales, wait buffer) for the reconfigurations started from now on.
    pub fn set_drrs_options(&mut self, options: DrrsOptions) {
        self.drrs = DrrsCoordinator::new(options);
    }

    /// The current deployment (the running reconfiguration's once it completes).
    pub fn deployment(&self) -> &Deployment {
        &self.deployment
    }

    /// The running reconfiguration's plan, if any.
    pub fn running(&self) -> Option<&ReconfigPlan> {
        self.active.as_ref().map(|a| &a.driver.plan)
    }

    /// Whether every task ever placed (the running reconfiguration's new ones included) finished.
    pub fn all_finished(&self) -> bool {
        let placed = self.running().map_or(&self.deployment, |p| &p.deployment);
        placed.placement.keys().all(|t| self.deployment.finished.contains(t))
    }

    /// Koala: cancelled tasks of `op` not yet released (they keep serving state).
    pub fn retired(&self, op: OperatorId) -> BTreeSet<u32> {
        self.koala.retired(op).into_iter().map(|t| t.index).collect()
    }

    /// The live, unfinished tasks of every operator feeding `op` (a self-join's upstream counted
    /// once): the tasks that switch routing in a reconfiguration of `op`.
    pub fn upstream_tasks(&self, op: OperatorId) -> Vec<TaskId> {
        let froms = self.inputs.get(&op).into_iter().flatten().copied();
        let all = upstream_tasks(&self.deployment, froms);
        all.into_iter().filter(|t| !self.outputs_ended.contains(t)).collect()
    }

    /// Who the running reconfiguration still waits for, and for what (timeouts, error messages).
    pub fn waiting_for(&self) -> Vec<(TaskId, String)> {
        let Some(a) = &self.active else { return Vec::new() };
        match a.driver.phase() {
            Phase::Delegated if self.deployment.protocol == Protocol::Drrs => self.drrs.waiting_for(),
            Phase::Delegated => self
                .koala
                .waiting_for(a.driver.plan.operator)
                .into_iter()
                .map(|(t, what)| (t, what.to_string()))
                .collect(),
            _ => a.driver.waiting_for(),
        }
    }

    /// Starts a reconfiguration planned against [`Engine::deployment`]; its epoch must be above
    /// every earlier one. Returns what to send (`Prepare`).
    pub fn start(&mut self, plan: ReconfigPlan, who: Participants) -> Result<Vec<EngineAction>, StartError> {
        if let Some(a) = &self.active {
            return Err(StartError::Busy { running: a.driver.plan.epoch });
        }
        if plan.epoch <= self.deployment.epoch {
            let reason =
                format!("epoch {} is not above the deployment's {}", plan.epoch, self.deployment.epoch);
            return Err(StartError::Stale { reason });
        }
        // Every live task of the operator reported its inputs ended (all may be released and
        // gone): nothing is left to reconfigure.
        let op = plan.operator;
        let live = self.deployment.tasks.get(&op).into_iter().flatten();
        if let Some(ended) = self.inputs_ended.get(&op)
            && live.clone().next().is_some()
            && live.clone().all(|i| ended.contains(i))
        {
            return Err(StartError::InputEnded);
        }
        let starts = self.koala_starts(&plan);
        let (mut driver, msg) = Reconfiguring::start(plan, who);
        // Upstreams whose outputs ended take no part; the new tasks expect nothing from them.
        let gone: Vec<TaskId> =
            driver.upstream().iter().copied().filter(|t| self.outputs_ended.contains(t)).collect();
        if gone.len() == driver.upstream().len() {
            return Err(StartError::InputEnded);
        }
        // Koala: the tasks sent `Start` take part again; what they reported is stale (only once
        // the epoch surely starts: a refused one sends no `Start`, and nobody would report again).
        if let Some(ended) = self.inputs_ended.get_mut(&op) {
            ended.retain(|i| !starts.contains(i));
        }
        let mut out = vec![EngineAction::Broadcast(msg)];
        let created: Vec<TaskId> = driver.plan.created.iter().map(|i| TaskId::new(op, *i)).collect();
        for upstream in gone {
            // Still preparing: only `Prepared` is awaited, so forgetting ends no phase.
            let _ = driver.forget(upstream);
            let tasks = created.clone();
            out.push(EngineAction::Broadcast(CoordinatorMessage::UpstreamEnded { upstream, tasks }));
        }
        self.active = Some(Active { driver, switched: BTreeSet::new() });
        Ok(out)
    }

    /// A task's ack.
    pub fn on_ack(
        &mut self,
        task: TaskId,
        epoch: Epoch,
        ack: TaskAck,
    ) -> Result<Vec<EngineAction>, EngineError> {
        let mut out = Vec::new();
        if self.deployment.protocol == Protocol::Drrs
            && self.active.as_ref().is_some_and(|a| a.driver.phase() == Phase::Delegated)
            && matches!(ack, TaskAck::PeerReady | TaskAck::Done | TaskAck::Switched)
        {
            // A DRRS subscale's acks (upstreams confirm switches, possibly late) belong to its core.
            if let Some(a) = self.active.as_mut()
                && ack == TaskAck::Switched
            {
                a.switched.insert(task);
            }
            let steps = self.drrs.on_ack(task, epoch, &ack).map_err(|e| self.bug(epoch, e))?;
            self.drrs_steps(steps, &mut out);
            return Ok(out);
        }
        if self.deployment.protocol == Protocol::Drrs
            && ack == TaskAck::Switched
            && crate::drrs::plan_epoch(epoch) > 0
            && crate::drrs::plan_epoch(epoch) <= self.running_epoch()
        {
            // A late switch confirmation of a completed DRRS subscale.
            return Ok(out);
        }
        match ack {
            // Koala's keyed-operator epochs and its release bookkeeping belong to its core.
            TaskAck::PeerReady | TaskAck::Done | TaskAck::LocationDrained { .. } => {
                self.koala_event(CoordinatorEvent::Ack { from: task, epoch, ack }, &mut out)?;
                return Ok(out);
            }
            TaskAck::InputsEnded => {
                if self.outputs_ended.insert(task) {
                    self.upstream_ended(task, &mut out)?;
                }
                // A report that crossed the `Prepare` of the running epoch, from a task sent its
                // `Start`: the task takes part and reports again after (`koala::TaskLife`).
                let stale = self.running().is_some_and(|p| {
                    p.operator == task.operator
                        && epoch < p.epoch
                        && self.koala_starts(p).contains(&task.index)
                });
                if !stale {
                    self.inputs_ended.entry(task.operator).or_default().insert(task.index);
                    self.release_if_inputs_ended(task.operator, &mut out);
                }
                return Ok(out);
            }
            TaskAck::ProtocolError { error } => {
                let message = error.to_string();
                let mut ignored = Vec::new();
                // The core aborts the operator's epoch; the job fails with the task's error.
                let _ = self.koala_event(CoordinatorEvent::Failed { from: task, error }, &mut ignored);
                return Err(EngineError { epoch, origin: ErrorSource::Task(task), error: message });
            }
            _ => {}
        }
        let running = self.active.as_ref().map(|a| a.driver.plan.epoch);
        let awaited =
            self.active.as_ref().is_some_and(|a| running == Some(epoch) && a.driver.waits_for(task, &ack));
        if let Some(a) = self.active.as_mut()
            && running == Some(epoch)
            && matches!(ack, TaskAck::Switched | TaskAck::Resumed)
        {
            a.switched.insert(task);
        }
        let latest = running.unwrap_or(self.deployment.epoch);
        if ack == TaskAck::Switched && !awaited && epoch <= latest {
            // Koala upstreams confirm their switch, possibly after the epoch completed; the core
            // completes on the tasks' `Done`, which implies every marker arrived.
            return Ok(out);
        }
        let Some(a) = self.active.as_mut() else {
            return Err(self.bug(epoch, format!("{ack:?} from {task} with no reconfiguration running")));
        };
        if a.driver.plan.epoch != epoch {
            let running = a.driver.plan.epoch;
            return Err(self.bug(epoch, format!("{ack:?} from {task} while epoch {running} runs")));
        }
        let step = a.driver.on_ack(task, &ack);
        self.after_step(step, &mut out)?;
        Ok(out)
    }

    /// A task finished (its input ended and it sent end of stream downstream): no later
    /// reconfiguration waits for it, and keyed consumers expect no marker from it. An upstream of
    /// the running reconfiguration that finished before it switched (its `Switched`/`Resumed`
    /// would have come first, on the same connection) never acks and never opens a channel to
    /// the new tasks: they are told not to wait for it.
    ///
    /// A consumer of the operator that finished after the `Prepare` went out (the coordinator
    /// heard of its end before it heard of the operator's upstreams ending) never answers it,
    /// since its worker drops commands to finished tasks: it is forgotten too. It needs no
    /// channel from the new tasks: its inputs all ended, so the operator's tasks ended their
    /// outputs, and they fired every timer first, so nothing is left for the new tasks to send
    /// it. A task of the reconfigured operator itself is never forgotten: it exits only once
    /// released, never while a reconfiguration runs, so one that finished is a bug the wait
    /// keeps visible (the simulator's `ExitWithoutRelease` fault).
    pub fn task_finished(&mut self, task: TaskId) -> Result<Vec<EngineAction>, EngineError> {
        let mut out = Vec::new();
        self.deployment.finished.insert(task);
        self.upstream_ended(task, &mut out)?;
        if let Some(a) = self.active.as_mut()
            && task.operator != a.driver.plan.operator
            && a.driver.awaits_any(task)
        {
            let step = a.driver.forget(task);
            self.after_step(step, &mut out)?;
        }
        Ok(out)
    }

    /// `task` sends nothing downstream any more (it finished or, under Koala, its inputs ended
    /// and it only serves state): keyed consumers expect no marker from it, and the running
    /// reconfiguration stops waiting for it if it has not switched yet.
    fn upstream_ended(&mut self, task: TaskId, out: &mut Vec<EngineAction>) -> Result<(), EngineError> {
        self.refresh_consumer_upstreams(task.operator);
        let Some(a) = self.active.as_mut() else { return Ok(()) };
        if self.deployment.protocol == Protocol::Drrs && a.driver.phase() == Phase::Delegated {
            // The DRRS core knows which tasks will not hear the upstream's end of stream.
            let steps = self.drrs.upstream_finished(task);
            self.drrs_steps(steps, out);
            return Ok(());
        }
        if !a.driver.upstream().contains(&task) || a.switched.contains(&task) {
            return Ok(());
        }
        let op = a.driver.plan.operator;
        let tasks = a.driver.plan.created.iter().map(|i| TaskId::new(op, *i)).collect();
        let step = a.driver.forget(task);
        out.push(EngineAction::Broadcast(CoordinatorMessage::UpstreamEnded { upstream: task, tasks }));
        self.after_step(step, out)
    }

    fn bug(&self, epoch: Epoch, error: String) -> EngineError {
        EngineError { epoch, origin: ErrorSource::Engine, error }
    }

    /// The epoch a protocol bug found outside an ack belongs to: the running one.
    fn running_epoch(&self) -> Epoch {
        self.running().map_or(self.deployment.epoch, |p| p.epoch)
    }

    /// After the phase driver took a step: broadcast what it says, hand a prepared Koala epoch
    /// to the core, or complete.
    fn after_step(
        &mut self,
        step: Result<Option<CoordinatorMessage>, crate::phases::PhaseError>,
        out: &mut Vec<EngineAction>,
    ) -> Result<(), EngineError> {
        let Some(a) = self.active.as_ref() else { return Ok(()) };
        let epoch = a.driver.plan.epoch;
        let msg =
            step.map_err(|e| EngineError { epoch, origin: ErrorSource::Task(e.task), error: e.to_string() })?;
        out.extend(msg.map(EngineAction::Broadcast));
        let op = a.driver.plan.operator;
        match a.driver.phase() {
            Phase::Delegated if self.deployment.protocol == Protocol::Drrs => {
                if !self.drrs.is_idle() {
                    return Ok(());
                }
                let old = assignment(&self.deployment, op);
                let new = assignment(&a.driver.plan.deployment, op);
                let upstreams = a.driver.upstream().iter().copied().collect();
                let steps =
                    self.drrs.start(op, epoch, old, new, upstreams).map_err(|e| self.bug(epoch, e))?;
                self.drrs_steps(steps, out);
                Ok(())
            }
            // Once: when the phase driver has just handed over (later steps find the core busy).
            Phase::Delegated if self.koala.is_idle(op) => {
                let d = &a.driver.plan.deployment;
                let request = NewAssignment {
                    operator: op,
                    assignment: assignment(d, op),
                    extra_keys: d.extra_keys,
                    drain_keys_per_sec: d.drain_keys_per_sec,
                    epoch,
                };
                self.koala_event(CoordinatorEvent::Request(request), out)
            }
            Phase::Complete => {
                self.complete(out);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Feeds Koala's coordinator core and turns its actions into messages.
    fn koala_event(
        &mut self,
        event: CoordinatorEvent,
        out: &mut Vec<EngineAction>,
    ) -> Result<(), EngineError> {
        let mut begin: Option<(crate::koala::Reconfiguration, Vec<TaskId>)> = None;
        let mut switch = None;
        let mut completed = None;
        for action in self.koala.on(event) {
            match action {
                CoordinatorAction::DeployTask { task } => {
                    // Prepare already started the plan's new tasks; the core must agree.
                    let planned = self
                        .running()
                        .is_some_and(|p| p.operator == task.operator && p.created.contains(&task.index));
                    if !planned {
                        let error = format!("the Koala core deploys {task}, which the plan did not create");
                        return Err(self.bug(self.running_epoch(), error));
                    }
                }
                CoordinatorAction::Start { to, reconfiguration } => {
                    begin.get_or_insert_with(|| ((*reconfiguration).clone(), Vec::new())).1.push(to);
                }
                CoordinatorAction::SwitchRouting { epoch, .. } => switch = Some(epoch),
                CoordinatorAction::Completed { epoch, .. } => completed = Some(epoch),
                CoordinatorAction::ReleaseTask { task } => {
                    // A retired task nobody points at: told once (a later release of every
                    // task whose inputs ended skips it).
                    if self.released.insert(task) {
                        out.push(EngineAction::Release(task));
                    }
                }
                CoordinatorAction::Aborted { operator, epoch, error } => {
                    return Err(EngineError {
                        epoch,
                        origin: ErrorSource::Operator(operator),
                        error: error.to_string(),
                    });
                }
                CoordinatorAction::Error(error) => {
                    return Err(self.bug(self.running_epoch(), error.to_string()));
                }
            }
        }
        if let Some((reconfiguration, tasks)) = begin {
            out.push(EngineAction::Broadcast(CoordinatorMessage::Begin {
                reconfiguration: Box::new(reconfiguration),
                tasks,
            }));
        }
        if let Some(epoch) = switch {
            out.push(EngineAction::Broadcast(CoordinatorMessage::Switch { epoch }));
        }
        if let Some(epoch) = completed {
            if self.running().map(|p| p.epoch) != Some(epoch) {
                return Err(self.bug(epoch, "the Koala core completed an epoch that is not running".into()));
            }
            self.complete(out);
        }
        Ok(())
    }

    /// Turns the DRRS core's steps into messages; completes the reconfiguration with the last.
    fn drrs_steps(&mut self, steps: Vec<DrrsStep>, out: &mut Vec<EngineAction>) {
        for step in steps {
            match step {
                DrrsStep::Broadcast(msg) => out.push(EngineAction::Broadcast(msg)),
                DrrsStep::Completed => {
                    // Every bucket of a cancelled task was pushed: nobody needs it any more.
                    let cancelled: Vec<TaskId> = self.running().map_or_else(Vec::new, |p| {
                        p.cancelled.iter().map(|i| TaskId::new(p.operator, *i)).collect()
                    });
                    self.complete(out);
                    for task in cancelled {
                        if self.released.insert(task) {
                            out.push(EngineAction::Release(task));
                        }
                    }
                }
            }
        }
    }

    /// The running reconfiguration completed: adopt its deployment.
    fn complete(&mut self, out: &mut Vec<EngineAction>) {
        let Some(a) = self.active.take() else { return };
        let plan = a.driver.plan;
        let (epoch, operator, bytes_moved) = (plan.epoch, plan.operator, a.driver.bytes_moved);
        // Tasks that finished while the reconfiguration ran stay finished.
        let finished = std::mem::take(&mut self.deployment.finished);
        self.deployment = plan.deployment;
        self.deployment.finished.extend(finished);
        self.refresh_consumer_upstreams(operator);
        out.push(EngineAction::Completed { epoch, operator, bytes_moved });
        // Inputs that ended while it ran: an operator's tasks may all be done now.
        let ops: Vec<OperatorId> = self.inputs_ended.keys().copied().collect();
        for op in ops {
            self.release_if_inputs_ended(op, out);
        }
    }

    /// Releases tasks whose inputs ended, never while a reconfiguration runs (it may still
    /// involve them; [`Engine::complete`] checks again). A Koala keyed operator's tasks (live and
    /// retired) once every one of them has no input left: none will fetch again. Any other
    /// operator's (stop-and-restart and Remote tasks, a stateless operator's): a task no longer
    /// live at once; the live ones once all of them ended, after which [`Engine::start`] refuses
    /// to reconfigure the operator, so no `Prepare` ever reaches a task that may have exited.
    fn release_if_inputs_ended(&mut self, op: OperatorId, out: &mut Vec<EngineAction>) {
        if self.active.is_some() {
            return;
        }
        let Some(ended) = self.inputs_ended.get(&op) else { return };
        let live: BTreeSet<u32> = self.deployment.tasks.get(&op).into_iter().flatten().copied().collect();
        let koala_keyed =
            self.deployment.protocol == Protocol::Koala && self.deployment.routing.contains_key(&op);
        let tasks: Vec<u32> = if koala_keyed {
            let mut all = live;
            all.extend(self.koala.retired(op).into_iter().map(|t| t.index));
            if ended.is_superset(&all) { all.into_iter().collect() } else { Vec::new() }
        } else if ended.is_superset(&live) {
            ended.iter().copied().collect()
        } else {
            ended.difference(&live).copied().collect()
        };
        for task in tasks.into_iter().map(|i| TaskId::new(op, i)) {
            if self.released.insert(task) {
                out.push(EngineAction::Release(task));
            }
        }
    }

    /// Koala keyed operators: the tasks `plan` sends `Start` (they own buckets before or after
    /// it, `koala::coordinator`'s participants); none for any other operator.
    fn koala_starts(&self, plan: &ReconfigPlan) -> BTreeSet<u32> {
        let op = plan.operator;
        if self.deployment.protocol != Protocol::Koala || !self.deployment.routing.contains_key(&op) {
            return BTreeSet::new();
        }
        let before = self.deployment.routing.get(&op).into_iter().flatten();
        before.chain(plan.deployment.routing.get(&op).into_iter().flatten()).copied().collect()
    }

    /// Keyed consumers of `op` have other upstream tasks now: their next epoch expects markers
    /// from these.
    fn refresh_consumer_upstreams(&mut self, op: OperatorId) {
        let consumers: Vec<OperatorId> =
            self.inputs.iter().filter(|(_, froms)| froms.contains(&op)).map(|(c, _)| *c).collect();
        for consumer in consumers {
            let upstreams = self.upstream_tasks(consumer).into_iter().collect();
            self.koala.set_upstreams(consumer, upstreams);
        }
    }
}

/// The assignment of keyed operator `op` in `d`, bucket → owning task (empty for a stateless one).
pub fn assignment(d: &Deployment, op: OperatorId) -> Vec<TaskId> {
    d.routing.get(&op).map(|r| r.iter().map(|i| TaskId::new(op, *i)).collect()).unwrap_or_default()
}

/// The live, unfinished tasks of the operators `froms` in `d`.
pub fn upstream_tasks(d: &Deployment, froms: impl IntoIterator<Item = OperatorId>) -> Vec<TaskId> {
    let froms: BTreeSet<OperatorId> = froms.into_iter().collect();
    froms
        .into_iter()
        .flat_map(|from| d.tasks.get(&from).into_iter().flatten().map(move |i| TaskId::new(from, *i)))
        .filter(|t| !d.finished.contains(t))
        .collect()
}

#[cfg(test)]
mod tests;
