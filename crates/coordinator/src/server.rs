//! The coordinator of one job: waits for its workers, places tasks, deploys, starts, collects
//! metrics into SQLite, notices a worker that disappears, and ends the job when every task has
//! finished.

mod running;
mod startup;

use std::net::TcpListener;
use std::time::Duration;

use crossbeam_channel::{Sender, unbounded};
use koala_dataflow::JobGraph;
use koala_dataflow::graph::QueryResolver;

use crate::config::{ConfigError, JobConfig};
use crate::error::CoordinatorError;
use crate::progress::ProgressEvent;
use running::EventLoop;

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

/// Runs a job to completion on workers that connect to `listener`, in its phases: the
/// schedule, the ports it serves, the deployment, the start, the event loop, the summary.
pub fn run_job(listener: TcpListener, mut job: JobRun) -> Result<JobSummary, CoordinatorError> {
    let http = job.http.take();
    let (graph, parallelism) = resolve(&job.config, &job.resolver)?;
    koala_types::name_operators(graph.operators.iter().map(|o| o.name.clone()).collect());
    let (schedule, resumed_s) = startup::schedule(&job)?;
    let (events_tx, events) = unbounded();
    // The HTTP server stops when `serving` is dropped, whichever way this function returns.
    let mut serving = startup::serve(&job, &listener, http, &graph, &events_tx)?;
    let (deployment, early_clients) =
        startup::deploy(&job, &graph, &parallelism, &mut serving.workers, &events)?;
    let startup::Serving { live, http: _http, workers, registrations } = serving;
    let started = startup::start(&job, &graph, deployment, workers, &live)?;
    let mut running = EventLoop::new(&job, started, events, registrations, live, schedule, resumed_s)?;
    // Every error ends the loop, and `finish` always tells the workers to shut down.
    let result = running.run(early_clients);
    running.finish(result)
}
