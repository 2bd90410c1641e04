//! The coordinator of one job: waits for its workers, places tasks, deploys, starts, collects
//! metrics into SQLite, notices a worker that disappears, and ends the job when every task has
//! finished.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::net::TcpListener;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{RecvTimeoutError, Sender, unbounded};
use koala_dataflow::JobGraph;
use koala_dataflow::graph::QueryResolver;
use koala_protocol::koala::{
    CoordinatorAction, CoordinatorEvent, KoalaCoordinator, OperatorSpec, ReconfigurationRequest,
    TaskAck as KoalaAck,
};
use koala_protocol::{
    ClientReply, CoordinatorMessage, Deployment, Protocol, ReconfigRequest, RuntimeOptions, TaskAck,
    WorkerMessage,
};
use koala_types::{OperatorId, TaskId, WorkerId};

use crate::config::{ConfigError, JobConfig};
use crate::control::{Event, Workers, accept};
use crate::metrics_store::{
    MetricSample, MetricsStore, MetricsStoreError, ReconfigurationCompletion, ReconfigurationStart, RunInfo,
};
use crate::partition::assign;
use crate::progress::{ProgressEvent, SecondAggregator, Totals};
use crate::reconfig::{Phase, Reconfiguring, kind_name, plan as plan_reconfiguration, upstream_tasks};

/// How long the coordinator waits for workers to register and to acknowledge a deployment.
pub(crate) const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a job failed.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The config is invalid.
    #[error("invalid config: {0}")]
    Config(#[from] ConfigError),
    /// A socket failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A worker's control connection closed while the job ran.
    #[error("{0} disappeared (its control connection closed); the job cannot continue without recovery")]
    WorkerLost(WorkerId),
    /// A task stopped on an error.
    #[error("task {task} failed: {error}")]
    TaskFailed {
        /// The task, `operator.index`.
        task: String,
        /// Its error.
        error: String,
    },
    /// A worker could not deploy the job.
    #[error("deployment failed on {worker}: {error}")]
    Deploy {
        /// The worker.
        worker: WorkerId,
        /// Its error.
        error: String,
    },
    /// Something did not happen in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A worker stopped sending heartbeats (stopped, hung or partitioned away).
    #[error(
        "{worker} sent no heartbeat for {seconds:.1} s (stopped or hung); the job cannot continue without recovery"
    )]
    WorkerSilent {
        /// The worker.
        worker: WorkerId,
        /// Seconds since its last message.
        seconds: f64,
    },
    /// A reconfiguration broke the protocol: the epoch is aborted and the job fails.
    #[error("reconfiguration epoch {epoch} aborted: {source_task}: {error}")]
    Protocol {
        /// The epoch.
        epoch: u64,
        /// Who reported or caused it (`operator.index`, or `coordinator`).
        source_task: String,
        /// What went wrong.
        error: String,
    },
    /// The metrics database failed.
    #[error(transparent)]
    Metrics(#[from] MetricsStoreError),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> CoordinatorError {
    let context = context.into();
    move |source| CoordinatorError::Io { context, source }
}

/// What a finished job reports.
#[derive(Clone, Debug)]
pub struct JobSummary {
    /// The run id.
    pub run: String,
    /// Wall-clock duration.
    pub elapsed: Duration,
    /// Records produced by all sources.
    pub records_in: u64,
    /// Records written by all sinks.
    pub records_out: u64,
    /// Records dropped as too late.
    pub late_dropped: u64,
    /// Where the metrics went.
    pub metrics_db: std::path::PathBuf,
    /// Reconfigurations completed.
    pub reconfigurations: u64,
}

/// A job to run.
pub struct JobRun {
    /// The config.
    pub config: JobConfig,
    /// Builds the graph of the config's query.
    pub resolver: QueryResolver,
    /// Run id (unique in the metrics database).
    pub run: String,
    /// Receives one [`ProgressEvent::Second`] per second and reconfiguration events.
    pub progress: Option<Sender<ProgressEvent>>,
}

/// Builds the graph and checks the config against it; returns tasks per operator.
pub fn resolve(config: &JobConfig, resolver: &QueryResolver) -> Result<(JobGraph, Vec<u32>), ConfigError> {
    let graph = resolver(&config.query, &config.params_text())
        .map_err(|message| ConfigError::Invalid { field: "query / params".into(), message })?;
    let parallelism = config.validate(&graph)?;
    Ok((graph, parallelism))
}

/// A reconfiguration waiting to run, and who to tell.
struct Queued {
    request: ReconfigRequest,
    reply: Option<Sender<ClientReply>>,
}

/// The running job as the coordinator tracks it.
struct JobState<'a> {
    config: &'a JobConfig,
    graph: &'a JobGraph,
    run: &'a str,
    workers: Workers,
    deployment: Deployment,
    next_index: BTreeMap<OperatorId, u32>,
    remaining: HashSet<TaskId>,
    store: MetricsStore,
    progress: Option<Sender<ProgressEvent>>,
    queue: VecDeque<Queued>,
    /// The running reconfiguration: its driver, when it started, when upstreams were paused.
    active: Option<(Reconfiguring, Instant, Option<Instant>)>,
    /// When the running reconfiguration last made progress (an ack it waited for).
    last_progress: Instant,
    /// Koala's coordinator core (the one the simulator checks): drives every keyed operator's
    /// epochs after Prepare, tracks retired tasks and releases them per epoch.
    koala: KoalaCoordinator,
    /// Koala: tasks whose inputs ended, per operator.
    inputs_ended: BTreeMap<OperatorId, BTreeSet<u32>>,
    epoch: u64,
    completed: u64,
}

impl JobState<'_> {
    fn say(&self, event: ProgressEvent) {
        if let Some(tx) = &self.progress {
            let _ = tx.send(event);
        }
    }

    fn name(&self, t: TaskId) -> String {
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
    fn submit(
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
    fn start_next(&mut self) -> Result<(), CoordinatorError> {
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
                    if let Some(r) = q.reply {
                        let _ = r.send(ClientReply::Rejected { error: error.clone() });
                    }
                    self.say(ProgressEvent::ReconfigurationRejected { error });
                    continue;
                }
            };
            let (driver, msg) = Reconfiguring::start(plan, &self.deployment, self.graph);
            if let Some(gone) = driver.upstream().iter().find(|t| !self.remaining.contains(t)) {
                let error = format!(
                    "skipped: upstream task {} has already finished (the input ended before the reconfiguration)",
                    self.name(*gone)
                );
                if let Some(r) = q.reply {
                    let _ = r.send(ClientReply::Rejected { error: error.clone() });
                }
                self.say(ProgressEvent::ReconfigurationRejected { error });
                continue;
            }
            self.epoch = epoch;
            let op = driver.plan.operator;
            let old = self.deployment.tasks.get(&op).map_or(0, Vec::len);
            let new = driver.plan.deployment.tasks.get(&op).map_or(0, Vec::len);
            let kind = kind_name(old, new, &q.request);
            let buckets: usize = driver.plan.moves.iter().map(|m| m.buckets.len()).sum();
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
            for i in &driver.plan.created {
                self.remaining.insert(TaskId::new(op, *i));
            }
            if let Some(max) = driver.plan.created.iter().max() {
                self.next_index.insert(op, max + 1);
            }
            self.workers.broadcast(&msg)?;
            self.active = Some((driver, Instant::now(), None));
            self.last_progress = Instant::now();
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

    fn on_ack(&mut self, task: TaskId, epoch: u64, ack: TaskAck) -> Result<(), CoordinatorError> {
        // Acks of Koala's keyed-operator epochs and its release bookkeeping go to the core.
        let core_ack = match ack {
            TaskAck::LocationDrained { location } => Some(KoalaAck::Drained { epoch, location }),
            TaskAck::PeerReady => Some(KoalaAck::PeerReady { epoch }),
            TaskAck::Done => Some(KoalaAck::Done { epoch }),
            _ => None,
        };
        if let Some(ack) = core_ack {
            if !matches!(ack, KoalaAck::Drained { .. }) {
                self.last_progress = Instant::now();
            }
            return self.koala_event(CoordinatorEvent::Ack { from: task, ack });
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
        if ack == TaskAck::Switched && !awaited && epoch <= self.epoch {
            // Koala upstreams confirm their switch, possibly after the epoch completed; the core
            // completes on the tasks' `Done`, which implies every marker arrived.
            return Ok(());
        }
        let Some((driver, _, drain_at)) = self.active.as_mut() else {
            return Err(
                self.protocol_bug(epoch, format!("{ack:?} from {task} with no reconfiguration running"))
            );
        };
        if driver.plan.epoch != epoch {
            let running = driver.plan.epoch;
            return Err(self.protocol_bug(epoch, format!("{ack:?} from {task} while epoch {running} runs")));
        }
        let msg = match driver.on_ack(task, &ack) {
            Ok(msg) => msg,
            Err(e) => return Err(self.protocol_bug(epoch, e)),
        };
        self.last_progress = Instant::now();
        if let Some(msg) = msg {
            if matches!(msg, CoordinatorMessage::Drain { .. }) {
                *drain_at = Some(Instant::now());
            }
            self.workers.broadcast(&msg)?;
        }
        match driver.phase() {
            Phase::Delegated => {
                let op = driver.plan.operator;
                let assignment: Vec<TaskId> = driver
                    .plan
                    .deployment
                    .routing
                    .get(&op)
                    .map(|r| r.iter().map(|i| TaskId::new(op, *i)).collect())
                    .unwrap_or_default();
                let request = ReconfigurationRequest {
                    operator: op,
                    assignment,
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
                            0,
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
                CoordinatorAction::Error(error) => return Err(self.protocol_bug(0, error.to_string())),
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
        self.deployment = driver.plan.deployment;
        // Keyed consumers of the operator now have other upstream tasks: their next epoch
        // expects markers from these.
        for (consumer, _) in self.graph.consumers(op) {
            let upstreams = upstream_tasks(&self.deployment, self.graph, consumer).into_iter().collect();
            self.koala.set_upstreams(consumer, upstreams);
        }
        self.completed += 1;
        let lazy = self.config.protocol == Protocol::Koala;
        self.say(ProgressEvent::ReconfigurationCompleted { epoch, bytes_moved, pause_ms, duration_ms, lazy });
        self.start_next()
    }

    /// Fails the job if the running reconfiguration made no progress for too long.
    fn check_stalled(&self) -> Result<(), CoordinatorError> {
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

/// Runs a job to completion on workers that connect to `listener`.
pub fn run_job(listener: TcpListener, job: JobRun) -> Result<JobSummary, CoordinatorError> {
    let config = &job.config;
    let (graph, parallelism) = resolve(config, &job.resolver)?;
    let mut schedule: Vec<(f64, ReconfigRequest)> = Vec::new();
    for (i, r) in config.reconfigurations.iter().enumerate() {
        schedule.push((r.at_s, r.request(&format!("reconfigurations[{i}]"))?));
    }
    schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut schedule: VecDeque<_> = schedule.into();
    let (events_tx, events) = unbounded();
    let mut workers = accept(&listener, config.workers, &events_tx)?;

    let deployment = plan(config, &graph, &parallelism, &workers.addrs, &job.run);
    workers.broadcast(&CoordinatorMessage::Deploy(Box::new(deployment.clone())))?;
    let mut deployed = 0;
    // Requests that arrive while the job starts are answered once it runs.
    let mut early_clients = Vec::new();
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while deployed < workers.len() {
        match events.recv_deadline(deadline) {
            Ok(Event::Worker(_, Some(WorkerMessage::Deployed))) => deployed += 1,
            Ok(Event::Worker(worker, Some(WorkerMessage::DeployFailed { error }))) => {
                let _ = workers.broadcast(&CoordinatorMessage::Shutdown);
                return Err(CoordinatorError::Deploy { worker, error });
            }
            Ok(Event::Worker(worker, None)) => return Err(CoordinatorError::WorkerLost(worker)),
            Ok(Event::Client(request, reply)) => early_clients.push((request, reply)),
            Ok(_) => {}
            Err(_) => {
                return Err(CoordinatorError::Timeout("workers did not acknowledge the deployment".into()));
            }
        }
    }

    if let Some(dir) = config.metrics_path().parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    }
    let mut store = MetricsStore::open(&config.metrics_path())?;
    let started_ms = unix_ms();
    store.begin_run(&RunInfo {
        run: job.run.clone(),
        started_ms,
        query: config.query.clone(),
        protocol: config.protocol.name().into(),
        config: toml::to_string(config).unwrap_or_default(),
    })?;
    workers.broadcast(&CoordinatorMessage::Start)?;
    let started = Instant::now();
    let remaining: HashSet<TaskId> = deployment.placement.keys().copied().collect();
    tracing::info!(run = %job.run, tasks = remaining.len(), "job started");
    let next_index =
        deployment.tasks.iter().map(|(op, t)| (*op, t.iter().max().map_or(0, |m| m + 1))).collect();
    let mut state = JobState {
        config,
        graph: &graph,
        run: &job.run,
        workers,
        deployment,
        next_index,
        remaining,
        store,
        progress: job.progress.clone(),
        queue: VecDeque::new(),
        active: None,
        last_progress: Instant::now(),
        koala: KoalaCoordinator::new(),
        inputs_ended: BTreeMap::new(),
        epoch: 0,
        completed: 0,
    };
    if config.protocol == Protocol::Koala {
        register_keyed_operators(&mut state)?;
    }
    let mut stop_sent = false;
    let mut seconds = SecondAggregator::new(&graph, started_ms / 1000);
    let mut totals = Totals::default();
    let heartbeat_timeout = Duration::from_secs_f64(config.runtime.heartbeat_timeout_s);
    let mut last_seen: BTreeMap<WorkerId, Instant> =
        state.deployment.workers.keys().map(|w| (*w, Instant::now())).collect();
    // Every error ends the loop, so the workers are always told to shut down.
    let event_loop = || -> Result<(), CoordinatorError> {
        for (request, reply) in early_clients {
            state.submit(request, reply)?;
        }
        loop {
            if state.remaining.is_empty() {
                return Ok(());
            }
            if let Some((worker, seen)) = last_seen.iter().min_by_key(|(_, t)| **t)
                && seen.elapsed() > heartbeat_timeout
            {
                return Err(CoordinatorError::WorkerSilent {
                    worker: *worker,
                    seconds: seen.elapsed().as_secs_f64(),
                });
            }
            state.check_stalled()?;
            if let Some(d) = config.duration_s
                && !stop_sent
                && started.elapsed() >= Duration::from_secs(d)
            {
                stop_sent = true;
                state.workers.broadcast(&CoordinatorMessage::StopSources)?;
            }
            while schedule.front().is_some_and(|(at, _)| started.elapsed().as_secs_f64() >= *at) {
                if let Some((_, request)) = schedule.pop_front() {
                    state.queue.push_back(Queued { request, reply: None });
                }
                state.start_next()?;
            }
            let event = events.recv_timeout(Duration::from_millis(20));
            if let Ok(Event::Worker(worker, Some(_))) = &event {
                last_seen.insert(*worker, Instant::now());
            }
            match event {
                Ok(Event::Worker(_, Some(WorkerMessage::Metrics(samples)))) => {
                    totals.add(&graph, &samples);
                    seconds.add(&samples);
                    let rows: Vec<MetricSample> = samples
                        .iter()
                        .map(|s| MetricSample {
                            time_s: s.time_s,
                            task: state.name(s.task),
                            metric: s.metric.clone(),
                            value: s.value,
                        })
                        .collect();
                    state.store.insert_samples(&job.run, &rows)?;
                }
                Ok(Event::Worker(_, Some(WorkerMessage::TaskFinished { task }))) => {
                    state.remaining.remove(&task);
                }
                Ok(Event::Worker(_, Some(WorkerMessage::TaskFailed { task, error }))) => {
                    return Err(CoordinatorError::TaskFailed { task: state.name(task), error });
                }
                Ok(Event::Worker(_, Some(WorkerMessage::TaskAck { task, epoch, ack }))) => {
                    state.on_ack(task, epoch, ack)?;
                }
                Ok(Event::Worker(worker, None)) => return Err(CoordinatorError::WorkerLost(worker)),
                Ok(Event::Worker(_, Some(WorkerMessage::Heartbeat))) => {}
                Ok(Event::Worker(worker, Some(other))) => {
                    let what = format!("{other:?}").chars().take(60).collect::<String>();
                    return Err(CoordinatorError::Protocol {
                        epoch: state.epoch,
                        source_task: worker.to_string(),
                        error: format!("unexpected message while the job runs: {what}"),
                    });
                }
                Ok(Event::Client(request, reply)) => state.submit(request, reply)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CoordinatorError::Timeout("event channel closed".into()));
                }
            }
            if let Some(tx) = &job.progress {
                for p in seconds.complete(unix_ms() / 1000) {
                    let _ = tx.send(ProgressEvent::Second(p));
                }
            }
        }
    };
    let result = event_loop();
    let _ = state.workers.broadcast(&CoordinatorMessage::Shutdown);
    result?;
    if let Some((driver, ..)) = &state.active {
        tracing::warn!(waiting = ?driver.waiting_for(), "the job ended during a reconfiguration");
    }
    for q in state.queue.drain(..) {
        if let Some(r) = q.reply {
            let _ = r.send(ClientReply::Rejected { error: "the job ended first".into() });
        }
    }
    if let Some(tx) = &job.progress {
        for p in seconds.complete(u64::MAX) {
            let _ = tx.send(ProgressEvent::Second(p));
        }
    }
    let completed = state.completed;
    drop(state);
    Ok(JobSummary {
        run: job.run,
        elapsed: started.elapsed(),
        records_in: totals.records_in,
        records_out: totals.records_out,
        late_dropped: totals.late_dropped,
        metrics_db: config.metrics_path(),
        reconfigurations: completed,
    })
}

/// Koala: registers every keyed operator with the coordinator core.
fn register_keyed_operators(state: &mut JobState<'_>) -> Result<(), CoordinatorError> {
    for spec in state.graph.operators.iter().filter(|o| o.is_stateful()) {
        let op = spec.id;
        let assignment: Vec<TaskId> = state
            .deployment
            .routing
            .get(&op)
            .map(|r| r.iter().map(|i| TaskId::new(op, *i)).collect())
            .unwrap_or_default();
        let upstreams = upstream_tasks(&state.deployment, state.graph, op).into_iter().collect();
        state.koala.register(OperatorSpec { operator: op, assignment, upstreams }).map_err(|e| {
            CoordinatorError::Protocol { epoch: 0, source_task: "coordinator".into(), error: e.to_string() }
        })?;
    }
    Ok(())
}

/// Places tasks round-robin over workers and assigns buckets of stateful operators.
fn plan(
    config: &JobConfig,
    graph: &JobGraph,
    parallelism: &[u32],
    workers: &BTreeMap<WorkerId, String>,
    run: &str,
) -> Deployment {
    let worker_ids: Vec<WorkerId> = workers.keys().copied().collect();
    let mut placement = BTreeMap::new();
    let mut tasks = BTreeMap::new();
    let mut routing = BTreeMap::new();
    for (op, p) in graph.operators.iter().zip(parallelism) {
        tasks.insert(op.id, (0..*p).collect::<Vec<u32>>());
        for i in 0..*p {
            placement.insert(TaskId::new(op.id, i), worker_ids[i as usize % worker_ids.len()]);
        }
        if op.is_stateful() {
            let live: Vec<u32> = (0..*p).collect();
            routing.insert(op.id, assign(config.partition_policy, config.num_buckets, &live));
        }
    }
    Deployment {
        run: run.to_string(),
        query: config.query.clone(),
        query_params: config.params_text(),
        workers: workers.clone(),
        placement,
        tasks,
        epoch: 0,
        routing,
        num_buckets: config.num_buckets,
        protocol: config.protocol,
        extra_keys: config.extra_keys,
        options: RuntimeOptions {
            batch_records: config.runtime.batch_records,
            linger_ms: config.runtime.linger_ms,
            channel_capacity: config.runtime.channel_capacity,
            sink_dir: config.output_dir.to_string_lossy().into_owned(),
        },
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
