use koala_dataflow::DataflowError;
use koala_state::StateError;
use koala_types::TaskId;

/// Why a task or a worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// An operator failed.
    #[error("operator logic: {0}")]
    Operator(#[from] DataflowError),
    /// The state store failed.
    #[error("state store: {0}")]
    State(#[from] StateError),
    /// A socket or file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A downstream task's queue is gone (that task stopped).
    #[error("channel to {0} closed")]
    ChannelClosed(TaskId),
    /// The deployment does not fit the job graph.
    #[error("invalid deployment: {0}")]
    Deployment(String),
}

impl RuntimeError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io { context: context.into(), source }
    }
}
