//! The running job as the coordinator tracks it: the reconfiguration queue and the I/O around
//! the job's reconfiguration engine (`koala_protocol::engine::Engine`, the sans-IO core the
//! simulator drives too): plans from the job graph go in, the engine's messages go out to the
//! workers, completions go to the metrics store and the progress lines.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use koala_dataflow::JobGraph;
use koala_protocol::engine::{Engine, EngineAction, EngineError, ErrorSource, StartError};
use koala_protocol::{ClientReply, CoordinatorMessage, Protocol, ReconfigRequest, TaskAck};
use koala_types::{OperatorId, TaskId};

use crate::clock::unix_ms;
use crate::config::JobConfig;
use crate::control::Workers;
use crate::ending::EndWatch;
use crate::error::CoordinatorError;
use crate::metrics_store::{MetricsStore, ReconfigurationCompletion, ReconfigurationStart};
use crate::progress::ProgressEvent;
use crate::reconfig::{kind_name, plan as plan_reconfiguration};

/// A reconfiguration waiting to run, and who to tell.
pub(crate) struct Queued {
    pub(crate) request: ReconfigRequest,
    pub(crate) reply: Option<Sender<ClientReply>>,
    /// When it came (unix ms): submitted, or due by the schedule.
    pub(crate) came_ms: u64,
}

/// The running job as the coordinator tracks it.
pub(crate) struct JobState<'a> {
    pub(crate) config: &'a JobConfig,
    pub(crate) graph: &'a JobGraph,
    pub(crate) run: &'a str,
    pub(crate) workers: Workers,
    /// The deployment and the running reconfiguration, under both protocols.
    pub(crate) engine: Engine,
    pub(crate) next_index: BTreeMap<OperatorId, u32>,
    pub(crate) store: MetricsStore,
    /// Records in and out over the run, and what recoveries replayed.
    pub(crate) totals: crate::progress::Totals,
    pub(crate) progress: Option<Sender<ProgressEvent>>,
    pub(crate) queue: VecDeque<Queued>,
    /// When the running reconfiguration started, and when its upstreams were told to pause.
    pub(crate) timing: Option<(Instant, Option<Instant>)>,
    /// When the running reconfiguration last made progress (an ack of its epoch).
    pub(crate) last_progress: Instant,
    /// The last epoch started.
    pub(crate) epoch: u64,
    pub(crate) completed: u64,
    /// The run's start, unix seconds (`runs.started_ms / 1000`): the clock of every printed time.
    pub(crate) start_s: u64,
    /// The run's start, unix ms (`runs.started_ms`).
    pub(crate) start_ms: u64,
    /// When the coordinator heard that each task's outputs ended (it finished, or reported
    /// `InputsEnded`), unix ms.
    pub(crate) ended_ms: BTreeMap<TaskId, u64>,
    /// A checkpoint runs: no reconfiguration starts until it completes (`crate::checkpoint`).
    pub(crate) checkpoint_running: bool,
    /// Requests started since the last checkpoint started (a recovery to an older deployment
    /// runs them again; `crate::checkpoint`).
    pub(crate) started_requests: Vec<ReconfigRequest>,
}

impl JobState<'_> {
    /// The second `unix_ms` falls in, since the run's start second.
    pub(crate) fn second_of(&self, unix_ms: u64) -> u64 {
        (unix_ms / 1000).saturating_sub(self.start_s)
    }

    pub(crate) fn say(&self, event: ProgressEvent) {
        if let Some(tx) = &self.progress {
            let _ = tx.send(event);
        }
    }

    /// Answers a request that will not run (if a client waits) and says so.
    fn reject(&self, reply: Option<Sender<ClientReply>>, error: String) {
        if let Some(r) = reply {
            let _ = r.send(ClientReply::Rejected { error: error.clone() });
        }
        self.say(ProgressEvent::ReconfigurationRejected { error });
    }

    pub(crate) fn name(&self, t: TaskId) -> String {
        let op = self.graph.operator(t.operator).map_or("?", |o| o.name.as_str());
        format!("{op}.{}", t.index)
    }

    /// Koala: cancelled tasks not yet released, per operator (they keep serving state).
    fn retired(&self) -> BTreeMap<OperatorId, std::collections::BTreeSet<u32>> {
        self.graph.operators.iter().map(|o| (o.id, self.engine.retired(o.id))).collect()
    }

    /// Checks a request against the current deployment without changing anything.
    fn check(&self, request: &ReconfigRequest) -> Result<(), String> {
        plan_reconfiguration(
            request,
            self.engine.deployment(),
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
        let running = self.engine.running().is_some();
        match self.check(&request) {
            Ok(()) if running || !self.queue.is_empty() => {
                // Answered now, not when it starts: a client never waits out a long transfer
                // and never mistakes a queued request for a failed one.
                let ahead = self.queue.len() + usize::from(running);
                let _ = reply.send(ClientReply::Queued { ahead });
                self.queue.push_back(Queued { request, reply: None, came_ms: unix_ms() });
                Ok(())
            }
            Ok(()) => {
                self.queue.push_back(Queued { request, reply: Some(reply), came_ms: unix_ms() });
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
        while self.engine.running().is_none() && !self.checkpoint_running {
            let Some(q) = self.queue.pop_front() else { return Ok(()) };
            let epoch = self.epoch + 1;
            let current = self.engine.deployment();
            let planned = match plan_reconfiguration(
                &q.request,
                current,
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
            let (plan, who) = (planned.plan, planned.participants);
            let op = plan.operator;
            let old = current.tasks.get(&op).map_or(0, Vec::len);
            let new = plan.deployment.tasks.get(&op).map_or(0, Vec::len);
            let kind = kind_name(old, new, &q.request);
            let buckets: usize = plan.moves.values().map(Vec::len).sum();
            let created_max = plan.created.iter().max().copied();
            let actions = match self.engine.start(plan, who) {
                Ok(actions) => actions,
                Err(StartError::InputEnded) => {
                    // Finished upstream tasks take no part; with none left the input has ended.
                    // When the coordinator knew and when the request came, from its own clock, so
                    // a test can tell a request made after the end from one that waited too long.
                    let at = |ms: u64| ms.saturating_sub(self.start_ms) as f64 / 1000.0;
                    let known = self.input_ended_ms(op).map_or(-1.0, at);
                    let error = format!(
                        "skipped: every upstream task of {:?} has finished (its input ended at {known:.3} s, the request came at {:.3} s); nothing is left to reconfigure",
                        q.request.operator(),
                        at(q.came_ms)
                    );
                    self.reject(q.reply, error);
                    continue;
                }
                Err(e) => {
                    return Err(self.protocol_error(EngineError {
                        epoch,
                        origin: ErrorSource::Engine,
                        error: e.to_string(),
                    }));
                }
            };
            self.epoch = epoch;
            let description = format!(
                "{kind} {} {old}→{new} tasks, {buckets} buckets change owner ({})",
                q.request.operator(),
                self.config.protocol_label()
            );
            let started_ms = unix_ms();
            self.store.reconfiguration_started(
                self.run,
                &ReconfigurationStart {
                    epoch,
                    operator: q.request.operator().to_string(),
                    kind: kind.to_string(),
                    protocol: self.config.protocol_label(),
                    started_ms,
                    buckets_moved: buckets as u64,
                    detail: crate::request_record::to_json(&q.request).to_string(),
                },
            )?;
            if let Some(r) = q.reply {
                let _ = r.send(ClientReply::Accepted { epoch });
            }
            let second = self.second_of(started_ms);
            tracing::info!(epoch, "reconfiguration {epoch} started: {description}");
            self.started_requests.push(q.request.clone());
            self.say(ProgressEvent::ReconfigurationStarted { epoch, second, description });
            if let Some(max) = created_max {
                self.next_index.insert(op, max + 1);
            }
            self.timing = Some((Instant::now(), None));
            self.last_progress = Instant::now();
            self.execute(actions)?;
        }
        Ok(())
    }

    /// Executes the engine's actions in order.
    fn execute(&mut self, actions: Vec<EngineAction>) -> Result<(), CoordinatorError> {
        for action in actions {
            match action {
                EngineAction::Broadcast(msg) => {
                    if let (CoordinatorMessage::Drain { .. }, Some((_, drain_at))) =
                        (&msg, self.timing.as_mut())
                    {
                        *drain_at = Some(Instant::now());
                    }
                    self.workers.broadcast(&msg)?;
                }
                EngineAction::Release(task) => {
                    tracing::debug!(task = %self.name(task), "released");
                    let placed =
                        self.engine.running().map(|p| &p.deployment).unwrap_or(self.engine.deployment());
                    if let Some(w) =
                        placed.placement.get(&task).or(self.engine.deployment().placement.get(&task))
                    {
                        self.workers.send(w.0 as usize, &CoordinatorMessage::Release { task })?;
                    }
                }
                EngineAction::Completed { epoch, operator, bytes_moved } => {
                    self.completed_epoch(epoch, operator, bytes_moved)?;
                }
            }
        }
        // A completion frees the engine for the next queued request.
        self.start_next()
    }

    fn protocol_error(&self, e: EngineError) -> CoordinatorError {
        let source_task = match e.origin {
            ErrorSource::Task(t) => self.name(t),
            ErrorSource::Operator(op) => {
                format!("operator {}", self.graph.operator(op).map_or("?", |o| o.name.as_str()))
            }
            ErrorSource::Engine => "coordinator".into(),
        };
        CoordinatorError::Protocol { epoch: e.epoch, source_task, error: e.error }
    }

    /// When the coordinator knew that the input of `op` had ended (unix ms): the last end it
    /// heard of among the tasks of `op`'s upstream operators, or among `op`'s own live tasks
    /// (each ends only after its input did), whichever it knew first.
    fn input_ended_ms(&self, op: OperatorId) -> Option<u64> {
        let d = self.engine.deployment();
        let last_of = |ops: &[OperatorId]| -> Option<u64> {
            let tasks: Vec<TaskId> = ops
                .iter()
                .flat_map(|o| d.tasks.get(o).into_iter().flatten().map(move |i| TaskId::new(*o, *i)))
                .collect();
            if tasks.is_empty() {
                return None;
            }
            tasks
                .iter()
                .map(|t| self.ended_ms.get(t).copied())
                .collect::<Option<Vec<u64>>>()?
                .into_iter()
                .max()
        };
        let upstream: Vec<OperatorId> =
            self.graph.operator(op).map(|s| s.inputs.iter().map(|i| i.from).collect()).unwrap_or_default();
        [last_of(&upstream), last_of(&[op])].into_iter().flatten().min()
    }

    /// A task's ack, fed to the engine.
    pub(crate) fn on_ack(&mut self, task: TaskId, epoch: u64, ack: TaskAck) -> Result<(), CoordinatorError> {
        tracing::debug!(task = %self.name(task), epoch, ?ack, "ack");
        if ack == TaskAck::InputsEnded {
            self.ended_ms.entry(task).or_insert_with(unix_ms);
        }
        if self.engine.running().is_some_and(|p| p.epoch == epoch) {
            self.last_progress = Instant::now();
        }
        match self.engine.on_ack(task, epoch, ack) {
            Ok(actions) => self.execute(actions),
            Err(e) => Err(self.protocol_error(e)),
        }
    }

    /// A task finished (its input ended), fed to the engine.
    pub(crate) fn task_finished(&mut self, task: TaskId) -> Result<(), CoordinatorError> {
        self.ended_ms.entry(task).or_insert_with(unix_ms);
        match self.engine.task_finished(task) {
            Ok(actions) => self.execute(actions),
            Err(e) => Err(self.protocol_error(e)),
        }
    }

    /// The running reconfiguration completed: record it and say so.
    fn completed_epoch(
        &mut self,
        epoch: u64,
        op: OperatorId,
        bytes_moved: u64,
    ) -> Result<(), CoordinatorError> {
        let (started, drain_at) = self.timing.take().unwrap_or((Instant::now(), None));
        let pause_ms = drain_at.map_or(0, |d| d.elapsed().as_millis() as u64);
        let duration_ms = started.elapsed().as_millis() as u64;
        let operator = self.graph.operator(op).map_or(String::new(), |o| o.name.clone());
        let completed_ms = unix_ms();
        self.store.reconfiguration_completed(
            self.run,
            &ReconfigurationCompletion {
                epoch,
                operator,
                completed_ms,
                bytes_moved,
                pause_ms: Some(pause_ms),
            },
        )?;
        self.completed += 1;
        tracing::info!(epoch, "reconfiguration {epoch} completed");
        let lazy = self.config.protocol == Protocol::Koala;
        let second = self.second_of(completed_ms);
        self.say(ProgressEvent::ReconfigurationCompleted { epoch, second, pause_ms, duration_ms, lazy });
        Ok(())
    }

    /// Whether every source task has finished: the job's input ended.
    pub(crate) fn input_ended(&self) -> bool {
        let d = self.engine.deployment();
        self.graph.operators.iter().filter(|o| o.is_source()).all(|o| {
            d.tasks.get(&o.id).into_iter().flatten().all(|i| d.finished.contains(&TaskId::new(o.id, *i)))
        })
    }

    /// Fails the job if its input ended and nothing moved towards its end for `[runtime]
    /// end_timeout_s` (`crate::ending`), naming every unfinished task and what it waits for.
    pub(crate) fn check_ending(&self, watch: &mut EndWatch) -> Result<(), CoordinatorError> {
        let progress = crate::ending::mark(self.engine.end_progress());
        let Some(still) = watch.overdue(self.input_ended(), progress, Instant::now()) else {
            return Ok(());
        };
        let unfinished = self.engine.unfinished();
        let tasks: Vec<String> = unfinished
            .iter()
            .map(|(t, waiting)| format!("{}: {}", self.name(*t), waiting.describe(|t| self.name(t))))
            .collect();
        Err(CoordinatorError::Unfinished {
            seconds: still.as_secs_f64(),
            count: tasks.len(),
            tasks: tasks.join("; "),
        })
    }

    /// Fails the job if the running reconfiguration made no progress for too long.
    pub(crate) fn check_stalled(&self) -> Result<(), CoordinatorError> {
        let limit = Duration::from_secs_f64(self.config.runtime.reconfiguration_timeout_s);
        let Some(plan) = self.engine.running() else { return Ok(()) };
        if self.last_progress.elapsed() < limit {
            return Ok(());
        }
        let waiting: Vec<String> = self
            .engine
            .waiting_for()
            .into_iter()
            .map(|(t, what)| format!("{}:{what}", self.name(t)))
            .collect();
        Err(CoordinatorError::Timeout(format!(
            "reconfiguration epoch {} made no progress for {:.0} s ([runtime] reconfiguration_timeout_s); \
             still waiting for {}",
            plan.epoch,
            limit.as_secs_f64(),
            waiting.join(", ")
        )))
    }
}
