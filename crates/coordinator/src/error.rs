//! Why a job fails: every error names what failed and, where it can, the task or worker.

use koala_types::WorkerId;

use crate::config::ConfigError;
use crate::metrics_store::MetricsStoreError;

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
    /// A worker's control connection closed just after a task failed: the task's channel to
    /// the dead worker broke first, and the lost worker is the cause.
    #[error(
        "{worker} disappeared (its control connection closed; task {task} failed with it: {error}); the job cannot continue without recovery"
    )]
    WorkerLostBehindTask {
        /// The worker.
        worker: WorkerId,
        /// The task that failed first, `operator.index`.
        task: String,
        /// Its error.
        error: String,
    },
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
    /// A worker could not register: another koala build, or a broken registration.
    #[error("a worker could not register: {0}")]
    Registration(String),
    /// Something did not happen in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// Every source finished, but the job did not end: nothing moved towards its end for
    /// `[runtime] end_timeout_s` (`crate::ending`).
    #[error(
        "the job's input ended, but for {seconds:.0} s ([runtime] end_timeout_s) no task finished, reported its inputs ended or was released; {count} task(s) did not finish: {tasks}"
    )]
    Unfinished {
        /// Seconds nothing moved.
        seconds: f64,
        /// How many tasks did not finish.
        count: usize,
        /// Each one, `operator.index: what it waits for`, separated by `; `.
        tasks: String,
    },
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
    /// A checkpoint's metadata could not be written, or a job could not resume.
    #[error(transparent)]
    Resume(#[from] crate::resume::ResumeError),
}

pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> CoordinatorError {
    let context = context.into();
    move |source| CoordinatorError::Io { context, source }
}
