//! The running job as the coordinator tracks it: the deployment, the reconfiguration queue, the
//! running reconfiguration's driver, and Koala's coordinator core, fed with the tasks' acks.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use koala_dataflow::JobGraph;
use koala_protocol::koala::{
    CoordinatorAction, CoordinatorEvent, KeyedOperator, KoalaCoordinator, NewAssignment,
};
use koala_protocol::phases::{Phase, PhaseError, Reconfiguring};
use koala_protocol::{ClientReply, CoordinatorMessage, Deployment, Protocol, ReconfigRequest, TaskAck};
use koala_types::{OperatorId, TaskId};

use crate::config::JobConfig;
use crate::control::Workers;
use crate::error::CoordinatorError;
use crate::metrics_store::{MetricsStore, ReconfigurationCompletion, ReconfigurationStart};
use crate::progress::ProgressEvent;
use crate::reconfig::{assignment, kind_name, participants, plan as plan_reconfiguration, upstream_tasks};
use crate::server::unix_ms;

/// A reconfiguration waiting to run, and who to tell.
pub(crate) struct Queued {
    pub(crate) request: ReconfigRequest,
    pub(crate) reply: Option<Sender<ClientReply>>,
}

/// The running job as the coordinator tracks it.
pub(crate) struct JobState<'a> {
    pub(crate) config: &'a JobConfig,
    pub(crate) graph: &'a JobGraph,
    pub(crate) run: &'a str,
    pub(crate) workers: Workers,
    pub(crate) deployment: Deployment,
    pub(crate) next_index: BTreeMap<OperatorId, u32>,
    pub(crate) store: MetricsStore,
    pub(crate) progress: Option<Sender<ProgressEvent>>,
    pub(crate) queue: VecDeque<Queued>,
    /// The running reconfiguration: its driver, when it started, when upstreams were paused.
    pub(crate) active: Option<(Reconfiguring, Instant, Option<Instant>)>,
    /// When the running reconfiguration last made progress (an ack it waited for).
    pub(crate) last_progress: Instant,
    /// Upstream tasks that switched routing (or resumed) in the running reconfiguration.
    pub(crate) switched: BTreeSet<TaskId>,
    /// Koala's coordinator core (the one the simulator checks): drives every keyed operator's
    /// epochs after Prepare, tracks retired tasks and releases them per epoch.
    pub(crate) koala: KoalaCoordinator,
    /// Koala: tasks whose inputs ended, per operator.
    pub(crate) inputs_ended: BTreeMap<OperatorId, BTreeSet<u32>>,
    pub(crate) epoch: u64,
    pub(crate) completed: u64,
}

impl JobState<'_> {
    pub(crate) fn say(&self, event: ProgressEvent) {
        if let Some(tx) = &self.progress {
            let _ = tx.send(event);
        }
    }

    /// Whether every task ever placed (the running reconfiguration's new ones included) finished.
    pub(crate) fn all_finished(&self) -> bool {
        let placed = self.active.as_ref().map_or(&self.deployment, |(d, ..)| &d.plan.deployment);
        placed.placement.keys().all(|t| self.deployment.finished.contains(t))
    }

    /// Answers a request that will not run (if a client waits) and says so.
    fn reject(&self, reply: Option<Sender<ClientReply>>, error: String) {
        if let Some(r) = reply {
            let _ = r.send(ClientReply::Rejected { error: error.clone() });
        }
        self.say(ProgressEvent::ReconfigurationRejected { error });
    }

    /// Keyed consumers of `op` have other upstream tasks now: their next epoch expects markers
    /// from these.
    fn refresh_consumer_upstreams(&mut self, op: OperatorId) {
        for (consumer, _) in self.graph.consumers(op) {
            let upstreams = upstream_tasks(&self.deployment, self.graph, consumer).into_iter().collect();
            self.koala.set_upstreams(consumer, upstreams);
        }
    }

    pub(crate) fn name(&self, t: TaskId) -> String {
        let op = self.graph.operator(t.operator).map_or("?", |o| o.name.as_str());
        format!("{op}.{}", t.index)
    }

    /// Koala: cancelled tasks not yet released, per operator (they keep serving state).
    fn retired(&self) -> BTreeMap<OperatorId, BTreeSet<u32>> {
        self.graph
            .operators
            .iter()
            .map(|o| (o.id, self.koala.retired(o.id).into_iter().map(|t| t.index).collect()))
            .collect()
    }

    /// Checks a request against the current deployment without changing anything.
    fn check(&self, request: &ReconfigRequest) -> Result<(), String> {
        plan_reconfiguration(
            request,
            &self.deployment,
            self.graph,
            self.config.partition_policy,
            self.epoch + 1,
            &self.next_index,
            &self.retired(),
        )
        .map(|_| ())
    }

    /// A client request: rejected at once if it cannot apply now, else queued.
    pub(crate) fn submit(
        &mut self,
        request: ReconfigRequest,
        reply: Sender<ClientReply>,
    ) -> Result<(), CoordinatorError> {
        match self.check(&request) {
            Ok(()) if self.active.is_some() || !self.queue.is_empty() => {
                // Answered now, not when it starts: a client never waits out a long transfer
                // and never mistakes a queued request for a failed one.
                let ahead = self.queue.len() + usize::from(self.active.is_some());
                let _ = reply.send(ClientReply::Queued { ahead });
                self.queue.push_back(Queued { request, reply: None });
                Ok(())
            }
            Ok(()) => {
                self.queue.push_back(Queued { request, reply: Some(reply) });
                self.start_next()
            }
            Err(error) => {
                let _ = reply.send(ClientReply::Rejected { error });
                Ok(())
            }
        }
    }

    /// Starts the next queued reconfiguration if none is running.
    pub(crate) fn start_next(&mut self) -> Result<(), CoordinatorError> {
        while self.active.is_none() {
            let Some(q) = self.queue.pop_front() else { return Ok(()) };
            let epoch = self.epoch + 1;
            let plan = match plan_reconfiguration(
                &q.request,
                &self.deployment,
                self.graph,
                self.config.partition_policy,
                epoch,
                &self.next_index,
                &self.retired(),
            ) {
                Ok(p) => p,
                Err(error) => {
                    tracing::error!(%error, "reconfiguration rejected");
                    self.reject(q.reply, error);
                    continue;
                }
            };
            let who = participants(&plan, &self.deployment, self.graph);
            let (driver, msg) = Reconfiguring::start(plan, who);
            if driver.upstream().is_empty() {
                // Finished upstream tasks take no part; with none left the input has ended.
                let error = format!(
                    "skipped: every upstream task of {:?} has finished (its input ended); nothing is left to reconfigure",
                    q.request.operator()
                );
                self.reject(q.reply, error);
                continue;
            }
            self.epoch = epoch;
            let op = driver.plan.operator;
            let old = self.deployment.tasks.get(&op).map_or(0, Vec::len);
            let new = driver.plan.deployment.tasks.get(&op).map_or(0, Vec::len);
            let kind = kind_name(old, new, &q.request);
            let buckets: usize = driver.plan.moves.values().map(Vec::len).sum();
            let description = format!(
                "{kind} {} {old}→{new} tasks, {buckets} buckets change owner ({})",
                q.request.operator(),
                self.config.protocol.name()
            );
            let started_ms = unix_ms();
            self.store.reconfiguration_started(
                self.run,
                &ReconfigurationStart {
                    epoch,
                    operator: q.request.operator().to_string(),
                    kind: kind.to_string(),
                    protocol: self.config.protocol.name().into(),
                    started_ms,
                    buckets_moved: buckets as u64,
                    detail: format!("{:?}", q.request),
                },
            )?;
            if let Some(r) = q.reply {
                let _ = r.send(ClientReply::Accepted { epoch });
            }
            self.say(ProgressEvent::ReconfigurationStarted { epoch, description });
            if let Some(max) = driver.plan.created.iter().max() {
                self.next_index.insert(op, max + 1);
            }
            self.workers.broadcast(&msg)?;
            self.active = Some((driver, Instant::now(), None));
            self.last_progress = Instant::now();
            self.switched.clear();
        }
        Ok(())
    }

    /// Koala: once every task of the operator (live and retired) has no input left, none will
    /// fetch again: release them all.
    fn on_inputs_ended(&mut self, task: TaskId) -> Result<(), CoordinatorError> {
        let op = task.operator;
        self.inputs_ended.entry(op).or_default().insert(task.index);
        let mut all: BTreeSet<u32> = self.deployment.tasks.get(&op).into_iter().flatten().copied().collect();
        all.extend(self.koala.retired(op).into_iter().map(|t| t.index));
        if self.active.is_none() && self.inputs_ended.get(&op).is_some_and(|e| e.is_superset(&all)) {
            for i in all {
                self.release(TaskId::new(op, i))?;
            }
        }
        Ok(())
    }

    fn release(&mut self, task: TaskId) -> Result<(), CoordinatorError> {
        tracing::debug!(task = %self.name(task), "released");
        match self.deployment.placement.get(&task) {
            Some(w) => self.workers.send(w.0 as usize, &CoordinatorMessage::Release { task }),
            None => Ok(()),
        }
    }

    pub(crate) fn on_ack(&mut self, task: TaskId, epoch: u64, ack: TaskAck) -> Result<(), CoordinatorError> {
        // Acks of Koala's keyed-operator epochs and its release bookkeeping go to the core.
        if matches!(ack, TaskAck::PeerReady | TaskAck::Done | TaskAck::LocationDrained { .. }) {
            if !matches!(ack, TaskAck::LocationDrained { .. }) {
                self.last_progress = Instant::now();
            }
            return self.koala_event(CoordinatorEvent::Ack { from: task, epoch, ack });
        }
        match ack {
            TaskAck::InputsEnded => return self.on_inputs_ended(task),
            TaskAck::ProtocolError { error } => {
                self.koala_event(CoordinatorEvent::Failed { from: task, error: error.clone() })?;
                return Err(CoordinatorError::Protocol {
                    epoch,
                    source_task: self.name(task),
                    error: error.to_string(),
                });
            }
            _ => {}
        }
        let awaited =
            self.active.as_ref().is_some_and(|(d, ..)| d.plan.epoch == epoch && d.waits_for(task, &ack));
        if matches!(ack, TaskAck::Switched | TaskAck::Resumed) && epoch == self.epoch {
            self.switched.insert(task);
        }
        if ack == TaskAck::Switched && !awaited && epoch <= self.epoch {
            // Koala upstreams confirm their switch, possibly after the epoch completed; the core
            // completes on the tasks' `Done`, which implies every marker arrived.
            return Ok(());
        }
        let Some((driver, ..)) = self.active.as_mut() else {
            return Err(
                self.protocol_bug(epoch, format!("{ack:?} from {task} with no reconfiguration running"))
            );
        };
        if driver.plan.epoch != epoch {
            let running = driver.plan.epoch;
            return Err(self.protocol_bug(epoch, format!("{ack:?} from {task} while epoch {running} runs")));
        }
        let step = driver.on_ack(task, &ack);
        self.after_step(step)
    }

    /// After the phase driver took a step: broadcast what it says, hand a prepared Koala epoch
    /// to the core, or complete.
    fn after_step(
        &mut self,
        step: Result<Option<CoordinatorMessage>, PhaseError>,
    ) -> Result<(), CoordinatorError> {
        let Some((driver, _, drain_at)) = self.active.as_mut() else { return Ok(()) };
        let epoch = driver.plan.epoch;
        let msg = match step {
            Ok(msg) => msg,
            Err(e) => return Err(self.protocol_bug(epoch, e.to_string())),
        };
        self.last_progress = Instant::now();
        if let Some(msg) = msg {
            if matches!(msg, CoordinatorMessage::Drain { .. }) {
                *drain_at = Some(Instant::now());
            }
            self.workers.broadcast(&msg)?;
        }
        match driver.phase() {
            // Once: when the phase driver has just handed over (later steps find the core busy).
            Phase::Delegated if self.koala.is_idle(driver.plan.operator) => {
                let op = driver.plan.operator;
                let request = NewAssignment {
                    operator: op,
                    assignment: assignment(&driver.plan.deployment, op),
                    extra_keys: driver.plan.deployment.extra_keys,
                    epoch,
                };
                self.koala_event(CoordinatorEvent::Request(request))
            }
            Phase::Complete => self.complete(),
            _ => Ok(()),
        }
    }

    fn protocol_bug(&self, epoch: u64, error: String) -> CoordinatorError {
        CoordinatorError::Protocol { epoch, source_task: "coordinator".into(), error }
    }

    /// The epoch a protocol bug found outside an ack belongs to: the running one.
    fn running_epoch(&self) -> u64 {
        self.active.as_ref().map_or(self.epoch, |(d, ..)| d.plan.epoch)
    }

    /// Feeds Koala's coordinator core and executes its actions.
    fn koala_event(&mut self, event: CoordinatorEvent) -> Result<(), CoordinatorError> {
        let mut begin: Option<(koala_protocol::koala::Reconfiguration, Vec<TaskId>)> = None;
        let mut switch = None;
        let mut completed = None;
        for action in self.koala.on(event) {
            match action {
                CoordinatorAction::DeployTask { task } => {
                    // Prepare already started the plan's new tasks; the core must agree.
                    let planned = self.active.as_ref().is_some_and(|(d, ..)| {
                        d.plan.operator == task.operator && d.plan.created.contains(&task.index)
                    });
                    if !planned {
                        return Err(self.protocol_bug(
                            self.running_epoch(),
                            format!("the Koala core deploys {task}, which the plan did not create"),
                        ));
                    }
                }
                CoordinatorAction::Start { to, reconfiguration } => {
                    begin.get_or_insert_with(|| ((*reconfiguration).clone(), Vec::new())).1.push(to);
                }
                CoordinatorAction::SwitchRouting { epoch, .. } => switch = Some(epoch),
                CoordinatorAction::Completed { epoch, .. } => completed = Some(epoch),
                CoordinatorAction::ReleaseTask { task } => self.release(task)?,
                CoordinatorAction::Aborted { operator, epoch, error } => {
                    let op = self.graph.operator(operator).map_or("?", |o| o.name.as_str());
                    return Err(CoordinatorError::Protocol {
                        epoch,
                        source_task: format!("operator {op}"),
                        error: error.to_string(),
                    });
                }
                CoordinatorAction::Error(error) => {
                    return Err(self.protocol_bug(self.running_epoch(), error.to_string()));
                }
            }
        }
        if let Some((reconfiguration, tasks)) = begin {
            self.workers.broadcast(&CoordinatorMessage::Begin {
                reconfiguration: Box::new(reconfiguration),
                tasks,
            })?;
        }
        if let Some(epoch) = switch {
            self.workers.broadcast(&CoordinatorMessage::Switch { epoch })?;
        }
        if let Some(epoch) = completed {
            if self.active.as_ref().map(|(d, ..)| d.plan.epoch) != Some(epoch) {
                return Err(
                    self.protocol_bug(epoch, "the Koala core completed an epoch that is not running".into())
                );
            }
            self.complete()?;
        }
        Ok(())
    }

    /// The running reconfiguration completed: record it, adopt its deployment, start the next.
    fn complete(&mut self) -> Result<(), CoordinatorError> {
        let Some((driver, started, drain_at)) = self.active.take() else { return Ok(()) };
        let epoch = driver.plan.epoch;
        let pause_ms = drain_at.map_or(0, |d| d.elapsed().as_millis() as u64);
        let duration_ms = started.elapsed().as_millis() as u64;
        let bytes_moved = driver.bytes_moved;
        let op = driver.plan.operator;
        let operator = self.graph.operator(op).map_or(String::new(), |o| o.name.clone());
        self.store.reconfiguration_completed(
            self.run,
            &ReconfigurationCompletion {
                epoch,
                operator,
                completed_ms: unix_ms(),
                bytes_moved,
                pause_ms: Some(pause_ms),
            },
        )?;
        // Tasks that finished while the reconfiguration ran stay finished.
        let finished = std::mem::take(&mut self.deployment.finished);
        self.deployment = driver.plan.deployment;
        self.deployment.finished.extend(finished);
        self.refresh_consumer_upstreams(op);
        self.completed += 1;
        let lazy = self.config.protocol == Protocol::Koala;
        self.say(ProgressEvent::ReconfigurationCompleted { epoch, bytes_moved, pause_ms, duration_ms, lazy });
        self.start_next()
    }

    /// A task finished (its input ended): no later reconfiguration waits for it, and keyed
    /// consumers expect no marker from it.
    pub(crate) fn task_finished(&mut self, task: TaskId) -> Result<(), CoordinatorError> {
        self.deployment.finished.insert(task);
        self.refresh_consumer_upstreams(task.operator);
        // An upstream of the running reconfiguration that finished before it switched (its
        // `Switched`/`Resumed` would have come first, on the same connection) never acks and
        // never opens a channel to the new tasks: they must not wait for it.
        let Some((driver, ..)) = self.active.as_mut() else { return Ok(()) };
        if !driver.upstream().contains(&task) || self.switched.contains(&task) {
            return Ok(());
        }
        let op = driver.plan.operator;
        let tasks = driver.plan.created.iter().map(|i| TaskId::new(op, *i)).collect();
        let step = driver.forget_upstream(task);
        self.workers.broadcast(&CoordinatorMessage::UpstreamEnded { upstream: task, tasks })?;
        self.after_step(step)
    }

    /// Fails the job if the running reconfiguration made no progress for too long.
    pub(crate) fn check_stalled(&self) -> Result<(), CoordinatorError> {
        let limit = Duration::from_secs_f64(self.config.runtime.reconfiguration_timeout_s);
        let Some((driver, ..)) = &self.active else { return Ok(()) };
        if self.last_progress.elapsed() < limit {
            return Ok(());
        }
        let waiting: Vec<String> = match driver.phase() {
            Phase::Delegated => self
                .koala
                .waiting_for(driver.plan.operator)
                .into_iter()
                .map(|(t, what)| format!("{}:{what}", self.name(t)))
                .collect(),
            _ => driver.waiting_for(),
        };
        Err(CoordinatorError::Timeout(format!(
            "reconfiguration epoch {} made no progress for {:.0} s ([runtime] reconfiguration_timeout_s); \
             still waiting for {}",
            driver.plan.epoch,
            limit.as_secs_f64(),
            waiting.join(", ")
        )))
    }
}

/// Koala: registers every keyed operator with the coordinator core.
pub(crate) fn register_keyed_operators(state: &mut JobState<'_>) -> Result<(), CoordinatorError> {
    for spec in state.graph.operators.iter().filter(|o| o.is_stateful()) {
        let op = spec.id;
        let assignment = assignment(&state.deployment, op);
        let upstreams = upstream_tasks(&state.deployment, state.graph, op).into_iter().collect();
        state.koala.register(KeyedOperator { operator: op, assignment, upstreams }).map_err(|e| {
            CoordinatorError::Protocol { epoch: 0, source_task: "coordinator".into(), error: e.to_string() }
        })?;
    }
    Ok(())
}
