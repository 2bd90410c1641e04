//! The events a Koala task core consumes and the actions it returns (paper §3.1–§3.4; the
//! runtime executes the actions in order).

use std::sync::Arc;

use koala_types::{BucketId, Epoch, InputChannel, Record, TaskId, Timestamp};

use crate::common::error::ProtocolError;
use crate::control::TaskAck;
use crate::koala::messages::{
    FetchRequest, FetchResponse, FilterRequest, FilterResponse, PeerMessage, Reconfiguration,
};

pub use crate::common::task_config::TaskConfig;

/// Input of a [`KoalaTask`](super::KoalaTask).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskEvent {
    /// A batch on a data channel.
    Records {
        /// The channel: upstream task and operator input.
        channel: InputChannel,
        /// The records in channel order.
        records: Vec<Record>,
    },
    /// A watermark on a data channel.
    Watermark {
        /// The channel.
        channel: InputChannel,
        /// Its event time.
        time: Timestamp,
    },
    /// The upstream switched routing tables: nothing after this on the channel was routed by the
    /// old table (an upstream feeding two inputs sends one on each channel).
    Marker {
        /// The channel.
        channel: InputChannel,
        /// The epoch.
        epoch: Epoch,
    },
    /// A data channel ended.
    EndOfStream {
        /// The channel.
        channel: InputChannel,
    },
    /// The coordinator starts a reconfiguration (paper §3.1 "Init" and "Fast forward").
    Start(Arc<Reconfiguration>),
    /// A peer-channel message.
    Peer {
        /// The peer task.
        from: TaskId,
        /// The message.
        message: PeerMessage,
    },
    /// Another task asks for key state this task holds.
    FetchRequest {
        /// The owner asking.
        from: TaskId,
        /// The request.
        request: FetchRequest,
    },
    /// The answer to a fetch of this task.
    FetchResponse {
        /// The location that answered.
        from: TaskId,
        /// The answer.
        response: FetchResponse,
    },
    /// An owner asks for the membership filter of a bucket this task handed over.
    FilterRequest {
        /// The owner asking.
        from: TaskId,
        /// The request.
        request: FilterRequest,
    },
    /// A filter this task asked for (after [`TaskAction::RequestFilter`]).
    Filter {
        /// The location that built it.
        from: TaskId,
        /// The filter.
        response: FilterResponse,
    },
    /// The time asked for by [`TaskAction::WakeAfter`] has passed.
    Wake,
    /// The task's clock (milliseconds since the Unix epoch; a smaller one than before is
    /// ignored): processing-time timers up to it may fire once their keys' state is here
    /// ([`TaskAction::FireProcessingTimers`]).
    ProcessingTime {
        /// The clock.
        now: Timestamp,
    },
}

/// Output of a [`KoalaTask`](super::KoalaTask), to be executed in order by the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskAction {
    /// Run the operator on these records of input `input`, in this order. Every key's state is
    /// local (or new). Records of one batch come as consecutive `Process` actions, one per run
    /// of one input, in arrival order, so per-key order holds across the inputs.
    Process {
        /// The operator input the records arrived on.
        input: usize,
        /// The records.
        records: Vec<Record>,
    },
    /// Send `request` to task `from`, which holds the state; the answer comes back as
    /// [`TaskEvent::FetchResponse`].
    FetchState {
        /// The location.
        from: TaskId,
        /// The request.
        request: FetchRequest,
    },
    /// Write fetched state into the local store (before any later `Process`).
    InstallState {
        /// Keys with their state.
        entries: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// Answer a fetch: read the requested keys, pick up to `extra.max` more keys of
    /// `extra.buckets` (not among the requested), *delete all of them locally* (one live copy),
    /// and send a [`FetchResponse`] to `to`, listing extra buckets now empty here as exhausted.
    ServeFetch {
        /// The requester.
        to: TaskId,
        /// The request.
        request: FetchRequest,
    },
    /// Ask `from` for the filter of a bucket it handed over: send `request` on the fetch lane; the
    /// answer comes back as [`TaskEvent::Filter`].
    RequestFilter {
        /// The location.
        from: TaskId,
        /// The request.
        request: FilterRequest,
    },
    /// Build the filter of the keys of `request.bucket` in the local store — in the background,
    /// key by key, between batches ([`FilterBuild`](crate::koala::FilterBuild)) — and send it to `to` as
    /// a [`FilterResponse`] on the fetch lane.
    BuildFilter {
        /// The owner that asked.
        to: TaskId,
        /// The request.
        request: FilterRequest,
    },
    /// Send on the peer channel to `to`. For [`PeerMessage::HandOver`], first move the operator's
    /// timers of the handed-over buckets into [`timers`](crate::koala::HandOver::timers) (deleted here;
    /// their keys' state stays: the receiver fetches it when it needs it).
    SendToPeer {
        /// The peer.
        to: TaskId,
        /// The message.
        message: PeerMessage,
    },
    /// Fire the operator's timers of keys in `buckets` that are due at event time `up_to`
    /// (without emitting a watermark). Comes right before the hand-over of those buckets: the
    /// sender's inputs reached `up_to`, so these timers are due, and the receiver may already
    /// have emitted a watermark past them.
    FireTimers {
        /// The buckets about to be handed over.
        buckets: Vec<BucketId>,
        /// The sender's event time at the hand-over.
        up_to: Timestamp,
    },
    /// Register the timers a hand-over brought with the operator; comes before any `Process`
    /// of the handed-over buckets. They fire as usual when a watermark reaches them: the core
    /// emits that watermark only once each one's key was accessed, so its state is here
    /// ([`EmitWatermark`](Self::EmitWatermark)).
    InstallTimers {
        /// The sender.
        from: TaskId,
        /// (time, key).
        timers: Vec<(Timestamp, Vec<u8>)>,
    },
    /// Feed [`TaskEvent::Wake`] once this many milliseconds have passed (the background drain's
    /// rate limit; the only timer the core asks for, and only while it drains).
    WakeAfter {
        /// Milliseconds from now.
        ms: u64,
    },
    /// Emit this watermark downstream (monotone).
    EmitWatermark(Timestamp),
    /// Fire the processing-time timers up to this time (monotone; at most the last
    /// [`TaskEvent::ProcessingTime`]). Kept below every handed-over processing-time timer whose
    /// key was not accessed yet, as [`EmitWatermark`](Self::EmitWatermark) is for event time.
    FireProcessingTimers {
        /// Processing time (milliseconds since the Unix epoch), inclusive.
        up_to: Timestamp,
    },
    /// Send to the coordinator.
    Ack {
        /// The epoch the ack belongs to.
        epoch: Epoch,
        /// The ack.
        ack: TaskAck,
    },
    /// The event was rejected; report it so the coordinator aborts the epoch.
    Error(ProtocolError),
}
