//! The events a DRRS task core consumes and the actions it returns (docs/protocols.md §11).

use std::sync::Arc;

use koala_types::{BucketId, Epoch, InputChannel, Record, TaskId, Timestamp};

use crate::common::error::ProtocolError;
use crate::control::TaskAck;
use crate::drrs::{DrrsPeer, Subscale};

pub use crate::common::task_config::TaskConfig;

/// Input of a [`DrrsTask`](super::DrrsTask).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskEvent {
    /// A batch on a data channel.
    Records {
        /// The channel.
        channel: InputChannel,
        /// The records, in channel order.
        records: Vec<Record>,
    },
    /// A watermark on a data channel.
    Watermark {
        /// The channel.
        channel: InputChannel,
        /// Its event time.
        time: Timestamp,
    },
    /// The upstream switched routing tables for subscale `epoch`.
    Marker {
        /// The channel.
        channel: InputChannel,
        /// The subscale.
        epoch: Epoch,
    },
    /// A data channel ended.
    EndOfStream {
        /// The channel.
        channel: InputChannel,
    },
    /// The coordinator starts a subscale.
    Start(Arc<Subscale>),
    /// A peer-channel message.
    Peer {
        /// The peer task.
        from: TaskId,
        /// The message.
        message: DrrsPeer,
    },
    /// The runtime installed a bucket `from` pushed (its state and its timers).
    BucketArrived {
        /// The sender.
        from: TaskId,
        /// The subscale.
        epoch: Epoch,
        /// The bucket.
        bucket: BucketId,
    },
    /// The runtime sent the bucket of [`TaskAction::PushBucket`]: the next may go.
    Pushed {
        /// The receiver.
        to: TaskId,
        /// The bucket.
        bucket: BucketId,
    },
}

/// Output of a [`DrrsTask`](super::DrrsTask), executed in order by the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskAction {
    /// Run the operator on these records of input `input`, in this order; their buckets' state
    /// is here.
    Process {
        /// The operator input.
        input: usize,
        /// The records.
        records: Vec<Record>,
    },
    /// Send on the peer channel to `to`.
    SendToPeer {
        /// The peer.
        to: TaskId,
        /// The message.
        message: DrrsPeer,
    },
    /// The task stops processing `buckets` (they go to another task): fire their timers due at
    /// event time `up_to` (the task's inputs reached it), then set their other timers aside —
    /// they travel with the bucket's push and never fire here.
    DetachTimers {
        /// The buckets.
        buckets: Vec<BucketId>,
        /// The sender's event time, if it has one.
        up_to: Option<Timestamp>,
    },
    /// Push `bucket` to `to` on the state lane: read and delete its state here, send it with the
    /// timers set aside for it; once sent (it counts against `link_mb_per_sec`), feed
    /// [`TaskEvent::Pushed`]. The receiver installs it and feeds [`TaskEvent::BucketArrived`].
    PushBucket {
        /// The receiver.
        to: TaskId,
        /// The subscale.
        epoch: Epoch,
        /// The bucket.
        bucket: BucketId,
    },
    /// Emit this watermark downstream (monotone).
    EmitWatermark(Timestamp),
    /// Send to the coordinator.
    Ack {
        /// The subscale.
        epoch: Epoch,
        /// The ack.
        ack: TaskAck,
    },
    /// The event was rejected; report it so the coordinator aborts the job.
    Error(ProtocolError),
}
