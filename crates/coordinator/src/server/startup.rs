//! The phases before a job runs: its reconfiguration schedule, the ports it serves (control,
//! HTTP), the deployment every worker acknowledges, and the start (metrics run, engine, state).

use std::collections::VecDeque;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use koala_dataflow::JobGraph;
use koala_protocol::engine::Engine;
use koala_protocol::{ClientReply, CoordinatorMessage, Deployment, ReconfigRequest, WorkerMessage};
use koala_types::handshake::Gate;

use super::{JobRun, memory_report};
use crate::checkpoint::Checkpoints;
use crate::clock::unix_ms;
use crate::config::ConfigError;
use crate::control::{Event, Registrations, STARTUP_TIMEOUT, Workers, accept};
use crate::error::{CoordinatorError, io};
use crate::http::HttpServer;
use crate::http::live::{JobInfo, Live, Phase};
use crate::job::{JobState, Queued};
use crate::metrics_store::{MetricsStore, RunInfo};
use crate::placement::initial_deployment;
use crate::progress::Totals;
use crate::reconfig::operator_inputs;

/// Client requests that came while the job started: answered once it runs.
pub(super) type EarlyClients = Vec<(ReconfigRequest, Sender<ClientReply>)>;

/// How long it waits for the acknowledgement when workers first restore warm state (GBs).
const WARM_STARTUP_TIMEOUT: Duration = Duration::from_secs(600);

/// The config's reconfigurations, due times in seconds from this start, in order; and the
/// seconds a resumed job had already run (what was due before its checkpoint is in the
/// deployment or pending, so it is left out).
pub(super) fn schedule(job: &JobRun) -> Result<(VecDeque<(f64, ReconfigRequest)>, f64), CoordinatorError> {
    let resumed_s = job.resume.as_ref().map_or(0.0, |m| m.elapsed_ms as f64 / 1000.0);
    let mut schedule: Vec<(f64, ReconfigRequest)> = Vec::new();
    for (i, r) in job.config.reconfigurations.iter().enumerate() {
        if r.at_s > resumed_s || job.resume.is_none() {
            schedule.push((r.at_s - resumed_s, r.request(&format!("reconfigurations[{i}]"))?));
        }
    }
    schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok((schedule.into(), resumed_s))
}

/// What the job serves while it runs: the live view the HTTP API reads, the HTTP server (stops
/// when dropped), and the workers that registered on the control port.
pub(super) struct Serving {
    pub(super) live: Arc<Live>,
    pub(super) http: Option<HttpServer>,
    pub(super) workers: Workers,
    pub(super) registrations: Registrations,
}

/// Opens the HTTP API (if `http`) and waits on `listener` for the config's workers.
pub(super) fn serve(
    job: &JobRun,
    listener: &TcpListener,
    http: Option<TcpListener>,
    graph: &JobGraph,
    events: &Sender<Event>,
) -> Result<Serving, CoordinatorError> {
    let config = &job.config;
    let control_addr = listener.local_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
    let mut info = JobInfo::new(
        &job.run,
        &config.query,
        config.protocol_label(),
        control_addr,
        config.metrics_path(),
        graph,
    );
    info.checkpoint_interval_ms = config.checkpoint_interval_ms;
    info.checkpoints_retained = config.checkpoints_retained;
    let live = Arc::new(Live::new(info));
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
    let http = match http {
        Some(l) => {
            Some(HttpServer::start(l, live.clone(), events.clone(), job.token.clone(), job.tls.clone())?)
        }
        None => None,
    };
    let (workers, registrations) = accept(listener, gate, job.tls.clone(), config.workers, events)?;
    Ok(Serving { live, http, workers, registrations })
}

/// Sends every worker the first deployment (a resumed job's from its checkpoint) and waits
/// until all acknowledge it. Returns the deployment and the client requests that came meanwhile
/// (answered once the job runs).
pub(super) fn deploy(
    job: &JobRun,
    graph: &JobGraph,
    parallelism: &[u32],
    workers: &mut Workers,
    events: &Receiver<Event>,
) -> Result<(Deployment, EarlyClients), CoordinatorError> {
    let config = &job.config;
    let deployment = match &job.resume {
        None => initial_deployment(config, graph, parallelism, &workers.addrs, &job.run),
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
    let mut early_clients = Vec::new();
    let wait = if config.warm_state.is_some() { WARM_STARTUP_TIMEOUT } else { STARTUP_TIMEOUT };
    let deadline = Instant::now() + wait;
    while deployed < workers.len() {
        match events.recv_deadline(deadline) {
            Ok(Event::Worker(_, Some(WorkerMessage::Deployed))) => deployed += 1,
            Ok(Event::Worker(worker, Some(WorkerMessage::Memory(report)))) => {
                memory_report(job, worker, report)
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
    Ok((deployment, early_clients))
}

/// A started job: its state, its checkpoints (with checkpoints on) and when it started.
pub(super) struct Started<'a> {
    pub(super) state: JobState<'a>,
    pub(super) checkpoints: Option<Checkpoints>,
    pub(super) started: Instant,
}

/// Opens the run in the metrics store, tells every worker to start, and sets up the engine and
/// the job's state from the acknowledged `deployment`.
pub(super) fn start<'a>(
    job: &'a JobRun,
    graph: &'a JobGraph,
    mut deployment: Deployment,
    mut workers: Workers,
    live: &Live,
) -> Result<Started<'a>, CoordinatorError> {
    let config = &job.config;
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
    deployment.options.checkpoint.restore = None;
    let checkpoints = Checkpoints::new(config, &deployment, job.resume.as_ref())?;
    let mut engine = Engine::new(deployment, operator_inputs(graph)).map_err(|e| {
        CoordinatorError::Protocol { epoch: 0, source_task: "coordinator".into(), error: e.to_string() }
    })?;
    engine.set_drrs_options(config.drrs);
    live.update(|now| {
        now.phase = Phase::Running;
        now.started_ms = Some(started_ms);
        now.deployment = Some(engine.deployment().clone());
    });
    let state = JobState {
        config,
        graph,
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
        ended_ms: Default::default(),
        checkpoint_running: false,
        started_requests: Vec::new(),
    };
    Ok(Started { state, checkpoints, started })
}
