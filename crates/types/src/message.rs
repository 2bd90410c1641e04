use serde::{Deserialize, Serialize};

use crate::{Epoch, Timestamp};

/// One data item: the encoded key (empty on unkeyed streams), the encoded value and its event time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Canonical encoded key bytes; the bucket is computed from these.
    pub key: Vec<u8>,
    /// Encoded user value.
    pub value: Vec<u8>,
    /// Event time in milliseconds.
    pub time: Timestamp,
}

/// What a channel between two tasks carries, in FIFO order (DESIGN.md §4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChannelMessage {
    /// A batch of records.
    Batch(Vec<Record>),
    /// The sender promises no later record on this channel has an event time below this.
    Watermark(Timestamp),
    /// The sender switched its routing table for `Epoch`; nothing after this was routed by the old one.
    Marker(Epoch),
    /// The sender will send nothing more on this channel.
    EndOfStream,
}
