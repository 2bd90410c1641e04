//! The coordinator of one job: waits for its workers, places tasks, deploys, starts, collects
//! metrics into SQLite, notices a worker that disappears, and ends the job when every task has
//! finished.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{RecvTimeoutError, Sender, unbounded};
use koala_dataflow::JobGraph;
use koala_dataflow::graph::QueryResolver;
use koala_protocol::{CoordinatorMessage, Deployment, RuntimeOptions, TaskSample, WorkerMessage};
use koala_types::frame::{read_frame, write_frame};
use koala_types::{OperatorId, TaskId, WorkerId, metric};

use crate::config::{ConfigError, JobConfig};
use crate::metrics_store::{MetricSample, MetricsStore, MetricsStoreError, RunInfo};
use crate::partition::assign;

/// How long the coordinator waits for workers to register and to acknowledge a deployment.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

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
    #[error(
        "{0} disappeared (its control connection closed); the job cannot continue without recovery"
    )]
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
    /// The metrics database failed.
    #[error(transparent)]
    Metrics(#[from] MetricsStoreError),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> CoordinatorError {
    let context = context.into();
    move |source| CoordinatorError::Io { context, source }
}

/// One second of a running job, for progress lines.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    /// Seconds since the job started.
    pub second: u64,
    /// Records the sources produced in that second.
    pub input_per_s: f64,
    /// Records the sinks wrote in that second.
    pub output_per_s: f64,
    /// Mean source lag (ms), mean over source tasks.
    pub lag_mean_ms: Option<f64>,
    /// Worst task's p99 source lag (ms).
    pub lag_p99_ms: Option<f64>,
    /// Worst task's p99 per-batch latency (µs) over non-source tasks.
    pub batch_p99_us: Option<f64>,
    /// Milliseconds tasks spent blocked on full channels, summed.
    pub backpressure_ms: f64,
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
}

/// A job to run.
pub struct JobRun {
    /// The config.
    pub config: JobConfig,
    /// Builds the graph of the config's query.
    pub resolver: QueryResolver,
    /// Run id (unique in the metrics database).
    pub run: String,
    /// Receives one [`Progress`] per second while the job runs.
    pub progress: Option<Sender<Progress>>,
}

struct Workers {
    writers: Vec<BufWriter<TcpStream>>,
    addrs: BTreeMap<WorkerId, String>,
}

impl Workers {
    fn send(&mut self, worker: usize, msg: &CoordinatorMessage) -> Result<(), CoordinatorError> {
        let w = &mut self.writers[worker];
        write_frame(w, msg)
            .and_then(|_| w.flush())
            .map_err(io(format!("sending to worker{worker}")))?;
        Ok(())
    }

    fn broadcast(&mut self, msg: &CoordinatorMessage) -> Result<(), CoordinatorError> {
        for i in 0..self.writers.len() {
            self.send(i, msg)?;
        }
        Ok(())
    }
}

/// Builds the graph and checks the config against it; returns tasks per operator.
pub fn resolve(
    config: &JobConfig,
    resolver: &QueryResolver,
) -> Result<(JobGraph, Vec<u32>), ConfigError> {
    let graph =
        resolver(&config.query, &config.params_text()).map_err(|message| ConfigError::Invalid {
            field: "query / params".into(),
            message,
        })?;
    let parallelism = config.validate(&graph)?;
    Ok((graph, parallelism))
}

/// Runs a job to completion on workers that connect to `listener`.
pub fn run_job(listener: TcpListener, job: JobRun) -> Result<JobSummary, CoordinatorError> {
    let config = &job.config;
    let (graph, parallelism) = resolve(config, &job.resolver)?;
    let (events_tx, events) = unbounded();
    let mut workers = accept_workers(&listener, config.workers, &events_tx)?;

    let deployment = plan(config, &graph, &parallelism, &workers.addrs, &job.run);
    let tasks: Vec<TaskId> = deployment.placement.keys().copied().collect();
    workers.broadcast(&CoordinatorMessage::Deploy(Box::new(deployment)))?;
    let mut deployed = 0;
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while deployed < workers.writers.len() {
        match events.recv_deadline(deadline) {
            Ok((_, Some(WorkerMessage::Deployed))) => deployed += 1,
            Ok((worker, Some(WorkerMessage::DeployFailed { error }))) => {
                let _ = workers.broadcast(&CoordinatorMessage::Shutdown);
                return Err(CoordinatorError::Deploy { worker, error });
            }
            Ok((worker, None)) => return Err(CoordinatorError::WorkerLost(worker)),
            Ok(_) => {}
            Err(_) => {
                return Err(CoordinatorError::Timeout(
                    "workers did not acknowledge the deployment".into(),
                ));
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
        protocol: "none".into(),
        config: toml::to_string(config).unwrap_or_default(),
    })?;
    workers.broadcast(&CoordinatorMessage::Start)?;
    let started = Instant::now();
    tracing::info!(run = %job.run, tasks = tasks.len(), "job started");

    let names = |t: TaskId| {
        format!(
            "{}.{}",
            graph.operators[t.operator.0 as usize].name, t.index
        )
    };
    let mut remaining: HashSet<TaskId> = tasks.iter().copied().collect();
    let mut stop_sent = false;
    let mut seconds = SecondAggregator::new(&graph, started_ms / 1000);
    let mut totals = Totals::default();
    let result = loop {
        if remaining.is_empty() {
            break Ok(());
        }
        if let Some(d) = config.duration_s
            && !stop_sent
            && started.elapsed() >= Duration::from_secs(d)
        {
            stop_sent = true;
            workers.broadcast(&CoordinatorMessage::StopSources)?;
        }
        match events.recv_timeout(Duration::from_millis(250)) {
            Ok((_, Some(WorkerMessage::Metrics(samples)))) => {
                totals.add(&graph, &samples);
                seconds.add(&samples);
                let rows: Vec<MetricSample> = samples
                    .iter()
                    .map(|s| MetricSample {
                        time_s: s.time_s,
                        task: names(s.task),
                        metric: s.metric.clone(),
                        value: s.value,
                    })
                    .collect();
                store.insert_samples(&job.run, &rows)?;
            }
            Ok((_, Some(WorkerMessage::TaskFinished { task }))) => {
                remaining.remove(&task);
            }
            Ok((_, Some(WorkerMessage::TaskFailed { task, error }))) => {
                break Err(CoordinatorError::TaskFailed {
                    task: names(task),
                    error,
                });
            }
            Ok((worker, None)) => break Err(CoordinatorError::WorkerLost(worker)),
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                break Err(CoordinatorError::Timeout("event channel closed".into()));
            }
        }
        if let Some(tx) = &job.progress {
            for p in seconds.complete(unix_ms() / 1000) {
                let _ = tx.send(p);
            }
        }
    };
    let _ = workers.broadcast(&CoordinatorMessage::Shutdown);
    result?;
    if let Some(tx) = &job.progress {
        for p in seconds.complete(u64::MAX) {
            let _ = tx.send(p);
        }
    }
    Ok(JobSummary {
        run: job.run,
        elapsed: started.elapsed(),
        records_in: totals.records_in,
        records_out: totals.records_out,
        late_dropped: totals.late_dropped,
        metrics_db: config.metrics_path(),
    })
}

fn accept_workers(
    listener: &TcpListener,
    expected: u32,
    events: &Sender<(WorkerId, Option<WorkerMessage>)>,
) -> Result<Workers, CoordinatorError> {
    let (conn_tx, conn_rx) = unbounded();
    let accept_listener = listener
        .try_clone()
        .map_err(io("cloning the control listener"))?;
    std::thread::Builder::new()
        .name("koala-accept".into())
        .spawn(move || {
            for conn in accept_listener.incoming() {
                if conn_tx.send(conn).is_err() {
                    return;
                }
            }
        })
        .map_err(io("spawning the accept thread"))?;
    let mut workers = Workers {
        writers: Vec::new(),
        addrs: BTreeMap::new(),
    };
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while (workers.writers.len() as u32) < expected {
        let conn = conn_rx.recv_deadline(deadline).map_err(|_| {
            CoordinatorError::Timeout(format!(
                "only {} of {expected} workers registered",
                workers.writers.len()
            ))
        })?;
        let stream = conn.map_err(io("accepting a worker"))?;
        let _ = stream.set_nodelay(true);
        let mut reader = BufReader::new(stream.try_clone().map_err(io("cloning a worker socket"))?);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let data_addr = match read_frame::<_, WorkerMessage>(&mut reader) {
            Ok(Some(WorkerMessage::Register { data_addr, pid })) => {
                tracing::info!(%data_addr, pid, "worker registered");
                data_addr
            }
            other => {
                tracing::error!(?other, "a connection did not register as a worker; dropped");
                continue;
            }
        };
        let _ = stream.set_read_timeout(None);
        let id = WorkerId(workers.writers.len() as u32);
        workers.addrs.insert(id, data_addr);
        workers.writers.push(BufWriter::new(stream));
        workers.send(id.0 as usize, &CoordinatorMessage::Welcome { worker: id })?;
        let events = events.clone();
        std::thread::Builder::new()
            .name(format!("koala-from-{id}"))
            .spawn(move || read_worker(id, reader, &events))
            .map_err(io("spawning a worker reader"))?;
    }
    Ok(workers)
}

fn read_worker(
    id: WorkerId,
    mut reader: BufReader<TcpStream>,
    events: &Sender<(WorkerId, Option<WorkerMessage>)>,
) {
    loop {
        match read_frame::<_, WorkerMessage>(&mut reader) {
            Ok(Some(m)) => {
                if events.send((id, Some(m))).is_err() {
                    return;
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::error!(worker = %id, error = %e, "bad frame from worker; dropping its connection");
                break;
            }
        }
    }
    let _ = events.send((id, None));
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
    let mut par = BTreeMap::new();
    let mut routing = BTreeMap::new();
    for (op, p) in graph.operators.iter().zip(parallelism) {
        par.insert(op.id, *p);
        for i in 0..*p {
            placement.insert(
                TaskId::new(op.id, i),
                worker_ids[i as usize % worker_ids.len()],
            );
        }
        if op.is_stateful() {
            let tasks: Vec<u32> = (0..*p).collect();
            routing.insert(
                op.id,
                assign(config.partition_policy, config.num_buckets, &tasks),
            );
        }
    }
    Deployment {
        run: run.to_string(),
        query: config.query.clone(),
        query_params: config.params_text(),
        workers: workers.clone(),
        placement,
        parallelism: par,
        routing,
        num_buckets: config.num_buckets,
        options: RuntimeOptions {
            batch_records: config.runtime.batch_records,
            linger_ms: config.runtime.linger_ms,
            channel_capacity: config.runtime.channel_capacity,
            sink_dir: config.output_dir.to_string_lossy().into_owned(),
        },
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[derive(Default)]
struct Totals {
    records_in: u64,
    records_out: u64,
    late_dropped: u64,
}

impl Totals {
    fn add(&mut self, graph: &JobGraph, samples: &[TaskSample]) {
        for s in samples {
            let Some(op) = graph.operator(s.task.operator) else {
                continue;
            };
            match s.metric.as_str() {
                metric::RECORDS_OUT if op.is_source() => self.records_in += s.value as u64,
                metric::RECORDS_IN
                    if matches!(op.kind, koala_dataflow::OperatorKind::Sink { .. }) =>
                {
                    self.records_out += s.value as u64;
                }
                metric::LATE_DROPPED => self.late_dropped += s.value as u64,
                _ => {}
            }
        }
    }
}

/// Folds per-task samples into per-second progress.
struct SecondAggregator {
    sources: HashSet<OperatorId>,
    sinks: HashSet<OperatorId>,
    start_s: u64,
    seconds: BTreeMap<u64, (Progress, u32, f64)>,
}

impl SecondAggregator {
    fn new(graph: &JobGraph, start_s: u64) -> Self {
        let sources = graph
            .operators
            .iter()
            .filter(|o| o.is_source())
            .map(|o| o.id)
            .collect();
        let sinks = graph
            .operators
            .iter()
            .filter(|o| matches!(o.kind, koala_dataflow::OperatorKind::Sink { .. }))
            .map(|o| o.id)
            .collect();
        Self {
            sources,
            sinks,
            start_s,
            seconds: BTreeMap::new(),
        }
    }

    fn add(&mut self, samples: &[TaskSample]) {
        for s in samples {
            let entry = self.seconds.entry(s.time_s).or_insert_with(|| {
                (
                    Progress {
                        second: s.time_s.saturating_sub(self.start_s),
                        ..Progress::default()
                    },
                    0,
                    0.0,
                )
            });
            let (p, lag_n, lag_sum) = entry;
            let source = self.sources.contains(&s.task.operator);
            match s.metric.as_str() {
                metric::RECORDS_OUT if source => p.input_per_s += s.value,
                metric::RECORDS_IN if self.sinks.contains(&s.task.operator) => {
                    p.output_per_s += s.value
                }
                metric::SOURCE_LAG_MEAN_MS => {
                    *lag_n += 1;
                    *lag_sum += s.value;
                    p.lag_mean_ms = Some(*lag_sum / f64::from(*lag_n));
                }
                metric::SOURCE_LAG_P99_MS => {
                    p.lag_p99_ms = Some(p.lag_p99_ms.map_or(s.value, |v| v.max(s.value)))
                }
                metric::BATCH_LATENCY_P99_US if !source => {
                    p.batch_p99_us = Some(p.batch_p99_us.map_or(s.value, |v| v.max(s.value)));
                }
                metric::BACKPRESSURE_MS => p.backpressure_ms += s.value,
                _ => {}
            }
        }
    }

    /// Seconds old enough that every task has reported them.
    fn complete(&mut self, now_s: u64) -> Vec<Progress> {
        let mut out = Vec::new();
        while let Some((&t, _)) = self.seconds.first_key_value() {
            if now_s != u64::MAX && t + 2 > now_s {
                break;
            }
            if let Some((_, (p, _, _))) = self.seconds.pop_first() {
                out.push(p);
            }
        }
        out
    }
}
