//! Typed protocol surprises. A Koala core never panics on input it receives from the network or the
//! coordinator: it rejects the offending event with one of these and leaves its own state as it was,
//! so the coordinator can abort the epoch (and, once checkpoints exist, recover from the last one:
//! docs/architecture.md §10).

use std::fmt;

use koala_types::{BucketId, Epoch, InputChannel, TaskId};
use serde::{Deserialize, Serialize};

use super::input::InputSource;

/// Something a peer, an upstream or the coordinator sent that the Koala protocol does not allow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A record of a bucket this task neither owns nor forwards arrived on `channel`.
    Misrouted {
        /// The record's bucket.
        bucket: BucketId,
        /// Where it came from.
        channel: InputSource,
    },
    /// An upstream sent a record routed by its old table after its marker for `epoch` on the
    /// same channel.
    RecordAfterMarker {
        /// The channel.
        channel: InputChannel,
        /// The epoch whose marker it already sent.
        epoch: Epoch,
    },
    /// Input on a channel this task does not have open: an unknown upstream or input, or one
    /// whose end of stream already arrived.
    UnknownChannel {
        /// The channel.
        channel: InputChannel,
    },
    /// A marker for an epoch that is not running here, or a second marker on one channel.
    UnexpectedMarker {
        /// The channel.
        channel: InputChannel,
        /// The marker's epoch.
        epoch: Epoch,
    },
    /// A peer message from a task that is not a peer of this task in `epoch`, or out of order.
    UnexpectedPeerMessage {
        /// The peer.
        peer: TaskId,
        /// The message's epoch.
        epoch: Epoch,
        /// What was wrong.
        reason: String,
    },
    /// A reconfiguration for an epoch that is not newer than the current one, or one that arrived
    /// while another epoch is still running at this task.
    StaleEpoch {
        /// The epoch received.
        got: Epoch,
        /// The epoch this task is in (or last completed).
        current: Epoch,
    },
    /// The reconfiguration itself is inconsistent (e.g. a bucket moved twice, or moved from a task
    /// that does not own it).
    InvalidReconfiguration {
        /// The epoch.
        epoch: Epoch,
        /// What was wrong.
        reason: String,
    },
    /// A fetch response that answers no request of this task.
    UnknownFetchResponse {
        /// Who answered.
        from: TaskId,
        /// The request id it carried.
        request: u64,
    },
    /// A fetch asked this task for state of a bucket it owns: the asker's key lookup table is wrong.
    FetchOfOwnedBucket {
        /// Who asked.
        from: TaskId,
        /// The bucket.
        bucket: BucketId,
    },
    /// An acknowledgement the coordinator did not expect (wrong epoch, unknown task, duplicate).
    UnexpectedAck {
        /// Who sent it.
        from: TaskId,
        /// Its epoch.
        epoch: Epoch,
        /// The ack, as printed.
        ack: String,
        /// What the operator's reconfiguration was doing when it arrived.
        state: String,
    },
    /// A routing table or assignment whose length is not the number of buckets, or that names a
    /// task that cannot own buckets.
    InvalidAssignment {
        /// What was wrong.
        reason: String,
    },
    /// A watermark that goes back on a channel that must be monotone.
    WatermarkRegressed {
        /// The last watermark.
        last: u64,
        /// The one received.
        got: u64,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Misrouted { bucket, channel } => {
                write!(f, "record of bucket {bucket} arrived on {channel:?}, which may not carry it")
            }
            Self::RecordAfterMarker { channel, epoch } => {
                write!(f, "an old-table record on {channel} after its marker of epoch {epoch}")
            }
            Self::UnknownChannel { channel } => {
                write!(f, "{channel}: unknown upstream or ended channel")
            }
            Self::UnexpectedMarker { channel, epoch } => {
                write!(f, "unexpected marker of epoch {epoch} on {channel}")
            }
            Self::UnexpectedPeerMessage { peer, epoch, reason } => {
                write!(f, "unexpected peer message from {peer} in epoch {epoch}: {reason}")
            }
            Self::StaleEpoch { got, current } => {
                write!(f, "reconfiguration epoch {got} is not startable in epoch {current}")
            }
            Self::InvalidReconfiguration { epoch, reason } => {
                write!(f, "invalid reconfiguration of epoch {epoch}: {reason}")
            }
            Self::UnknownFetchResponse { from, request } => {
                write!(f, "fetch response {request} from {from} answers no outstanding request")
            }
            Self::FetchOfOwnedBucket { from, bucket } => {
                write!(f, "{from} fetched state of bucket {bucket} from its owner")
            }
            Self::UnexpectedAck { from, epoch, ack, state } => {
                write!(f, "unexpected ack {ack} from {from} for epoch {epoch} ({state})")
            }
            Self::InvalidAssignment { reason } => write!(f, "invalid assignment: {reason}"),
            Self::WatermarkRegressed { last, got } => {
                write!(f, "watermark went back from {last} to {got}")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}
