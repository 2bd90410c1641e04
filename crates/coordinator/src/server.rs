//! The coordinator of one job: waits for its workers, places tasks, deploys, starts, collects
//! metrics into SQLite, notices a worker that disappears, and ends the job when every task has
//! finished.

use std::collections::{BTreeMap, VecDeque};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, Sender, unbounded};
use koala_dataflow::JobGraph;
use koala_dataflow::graph::QueryResolver;
use koala_protocol::engine::Engine;
use koala_protocol::{ClientReply, CoordinatorMessage, ReconfigRequest, WorkerMessage};
use koala_types::WorkerId;
use koala_types::handshake::Gate;

use crate::clock::unix_ms;
use crate::config::{ConfigError, JobConfig};
use crate::control::{Event, STARTUP_TIMEOUT, accept};
use crate::ending::EndWatch;
use crate::error::{CoordinatorError, io};
use crate::http::HttpServer;
use crate::http::live::{JobInfo, Live, Phase, Running};
use crate::job::{JobState, Queued};
use crate::metrics_store::{MetricSample, MetricsStore, RunInfo};
use crate::placement::initial_deployment;
use crate::progress::{ProgressEvent, SecondAggregator, Totals};
use crate::reconfig::operator_inputs;

/// How long it waits for the acknowledgement when workers first restore warm state (GBs).
const WARM_STARTUP_TIMEOUT: Duration = Duration::from_secs(600);

/// What a finished job reports.
#[derive(Clone, Debug)]
pub struct JobSummary {
    /// The run id.
    pub run: String,
    /// Wall-clock duration.
    pub elapsed: Duration,
    /// Records produced by all sources, those a recovery replayed each time they were taken.
    pub records_in: u64,
    /// Records written by all sinks, those written again after a recovery each time.
    pub records_out: u64,
    /// Records the sources took once each, whatever a recovery replayed (Σ of their latest
    /// `records_total`; `None` if none reported it).
    pub records_in_once: Option<u64>,
    /// Records the sinks wrote once each, likewise.
    pub records_out_once: Option<u64>,
    /// Records recoveries made the sources take again, at least (see
    /// [`crate::progress::Totals::replayed_at_least`]).
    pub replayed_at_least: u64,
    /// Records recoveries made the sinks write again, at least.
    pub rewritten_at_least: u64,
    /// Records dropped as too late.
    pub late_dropped: u64,
    /// Where the metrics went.
    pub metrics_db: std::path::PathBuf,
    /// Reconfigurations completed.
    pub reconfigurations: u64,
    /// Completed checkpoints in order, without their deployments (empty with checkpoints off).
    pub checkpoints: Vec<crate::metrics_store::CheckpointRecord>,
    /// Recoveries after a lost worker or a failed task, in order.
    pub recoveries: Vec<crate::metrics_store::RecoveryRecord>,
    /// Checkpoints skipped: due while the previous one was still being written.
    pub checkpoints_skipped: u64,
    /// Whether the job was asked to stop (`JobRun::stop`) before its input ended: its sources
    /// were cut short and the run is recorded as interrupted.
    pub interrupted: bool,
    /// Records each source operator skipped as malformed (a Kafka record its format could not
    /// decode), by operator name; sources that skipped none are absent.
    pub malformed: std::collections::BTreeMap<String, u64>,
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
    /// Once set (a signal handler sets it on Ctrl-C or SIGTERM), the sources end now, as at
    /// `duration_s`: the job drains what is in flight and ends normally, with its summary.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Where to serve the HTTP API, the dashboard and `/metrics` while the job runs (`None`: no
    /// HTTP server).
    pub http: Option<TcpListener>,
    /// Resume a stopped job from this completed checkpoint (`koala run --resume`;
    /// `crate::resume`): its deployment is placed over the workers that register, sources rewind,
    /// its pending requests are queued, and `duration_s` and the reconfiguration schedule count
    /// from its elapsed time.
    pub resume: Option<crate::resume::CheckpointMetadata>,
    /// The job token: every connection to the control port presents it (required unless the
    /// port is on loopback), and so do POSTs to the HTTP API.
    pub token: Option<koala_types::handshake::Token>,
    /// TLS, if the job runs it (`[tls]`): the control port and the HTTP API accept only TLS.
    pub tls: Option<koala_types::tls::Tls>,
}

/// Builds the graph and checks the config against it; returns tasks per operator.
pub fn resolve(config: &JobConfig, resolver: &QueryResolver) -> Result<(JobGraph, Vec<u32>), ConfigError> {
    let graph = resolver(&config.query, &config.params_text())
        .map_err(|message| ConfigError::Invalid { field: "query / params".into(), message })?;
    let parallelism = config.validate(&graph)?;
    Ok((graph, parallelism))
}

/// Logs a worker's memory report and passes it on to `koala run`'s printer.
fn memory_report(job: &JobRun, worker: koala_types::WorkerId, report: koala_protocol::memory::MemoryReport) {
    tracing::debug!("{}", crate::progress::memory_lines(worker, &report));
    if let Some(tx) = &job.progress {
        let _ = tx.send(ProgressEvent::Memory { worker, report });
    }
}

/// Runs a job to completion on workers that connect to `listener`.
pub fn run_job(listener: TcpListener, mut job: JobRun) -> Result<JobSummary, CoordinatorError> {
    let http = job.http.take();
    let config = &job.config;
    let (graph, parallelism) = resolve(config, &job.resolver)?;
    koala_types::name_operators(graph.operators.iter().map(|o| o.name.clone()).collect());
    let mut schedule: Vec<(f64, ReconfigRequest)> = Vec::new();
    let resumed_s = job.resume.as_ref().map_or(0.0, |m| m.elapsed_ms as f64 / 1000.0);
    for (i, r) in config.reconfigurations.iter().enumerate() {
        // A resumed job: what was due before its checkpoint is in the deployment or pending.
        if r.at_s > resumed_s || job.resume.is_none() {
            schedule.push((r.at_s - resumed_s, r.request(&format!("reconfigurations[{i}]"))?));
        }
    }
    schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut schedule: VecDeque<_> = schedule.into();
    let (events_tx, events) = unbounded();
    let control_addr = listener.local_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
    let mut info = JobInfo::new(
        &job.run,
        &config.query,
        config.protocol_label(),
        control_addr,
        config.metrics_path(),
        &graph,
    );
    info.checkpoint_interval_ms = config.checkpoint_interval_ms;
    info.checkpoints_retained = config.checkpoints_retained;
    let live = Arc::new(Live::new(info));
    // Stops when dropped, whichever way this function returns.
    let ip = listener.local_addr().map_err(io("reading the control address"))?.ip();
    let gate = Gate::for_listener("control port", ip, job.token.clone(), config.coordinator.gate_limits())
        .map_err(|message| ConfigError::Invalid { field: "coordinator.token_file".into(), message })?;
    if job.tls.as_ref().is_some_and(|t| !t.can_listen()) {
        return Err(ConfigError::Invalid {
            field: "tls.cert".into(),
            message: "TLS is on ([tls] ca) but the coordinator has no certificate to listen with: give \
                      [tls] cert and key (`koala certs --hosts HOST --out DIR` makes them)"
                .into(),
        }
        .into());
    }
    let _http = match http {
        Some(l) => {
            Some(HttpServer::start(l, live.clone(), events_tx.clone(), job.token.clone(), job.tls.clone())?)
        }
        None => None,
    };
    let (mut workers, mut registrations) =
        accept(&listener, gate, job.tls.clone(), config.workers, &events_tx)?;

    let deployment = match &job.resume {
        None => initial_deployment(config, &graph, &parallelism, &workers.addrs, &job.run),
        Some(meta) => {
            let mut d = meta.deployment.clone();
            crate::resume::place(&mut d, &workers.addrs);
            d.run = job.run.clone();
            d.options.checkpoint.restore = Some(meta.point.clone());
            tracing::info!(checkpoint = meta.point.id, "resuming the job from checkpoint {}", meta.point.id);
            crate::resume::log_positions(&meta.point);
            d
        }
    };
    workers.broadcast(&CoordinatorMessage::Deploy(Box::new(deployment.clone()), config.state_options()))?;
    let mut deployed = 0;
    // Requests that arrive while the job starts are answered once it runs.
    let mut early_clients = Vec::new();
    let wait = if config.warm_state.is_some() { WARM_STARTUP_TIMEOUT } else { STARTUP_TIMEOUT };
    let deadline = Instant::now() + wait;
    while deployed < workers.len() {
        match events.recv_deadline(deadline) {
            Ok(Event::Worker(_, Some(WorkerMessage::Deployed))) => deployed += 1,
            Ok(Event::Worker(worker, Some(WorkerMessage::Memory(report)))) => {
                memory_report(&job, worker, report)
            }
            Ok(Event::Worker(worker, Some(WorkerMessage::DeployFailed { error }))) => {
                let _ = workers.broadcast(&CoordinatorMessage::Shutdown);
                return Err(CoordinatorError::Deploy { worker, error });
            }
            Ok(Event::Worker(worker, None)) => return Err(CoordinatorError::WorkerLost(worker)),
            Ok(Event::Client(request, reply)) => early_clients.push((request, reply)),
            Ok(_) => {}
            Err(_) => {
                return Err(CoordinatorError::Timeout(format!(
                    "workers did not acknowledge the deployment within {} s{}",
                    wait.as_secs(),
                    if config.warm_state.is_some() { " (restoring warm state)" } else { "" }
                )));
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
        protocol: config.protocol_label(),
        config: toml::to_string(config).unwrap_or_default(),
    })?;
    workers.broadcast(&CoordinatorMessage::Start)?;
    let started = Instant::now();
    tracing::info!(run = %job.run, tasks = deployment.placement.len(), protocol = %deployment.protocol.name(), "job started");
    let next_index =
        deployment.tasks.iter().map(|(op, t)| (*op, t.iter().max().map_or(0, |m| m + 1))).collect();
    // The restore point belongs to this one deployment: tasks a later reconfiguration creates
    // start empty, never from the checkpoint.
    let mut deployment = deployment;
    deployment.options.checkpoint.restore = None;
    let mut checkpoints = crate::checkpoint::Checkpoints::new(config, &deployment, job.resume.as_ref())?;
    let mut engine = Engine::new(deployment, operator_inputs(&graph)).map_err(|e| {
        CoordinatorError::Protocol { epoch: 0, source_task: "coordinator".into(), error: e.to_string() }
    })?;
    engine.set_drrs_options(config.drrs);
    live.update(|now| {
        now.phase = Phase::Running;
        now.started_ms = Some(started_ms);
        now.deployment = Some(engine.deployment().clone());
    });
    let mut published = (0, None, 0, 0, 0);
    let mut state = JobState {
        config,
        graph: &graph,
        run: &job.run,
        workers,
        engine,
        next_index,
        store,
        totals: Totals::default(),
        progress: job.progress.clone(),
        queue: job
            .resume
            .iter()
            .flat_map(|m| m.pending.iter())
            .map(|request| Queued { request: request.clone(), reply: None, came_ms: started_ms })
            .collect(),
        timing: None,
        last_progress: Instant::now(),
        epoch: 0,
        completed: 0,
        start_s: started_ms / 1000,
        start_ms: started_ms,
        ended_ms: BTreeMap::new(),
        checkpoint_running: false,
        started_requests: Vec::new(),
    };
    let mut stop_sent = false;
    let mut interrupted = false;
    let mut autoscale = crate::autoscale::driver::Driver::new(config, &graph)?;
    let mut seconds = SecondAggregator::new(&graph, started_ms / 1000);
    if let Some((operator, budget)) = autoscale.as_ref().map(|a| a.driven()) {
        seconds = seconds.driving(operator, budget);
    }
    let heartbeat_timeout = Duration::from_secs_f64(config.runtime.heartbeat_timeout_s);
    let mut end_watch = EndWatch::new(Duration::from_secs_f64(config.runtime.end_timeout_s));
    let mut last_seen: BTreeMap<WorkerId, Instant> =
        state.engine.deployment().workers.keys().map(|w| (*w, Instant::now())).collect();
    // Every error ends the loop, so the workers are always told to shut down.
    let event_loop = || -> Result<(), CoordinatorError> {
        for (request, reply) in early_clients {
            state.submit(request, reply)?;
        }
        // A resumed job's pending requests.
        state.start_next()?;
        loop {
            if state.engine.all_finished() {
                return Ok(());
            }
            // Only with nothing queued: a coordinator that was busy has heartbeats waiting.
            if let Some((worker, seen)) = last_seen.iter().min_by_key(|(_, t)| **t)
                && seen.elapsed() > heartbeat_timeout
                && events.is_empty()
            {
                let lost =
                    CoordinatorError::WorkerSilent { worker: *worker, seconds: seen.elapsed().as_secs_f64() };
                let Some(c) = checkpoints.as_mut().filter(|c| c.may_recover() && !sinks_finished(&state))
                else {
                    return Err(lost);
                };
                let ids = c.recover(&mut state, &mut registrations, &events, &lost)?;
                last_seen = ids.into_iter().map(|w| (w, Instant::now())).collect();
                // The restored sources run until they are told to stop again.
                stop_sent = false;
                continue;
            }
            if let Some(c) = checkpoints.as_mut() {
                c.tick(&mut state)?;
            }
            state.check_stalled()?;
            state.check_ending(&mut end_watch)?;
            let asked_to_stop =
                job.stop.as_ref().is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
            let duration_over =
                config.duration_s.is_some_and(|d| started.elapsed().as_secs_f64() + resumed_s >= d as f64);
            if !stop_sent && (asked_to_stop || duration_over) {
                stop_sent = true;
                if asked_to_stop {
                    interrupted = true;
                    tracing::info!("asked to stop: the sources end now and the job drains what is in flight");
                }
                state.workers.broadcast(&CoordinatorMessage::StopSources)?;
            }
            while schedule.front().is_some_and(|(at, _)| started.elapsed().as_secs_f64() >= *at) {
                if let Some((_, request)) = schedule.pop_front() {
                    state.queue.push_back(Queued { request, reply: None, came_ms: unix_ms() });
                }
                state.start_next()?;
            }
            let event = events.recv_timeout(Duration::from_millis(20));
            if let Ok(Event::Worker(worker, _)) = &event
                && !state.workers.contains(*worker)
            {
                // A worker of the job before a recovery: it no longer takes part.
                continue;
            }
            if let Ok(Event::Worker(worker, Some(_))) = &event {
                last_seen.insert(*worker, Instant::now());
            }
            match event {
                Ok(Event::Worker(_, Some(WorkerMessage::Metrics(samples)))) => {
                    live.add_samples(&samples);
                    state.totals.add(&graph, &samples);
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
                    state.task_finished(task)?;
                    if let Some(c) = checkpoints.as_mut() {
                        c.on_finished(&mut state, task)?;
                    }
                }
                Ok(Event::Worker(worker, Some(WorkerMessage::CheckpointAck { task, id, ack }))) => {
                    let Some(c) = checkpoints.as_mut() else {
                        return Err(CoordinatorError::Protocol {
                            epoch: state.epoch,
                            source_task: worker.to_string(),
                            error: format!("a checkpoint {id} acknowledgement in a job without checkpoints"),
                        });
                    };
                    c.on_ack(&mut state, task, id, ack)?;
                }
                Ok(Event::Worker(_, Some(WorkerMessage::TaskFailed { task, error }))) => {
                    // With checkpoints, a failed task rolls the job back like a lost worker does:
                    // often it failed because a worker died (its channel to a task there broke)
                    // before the coordinator heard of the death.
                    let failed = CoordinatorError::TaskFailed { task: state.name(task), error };
                    let Some(c) = checkpoints.as_mut().filter(|c| c.may_recover() && !sinks_finished(&state))
                    else {
                        return Err(failed);
                    };
                    let ids = c.recover(&mut state, &mut registrations, &events, &failed)?;
                    last_seen = ids.into_iter().map(|w| (w, Instant::now())).collect();
                    stop_sent = false;
                }
                Ok(Event::Worker(_, Some(WorkerMessage::TaskAck { task, epoch, ack }))) => {
                    state.on_ack(task, epoch, ack)?;
                }
                Ok(Event::Worker(worker, None)) => {
                    let lost = CoordinatorError::WorkerLost(worker);
                    let Some(c) = checkpoints.as_mut().filter(|c| c.may_recover() && !sinks_finished(&state))
                    else {
                        return Err(lost);
                    };
                    let ids = c.recover(&mut state, &mut registrations, &events, &lost)?;
                    last_seen = ids.into_iter().map(|w| (w, Instant::now())).collect();
                    stop_sent = false;
                }
                Ok(Event::Worker(_, Some(WorkerMessage::Heartbeat))) => {}
                Ok(Event::Worker(_, Some(WorkerMessage::FirstOutput { unix_ms, .. }))) => {
                    if let Some(c) = checkpoints.as_mut() {
                        c.on_first_output(&mut state, unix_ms)?;
                    }
                }
                Ok(Event::Worker(worker, Some(WorkerMessage::Memory(report)))) => {
                    memory_report(&job, worker, report)
                }
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
            // One aggregator: the seconds every task has reported feed the policy and the
            // progress lines alike.
            let complete = seconds.complete(unix_ms() / 1000);
            if let Some(a) = autoscale.as_mut() {
                a.tick(&mut state, stop_sent, &complete)?;
            }
            publish(&live, &state, &mut published);
            if let Some(tx) = &job.progress {
                for s in complete {
                    let _ = tx.send(ProgressEvent::Second(s.progress));
                }
            }
        }
    };
    let result = event_loop();
    record_end(&mut state.store, &job.run, &result, interrupted);
    live.update(|now| now.phase = Phase::Ended);
    let _ = state.workers.broadcast(&CoordinatorMessage::Shutdown);
    result?;
    if state.engine.running().is_some() {
        tracing::warn!(waiting = ?state.engine.waiting_for(), "the job ended during a reconfiguration");
    }
    for q in state.queue.drain(..) {
        if let Some(r) = q.reply {
            let _ = r.send(ClientReply::Rejected { error: "the job ended first".into() });
        }
    }
    if let Some(tx) = &job.progress {
        for s in seconds.complete(u64::MAX) {
            let _ = tx.send(ProgressEvent::Second(s.progress));
        }
    }
    let completed = state.completed;
    // Every sample is stored now. Koala's and DRRS's tasks acknowledge no bytes (their state
    // moves after the hand-over or in the background): each of their reconfigurations gets the
    // report's figure. Stop-and-restart's and Remote's acknowledged hand-over is exact per
    // reconfiguration already (their tasks' `state_bytes_eager` count the same bytes).
    if config.protocol.keeps_processing() {
        crate::report::settle_bytes_moved(&mut state.store, &job.run)?;
    }
    let totals = std::mem::take(&mut state.totals);
    drop(state);
    let (checkpoint_records, checkpoints_skipped, recoveries) =
        checkpoints.map(|c| (c.completed, c.skipped, c.recoveries)).unwrap_or_default();
    Ok(JobSummary {
        run: job.run,
        elapsed: started.elapsed(),
        records_in: totals.records_in,
        records_out: totals.records_out,
        records_in_once: totals.records_in_once(),
        records_out_once: totals.records_out_once(),
        replayed_at_least: totals.replayed_at_least,
        rewritten_at_least: totals.rewritten_at_least,
        late_dropped: totals.late_dropped,
        metrics_db: config.metrics_path(),
        reconfigurations: completed,
        checkpoints: checkpoint_records,
        checkpoints_skipped,
        recoveries,
        interrupted,
        malformed: totals.malformed,
    })
}

/// Records in the metrics store how the run ended: failed (`result`'s error), interrupted (asked
/// to stop before its input ended) or finished. A failure to record is logged: the run's own
/// outcome matters more.
fn record_end(store: &mut MetricsStore, run: &str, result: &Result<(), CoordinatorError>, interrupted: bool) {
    use crate::metrics_store::RunStatus;
    let (status, detail) = match result {
        Err(e) => (RunStatus::Failed, Some(e.to_string())),
        Ok(()) if interrupted => (
            RunStatus::Interrupted,
            Some("asked to stop before its input ended: the sources were cut short".into()),
        ),
        Ok(()) => (RunStatus::Finished, None),
    };
    if let Err(e) = store.end_run(run, status, unix_ms(), detail.as_deref()) {
        tracing::warn!(error = %e, "could not record how the run ended");
    }
}

/// Hands the deployment and the reconfiguration queue to the HTTP API when they changed
/// (`published`: what it has).
fn publish(live: &Live, state: &JobState<'_>, published: &mut (u64, Option<u64>, usize, u64, usize)) {
    let d = state.engine.deployment();
    let running = state.engine.running();
    let now = (d.epoch, running.map(|p| p.epoch), state.queue.len(), state.completed, d.finished.len());
    if now == *published {
        return;
    }
    *published = now;
    let running = running.map(|p| Running {
        epoch: p.epoch,
        operator: state.graph.operator(p.operator).map_or(String::new(), |o| o.name.clone()),
    });
    let (deployment, queued, completed) = (d.clone(), state.queue.len(), state.completed);
    live.update(|snapshot| {
        snapshot.deployment = Some(deployment);
        snapshot.running = running;
        snapshot.queued = queued;
        snapshot.completed = completed;
    });
}

/// Whether every sink task finished: its output is final, so a lost worker then ends the job
/// as before instead of replaying (a restored sink would write it again).
fn sinks_finished(state: &JobState) -> bool {
    let d = state.engine.deployment();
    state
        .graph
        .operators
        .iter()
        .filter(|o| matches!(o.kind, koala_dataflow::OperatorKind::Sink { .. }))
        .flat_map(|o| {
            d.tasks.get(&o.id).into_iter().flatten().map(move |i| koala_types::TaskId::new(o.id, *i))
        })
        .all(|t| d.finished.contains(&t))
}
