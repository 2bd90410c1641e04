use koala_dataflow::DataflowError;
use koala_protocol::stop_restart::StopRestartError;
use koala_state::StateError;
use koala_types::{CodecError, OperatorId, TaskId, WorkerId};

use crate::channel::InputChannel;

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
    /// The worker that runs the task is gone (its command queue closed).
    #[error("{0} lost its worker")]
    WorkerGone(TaskId),
    /// A task's input queue closed while the task still expected input.
    #[error("the input queue of {0} closed")]
    InputClosed(TaskId),
    /// The deployment names a task no worker runs.
    #[error("invalid deployment: {0} is not placed")]
    NotPlaced(TaskId),
    /// A local task has no input queue on this worker.
    #[error("invalid deployment: no input queue for {0}")]
    NoInbox(TaskId),
    /// The deployment has no data-plane address for a worker.
    #[error("invalid deployment: no address for {0}")]
    NoAddress(WorkerId),
    /// The deployment names an operator the job graph lacks.
    #[error("invalid deployment: no operator {0}")]
    UnknownOperator(OperatorId),
    /// The deployment does not fit the operator (kind, inputs, routing, state store).
    #[error("invalid deployment of {operator}: {reason}")]
    Deployment {
        /// The operator or task.
        operator: String,
        /// What does not fit.
        reason: String,
    },
    /// A message between our own processes could not be encoded or decoded.
    #[error("{what}: {source}")]
    Codec {
        /// What was being encoded or decoded.
        what: String,
        /// The codec's error.
        source: CodecError,
    },
    /// A peer task sent what the protocol does not allow.
    #[error("{task} got from {from}: {reason}")]
    Peer {
        /// The receiving task.
        task: TaskId,
        /// The sender.
        from: TaskId,
        /// What was wrong.
        reason: String,
    },
    /// A stop-and-restart core refused what arrived (docs/protocols.md §7): going on could lose
    /// state or skip a phase.
    #[error("{task}, stop-and-restart: {source}")]
    StopRestart {
        /// The task.
        task: TaskId,
        /// What the core refused.
        source: StopRestartError,
    },
    /// An output edge's routing core refused an event (a stale switch, a watermark going back).
    #[error("routing to {consumer}: {source}")]
    Routing {
        /// The consumer the edge feeds.
        consumer: OperatorId,
        /// What the core refused.
        source: koala_protocol::koala::ProtocolError,
    },
    /// A message arrived on a channel that never carries that kind (e.g. state on a data channel).
    #[error("{task} got a {message} message on {channel:?}, which does not carry it")]
    MisplacedMessage {
        /// The receiving task.
        task: TaskId,
        /// The channel.
        channel: InputChannel,
        /// The kind of message.
        message: &'static str,
    },
    /// A command the task cannot apply in its current state.
    #[error("{task} cannot apply {command} {context}")]
    UnexpectedCommand {
        /// The task.
        task: TaskId,
        /// The command's name.
        command: &'static str,
        /// When it arrived.
        context: &'static str,
    },
    /// The runtime broke one of its own invariants (a bug): the task stops rather than guess.
    #[error("{task}: invariant broken: {what}")]
    Invariant {
        /// The task.
        task: TaskId,
        /// What does not hold.
        what: &'static str,
    },
    /// The coordinator's control connection broke or sent messages out of order.
    #[error("control plane: {0}")]
    Control(String),
    /// A checkpoint could not be written or restored, or a barrier broke the alignment rule.
    #[error("{task}: checkpoint: {what}")]
    Checkpoint {
        /// The task.
        task: TaskId,
        /// What went wrong.
        what: String,
    },
}

impl RuntimeError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io { context: context.into(), source }
    }

    pub(crate) fn deployment(operator: impl ToString, reason: impl Into<String>) -> Self {
        Self::Deployment { operator: operator.to_string(), reason: reason.into() }
    }
}
