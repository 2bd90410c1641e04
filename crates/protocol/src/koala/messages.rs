//! What Koala tasks, upstreams and the coordinator tell each other (paper §3.1–§3.4): the
//! reconfiguration a coordinator starts, the peer-channel messages between a sender and a receiver,
//! the key-state fetches, and the typed acks. Every message that belongs to a reconfiguration
//! carries its epoch.

use std::collections::{BTreeMap, BTreeSet};

use koala_types::{BucketId, Epoch, OperatorId, TaskId, Timestamp};
use serde::{Deserialize, Serialize};

use super::filter::KeyFilter;
use crate::common::error::ProtocolError;

pub use crate::moves::Moves;

/// One reconfiguration of one operator, as every target task receives it (paper §3.1 "Init").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconfiguration {
    /// The target operator.
    pub operator: OperatorId,
    /// The epoch; markers and peer messages of this reconfiguration carry it.
    pub epoch: Epoch,
    /// The ownership changes.
    pub moves: Moves,
    /// Upstream tasks: each injects one marker into every channel to a target task (a self-join's
    /// upstream is listed once and marks both of its channels to a task).
    pub upstreams: BTreeSet<TaskId>,
    /// Tasks deployed for this epoch (they own nothing yet and have no watermark to protect).
    pub new_tasks: BTreeSet<TaskId>,
    /// Tasks that own no bucket after this epoch; they stay as state servers until released.
    pub cancelled: BTreeSet<TaskId>,
    /// Every cancelled task not yet released, this epoch's included: owners pull their state.
    pub retired: BTreeSet<TaskId>,
    /// Progressive migration knob N (paper §3.4): extra keys piggybacked per fetch from a retired task.
    pub extra_keys: usize,
    /// Background drain of the old locations progressive migration does not pull from (live old
    /// owners): keys per second per location, 0 = off (docs/protocols.md §6).
    pub drain_keys_per_sec: u64,
}

/// What a task does in a reconfiguration, derived from the moves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Role {
    /// Receivers this task hands buckets to, with the buckets.
    pub outbound: BTreeMap<TaskId, Vec<BucketId>>,
    /// Senders this task takes buckets from, with the buckets.
    pub inbound: BTreeMap<TaskId, Vec<BucketId>>,
}

impl Role {
    /// Whether the task gives buckets away.
    pub fn is_sender(&self) -> bool {
        !self.outbound.is_empty()
    }

    /// Whether the task takes buckets over.
    pub fn is_receiver(&self) -> bool {
        !self.inbound.is_empty()
    }
}

impl Reconfiguration {
    /// The role of `task` in this reconfiguration.
    pub fn role_of(&self, task: TaskId) -> Role {
        let mut role = Role::default();
        for (&(from, to), buckets) in &self.moves {
            if from == task {
                role.outbound.entry(to).or_default().extend(buckets);
            }
            if to == task {
                role.inbound.entry(from).or_default().extend(buckets);
            }
        }
        role
    }

    /// Checks the moves are well formed: no bucket moves twice, no task sends to itself, every
    /// task belongs to the operator, nothing moves to a cancelled or retired task.
    pub fn validate(&self, num_buckets: u16) -> Result<(), ProtocolError> {
        let invalid = |reason: String| ProtocolError::InvalidReconfiguration { epoch: self.epoch, reason };
        let mut seen = BTreeSet::new();
        for (&(from, to), buckets) in &self.moves {
            if from == to {
                return Err(invalid(format!("{from} moves buckets to itself")));
            }
            if from.operator != self.operator || to.operator != self.operator {
                return Err(invalid(format!("move {from}->{to} leaves operator {}", self.operator)));
            }
            if self.retired.contains(&to) {
                return Err(invalid(format!("move to retired task {to}")));
            }
            for &b in buckets {
                if b >= num_buckets {
                    return Err(invalid(format!("bucket {b} out of range")));
                }
                if !seen.insert(b) {
                    return Err(invalid(format!("bucket {b} moves twice")));
                }
            }
        }
        if !self.cancelled.is_subset(&self.retired) {
            return Err(invalid("cancelled tasks must be retired".into()));
        }
        Ok(())
    }
}

/// The key-lookup table of one handed-over bucket (paper §3.3; docs/protocols.md §6): where its
/// keys' state may be, besides the receiver's own store.
///
/// Locations are indices into [`HandOver::locations`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketLocations {
    /// The bucket.
    pub bucket: BucketId,
    /// Tasks that held state of the bucket when they handed it over, newest first; the first is
    /// the sender of this hand-over.
    pub layers: Vec<Layer>,
    /// Explicit entries: key hash → the location that holds the key's state or, if it holds none,
    /// where it would have been created (nowhere else has it). They overrule the layers.
    pub keys: Vec<(u64, u16)>,
}

/// A location that may hold state of a bucket: a task that handed the bucket over at `since`, with
/// the membership filter of the keys it held then, once built ([`KeyFilter`]; `None`: still being
/// built, so any key of the bucket may be there).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    /// Index into [`HandOver::locations`].
    pub location: u16,
    /// The epoch in which that task handed the bucket over.
    pub since: Epoch,
    /// Keys the task held of the bucket after that hand-over (a superset of what it holds now).
    pub filter: Option<KeyFilter>,
}

/// An owner asks a location for the filter of a bucket the location handed over at `since`
/// (on the fetch lane).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterRequest {
    /// The bucket.
    pub bucket: BucketId,
    /// The hand-over the filter is for.
    pub since: Epoch,
}

/// The answer to a [`FilterRequest`]: built from the location's content after the request came.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterResponse {
    /// The bucket.
    pub bucket: BucketId,
    /// The hand-over the filter is for.
    pub since: Epoch,
    /// The keys of the bucket the location held.
    pub filter: KeyFilter,
}

/// Ownership transfer of a set of buckets from a sender to a receiver (paper §3.1 step 2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandOver {
    /// The location table the entries index into.
    pub locations: Vec<TaskId>,
    /// Entries per bucket.
    pub buckets: Vec<BucketLocations>,
    /// The timers of the moved buckets (time, key), taken from the sender's operator: filled in
    /// by the runtime. Only the timers travel, not their keys' state (docs/protocols.md §6, lazy
    /// windows): that stays where the bucket's locations say, and the receiver fetches a key's
    /// state in one hop when a record needs it or its timer is about to fire. Every timer is of
    /// a moved bucket and later than the watermark below (the sender fired the due ones first).
    pub timers: Vec<(Timestamp, Vec<u8>)>,
    /// The sender's event time, which the receiver inherits for this peer channel (paper §3.2).
    pub watermark: Option<Timestamp>,
}

/// A message on a peer channel of epoch `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerMessage {
    /// Receiver → sender, when the receiver starts the epoch: the highest watermark it has emitted.
    /// The sender hands over only once its own event time has caught up with it, so that nothing
    /// it forwards can be behind a watermark the receiver already emitted.
    Open {
        /// The epoch.
        epoch: Epoch,
        /// The receiver's emitted watermark.
        watermark: Option<Timestamp>,
    },
    /// Sender → receiver: the key lookup entries and timers of the moved buckets, and watermark.
    HandOver {
        /// The epoch.
        epoch: Epoch,
        /// The transfer.
        hand_over: Box<HandOver>,
    },
    /// Sender → receiver: records of moved buckets the sender received from its upstreams on
    /// one input of the operator (a run of records of mixed inputs goes as several messages).
    Records {
        /// The epoch.
        epoch: Epoch,
        /// The operator input the records arrived on at the sender.
        input: usize,
        /// The records, in the order the sender received them.
        records: Vec<koala_types::Record>,
    },
    /// Sender → receiver: the sender's event time advanced.
    Watermark {
        /// The epoch.
        epoch: Epoch,
        /// The new event time.
        time: Timestamp,
    },
    /// Sender → receiver: markers from all upstreams arrived; nothing more comes on this channel.
    Close {
        /// The epoch.
        epoch: Epoch,
    },
}

impl PeerMessage {
    /// The epoch this message belongs to.
    pub fn epoch(&self) -> Epoch {
        match self {
            Self::Open { epoch, .. }
            | Self::HandOver { epoch, .. }
            | Self::Records { epoch, .. }
            | Self::Watermark { epoch, .. }
            | Self::Close { epoch } => *epoch,
        }
    }
}

/// A request for key state, sent by an owner to the key's location (paper §3.1, §3.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchRequest {
    /// Matches the response to the request.
    pub id: u64,
    /// Keys whose state the owner needs now.
    pub keys: Vec<Vec<u8>>,
    /// Progressive migration: also send up to this many other keys of these buckets.
    pub extra: Option<ExtraKeys>,
    /// The last checkpoint the requester snapshotted (the checkpoint cut's tag, `cut.rs`).
    pub checkpoint: koala_types::CheckpointId,
}

/// The piggybacked part of a fetch (paper §3.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtraKeys {
    /// Buckets of the requester that may still have state at the location.
    pub buckets: Vec<BucketId>,
    /// At most this many keys.
    pub max: usize,
}

/// The answer to a [`FetchRequest`]; the location deleted everything it sends (one live copy).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchResponse {
    /// The request id.
    pub id: u64,
    /// Requested keys with their state, `None` where the location holds none.
    pub values: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Extra keys with their state.
    pub extra: Vec<(Vec<u8>, Vec<u8>)>,
    /// Extra buckets in which the location holds no state any more after this response.
    pub exhausted: Vec<BucketId>,
}
