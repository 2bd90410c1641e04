//! What the stop-and-restart cores refuse (docs/protocols.md §7): the error a task fails with.

use koala_types::{Epoch, OperatorId, TaskId};

/// Something the stop-and-restart protocol does not allow. The core that returns it is
/// unchanged; the task must fail (state would otherwise be lost or a phase skipped).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StopRestartError {
    /// A `Prepare` arrived while this task's part of another reconfiguration is still running.
    #[error("Prepare of epoch {got} while epoch {running} is running")]
    PrepareWhileRunning {
        /// The running epoch.
        running: Epoch,
        /// The epoch of the new `Prepare`.
        got: Epoch,
    },
    /// A `Prepare` for an epoch not newer than the last one this task took part in.
    #[error("Prepare of epoch {got}, not newer than epoch {last}")]
    StaleEpoch {
        /// The epoch of the `Prepare`.
        got: Epoch,
        /// The last epoch this task prepared.
        last: Epoch,
    },
    /// A `Prepare` of another operator's reconfiguration.
    #[error("Prepare of epoch {epoch} reconfigures {operator}, not this task's operator")]
    OtherOperator {
        /// The epoch.
        epoch: Epoch,
        /// The operator the plan reconfigures.
        operator: OperatorId,
    },
    /// A marker of the running epoch on a channel whose marker is not awaited (a second one, or
    /// one at a task the plan created).
    #[error("marker of running epoch {epoch} on channel {channel}, which owes none")]
    UnexpectedMarker {
        /// The epoch.
        epoch: Epoch,
        /// The channel (as the executor names it).
        channel: String,
    },
    /// State or `StateEnd` arrived while this task takes part in no reconfiguration.
    #[error("state of epoch {epoch} from {from} outside a reconfiguration")]
    StateOutsideReconfiguration {
        /// The sender.
        from: TaskId,
        /// The epoch the message carries.
        epoch: Epoch,
    },
    /// State or `StateEnd` of an epoch other than the running one.
    #[error("state of epoch {got} from {from} while epoch {running} is running")]
    StateOfOtherEpoch {
        /// The sender.
        from: TaskId,
        /// The epoch the message carries.
        got: Epoch,
        /// The running epoch.
        running: Epoch,
    },
    /// State or `StateEnd` from a task that moves nothing to this one.
    #[error("state of epoch {epoch} from {from}, which moves nothing here")]
    NotASender {
        /// The task.
        from: TaskId,
        /// The epoch.
        epoch: Epoch,
    },
    /// State or `StateEnd` from a sender after its `StateEnd`.
    #[error("state of epoch {epoch} from {from} after its StateEnd")]
    StateAfterEnd {
        /// The sender.
        from: TaskId,
        /// The epoch.
        epoch: Epoch,
    },
    /// A `Drain` while the upstream task is paused.
    #[error("Drain of epoch {got} while paused for epoch {paused}")]
    DrainWhilePaused {
        /// The epoch it is paused for.
        paused: Epoch,
        /// The epoch of the new `Drain`.
        got: Epoch,
    },
    /// A `Drain` for a reconfiguration this task was not prepared for.
    #[error("Drain of epoch {epoch} without its Prepare")]
    DrainWithoutPrepare {
        /// The epoch of the `Drain`.
        epoch: Epoch,
    },
    /// A `Resume` while the upstream task is not paused.
    #[error("Resume of epoch {epoch} without a Drain")]
    ResumeWithoutDrain {
        /// The epoch of the `Resume`.
        epoch: Epoch,
    },
    /// A state chunk under the `remote` protocol, where state never moves (only timers do).
    #[error("state of epoch {epoch} from {from}, but under the remote protocol state does not move")]
    StateUnderRemote {
        /// The sender.
        from: TaskId,
        /// The epoch.
        epoch: Epoch,
    },
    /// A `Resume` of another epoch than the one the upstream task is paused for.
    #[error("Resume of epoch {got} while paused for epoch {paused}")]
    ResumeOfOtherEpoch {
        /// The epoch it is paused for.
        paused: Epoch,
        /// The epoch of the `Resume`.
        got: Epoch,
    },
}
