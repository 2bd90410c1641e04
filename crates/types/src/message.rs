use serde::{Deserialize, Serialize};

use crate::{Epoch, Timestamp};

/// One data item: the encoded key (empty on unkeyed streams), the encoded value, its event time
/// and the wall-clock time it was due at its source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Canonical encoded key bytes; the bucket is computed from these.
    pub key: Vec<u8>,
    /// Encoded user value.
    pub value: Vec<u8>,
    /// Event time in milliseconds.
    pub time: Timestamp,
    /// When the record was due at its source, unix milliseconds (docs/architecture.md §9): the
    /// generator's rate schedule or the Kafka record's timestamp; an operator's output carries the
    /// due time of the input record that produced it, a timer's output the latest due time its
    /// task processed before the timer fired. Sinks measure end-to-end latency against it.
    /// 0 = unknown (not measured).
    pub due_ms: u64,
}

/// What a channel between two tasks carries, in FIFO order (docs/architecture.md §4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChannelMessage {
    /// A batch of records.
    Batch(Vec<Record>),
    /// The sender promises no later record on this channel has an event time below this.
    Watermark(Timestamp),
    /// The sender switched its routing table for `Epoch`; nothing after this was routed by the old one.
    Marker(Epoch),
    /// An aligned checkpoint barrier (docs/architecture.md §10): everything before it on this
    /// channel belongs to checkpoint `CheckpointId`, everything after it to the next.
    Barrier(crate::CheckpointId),
    /// The sender will send nothing more on this channel.
    EndOfStream,
    /// Reconfiguration state transfer (peer channel): entries of moved buckets.
    State {
        /// The reconfiguration.
        epoch: Epoch,
        /// Entries, in bucket order.
        entries: Vec<StateEntry>,
    },
    /// Reconfiguration state transfer (peer channel): event-time timers of moved keys.
    Timers {
        /// The reconfiguration.
        epoch: Epoch,
        /// (time, key) pairs.
        timers: Vec<(Timestamp, Vec<u8>)>,
    },
    /// Reconfiguration state transfer (peer channel): the sender has sent everything it moves.
    StateEnd {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// A message of a reconfiguration protocol between two tasks (peer channel), encoded by the
    /// protocol (hand-overs, forwarded records, state fetches).
    Protocol(Vec<u8>),
}

/// One moved state entry: where it lives in the key layout, and its value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateEntry {
    /// The key's bucket.
    pub bucket: crate::BucketId,
    /// The operator's state id.
    pub state: u8,
    /// The encoded user key.
    pub key: Vec<u8>,
    /// The encoded value.
    pub value: Vec<u8>,
}
