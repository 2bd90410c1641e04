//! The state of one running subscale at a DRRS task: its senders' and receivers' peer channels,
//! the buckets in flight and the records waiting for them (docs/protocols.md §11).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use koala_types::{BucketId, Epoch, InputChannel, Record, TaskId, Timestamp};

use super::room;
use crate::drrs::Subscale;

/// A sender's view of one receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Out {
    AwaitOpen,
    /// The receiver emitted up to this watermark; fast-forward once caught up.
    Open(Option<Timestamp>),
    /// Fast-forwarded; the last watermark forwarded.
    Forwarding(Option<Timestamp>),
    Closed,
}

#[derive(Debug)]
pub(super) struct Outbound {
    pub(super) buckets: Vec<BucketId>,
    pub(super) state: Out,
    /// Buckets not pushed yet, in push order.
    pub(super) unpushed: VecDeque<BucketId>,
    /// The bucket being pushed.
    pub(super) pushing: Option<BucketId>,
    /// Records the receiver lets this task forward now ([`DrrsPeer::Credit`](crate::drrs::DrrsPeer::Credit)).
    pub(super) credit: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum In {
    Awaiting,
    Forwarding,
    Closed,
}

/// Records waiting for one incoming bucket: those forwarded by the sender, and those that came
/// directly from upstreams after the switch (they go after every forwarded one).
#[derive(Debug, Default)]
pub(super) struct Waiting {
    pub(super) peer: VecDeque<(usize, Record)>,
    pub(super) direct: VecDeque<(usize, Record)>,
    /// The intake tag of the oldest record waiting (per-batch latency, `DrrsTask::take_process_tags`).
    pub(super) since: u64,
}

impl Waiting {
    /// The wait of `bucket` in `waiting`, started with intake tag `tag` if nothing waited.
    pub(super) fn of(waiting: &mut BTreeMap<BucketId, Waiting>, bucket: BucketId, tag: u64) -> &mut Waiting {
        let w = waiting.entry(bucket).or_default();
        if w.peer.is_empty() && w.direct.is_empty() {
            w.since = tag;
        }
        w
    }
}

/// A running subscale.
#[derive(Debug)]
pub(super) struct Transition {
    pub(super) sub: Arc<Subscale>,
    pub(super) markers_pending: BTreeSet<InputChannel>,
    pub(super) markers_seen: BTreeSet<InputChannel>,
    pub(super) outbound: BTreeMap<TaskId, Outbound>,
    pub(super) forward: BTreeMap<BucketId, TaskId>,
    pub(super) inbound: BTreeMap<TaskId, (Vec<BucketId>, In)>,
    pub(super) incoming: BTreeMap<BucketId, TaskId>,
    pub(super) waiting: BTreeMap<BucketId, Waiting>,
    /// Buckets the receiver asked its sender to push first.
    pub(super) asked: BTreeSet<BucketId>,
    /// Senders this receiver told `Received`.
    pub(super) acked: BTreeSet<TaskId>,
    /// Receivers that told this sender `Received`.
    pub(super) received: BTreeSet<TaskId>,
    pub(super) ready_sent: bool,
    /// By sender: its window in this receiver's wait buffer and how much of it is in use.
    pub(super) lent: BTreeMap<TaskId, room::Lent>,
}

impl Transition {
    pub(super) fn epoch(&self) -> Epoch {
        self.sub.epoch
    }

    pub(super) fn is_receiver(&self) -> bool {
        !self.inbound.is_empty()
    }

    /// Whether everything of the subscale is through here: markers (or ends of stream) on
    /// every data channel, every receiver's `Received` and every push sent, every sender told
    /// `Received`, nothing waiting.
    pub(super) fn done(&self) -> bool {
        self.ready_sent
            && self.markers_pending.is_empty()
            && self.outbound.iter().all(|(to, o)| self.received.contains(to) && o.pushing.is_none())
            && self.inbound.keys().all(|from| self.acked.contains(from))
            && self.waiting.is_empty()
    }
}
