//! What DRRS tasks, upstreams and the coordinator tell each other (docs/protocols.md §11). Every
//! message that belongs to a subscale carries its epoch ([`super::subscale_epoch`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use koala_types::{BucketId, Epoch, OperatorId, Record, TaskId, Timestamp};
use serde::{Deserialize, Serialize};

use crate::control::ReconfigPlan;
use crate::moves::Moves;
use crate::switch::RoutingSwitch;

/// One subscale, as every task taking part receives it (every task owning buckets before or
/// after it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscale {
    /// The target operator.
    pub operator: OperatorId,
    /// The subscale's epoch.
    pub epoch: Epoch,
    /// Its position among the reconfiguration's subscales (0-based) and their number.
    pub index: usize,
    /// How many subscales the reconfiguration has.
    pub count: usize,
    /// The buckets moved in this subscale, per (sender, receiver).
    pub moves: Moves,
    /// The upstream tasks still running: each marks every channel to the operator when it
    /// switches. A task without channels from one of them opens them.
    pub upstreams: BTreeSet<TaskId>,
    /// Records a receiver lets wait, forwarded and direct ones (`DrrsOptions::wait_records`).
    pub wait_records: usize,
}

/// Coordinator → workers ([`crate::CoordinatorMessage::Drrs`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrrsControl {
    /// Start `subscale` at `tasks`. Answers: `PeerReady`, then `Done`.
    Begin {
        /// The subscale.
        subscale: Box<Subscale>,
        /// The tasks taking part.
        tasks: Vec<TaskId>,
    },
    /// Every task of the subscale is `PeerReady`: `upstreams` switch to `assignment` (bucket →
    /// task index of `operator`), injecting a marker into every channel of the old and the new
    /// table. Answer: `Switched`.
    Switch {
        /// The subscale's epoch.
        epoch: Epoch,
        /// The operator.
        operator: OperatorId,
        /// The routing table after the subscale: bucket → task index.
        assignment: Vec<u32>,
        /// Task indices that own no bucket in `assignment` but are live before and after the
        /// reconfiguration: upstreams keep their channels (markers, watermarks, no end of stream).
        keep: Vec<u32>,
        /// The upstream tasks to switch.
        upstreams: Vec<TaskId>,
        /// Whether this is the reconfiguration's last subscale.
        last: bool,
    },
}

/// What a worker tells its local tasks for a [`DrrsControl`] ([`DrrsControl::into_command`]).
#[derive(Clone, Debug, PartialEq)]
pub enum DrrsCommand {
    /// The tasks start this subscale.
    Begin(Arc<Subscale>),
    /// The upstreams switch to the subscale's table (the reconfiguration's plan places the tasks).
    Switch(Arc<RoutingSwitch>),
}

impl DrrsControl {
    /// The reconfiguration this message belongs to.
    pub fn plan_epoch(&self) -> Epoch {
        match self {
            Self::Begin { subscale, .. } => super::plan_epoch(subscale.epoch),
            Self::Switch { epoch, .. } => super::plan_epoch(*epoch),
        }
    }

    /// The worker's side of a DRRS control message, so the runtime only relays the result:
    /// a `Begin` is its subscale; a `Switch` is the subscale's table and kept tasks, with the
    /// plan of its reconfiguration (from `plans`, the worker's plans by epoch, which the last
    /// subscale's switch removes) to place them (the upstreams keep channels to kept tasks and
    /// end those of tasks that are gone).
    ///
    /// ```
    /// # use std::collections::HashMap;
    /// use koala_protocol::drrs::{DrrsCommand, DrrsControl, subscale_epoch};
    /// let plans = &mut HashMap::new();
    /// let switch = DrrsControl::Switch {
    ///     epoch: subscale_epoch(3, 1), operator: koala_types::OperatorId(1),
    ///     assignment: vec![0, 1], keep: vec![2], upstreams: vec![], last: true,
    /// };
    /// // A switch of a reconfiguration this worker has no plan of is refused by epoch.
    /// assert!(switch.into_command(plans).unwrap_err().contains("epoch 3"));
    /// ```
    pub fn into_command(self, plans: &mut HashMap<Epoch, Arc<ReconfigPlan>>) -> Result<DrrsCommand, String> {
        let at = self.plan_epoch();
        match self {
            Self::Begin { subscale, .. } => Ok(DrrsCommand::Begin(Arc::new(*subscale))),
            Self::Switch { epoch, operator, assignment, keep, last, .. } => {
                let plan = if last { plans.remove(&at) } else { plans.get(&at).cloned() };
                let plan = plan.ok_or_else(|| format!("DRRS switch of unknown epoch {at}"))?;
                if plan.operator != operator {
                    return Err(format!(
                        "DRRS switch of epoch {at} names operator {operator}, its plan {}",
                        plan.operator
                    ));
                }
                Ok(DrrsCommand::Switch(Arc::new(RoutingSwitch::subscale(plan, epoch, assignment, &keep))))
            }
        }
    }
}

/// A message on a DRRS peer channel. Bucket state does not travel here: the runtime pushes it
/// on the state lane ([`super::TaskAction::PushBucket`]) and the receiver learns of it with
/// [`super::TaskEvent::BucketArrived`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrrsPeer {
    /// Receiver → sender when the receiver starts the subscale: the watermark it has emitted.
    /// The sender fast-forwards once its own event time caught up with it.
    Open {
        /// The subscale.
        epoch: Epoch,
        /// The receiver's emitted watermark.
        watermark: Option<Timestamp>,
        /// Records the sender may forward before it hears [`DrrsPeer::Credit`]: its window in
        /// the receiver's wait buffer ([`super::peer_window`]).
        credit: usize,
    },
    /// Sender → receiver: from now on the moved buckets' records come on this channel; the
    /// sender's event time, which the receiver inherits for the channel.
    FastForward {
        /// The subscale.
        epoch: Epoch,
        /// The sender's event time.
        watermark: Option<Timestamp>,
    },
    /// Sender → receiver: records of moved buckets that reached the sender on operator input
    /// `input`, in the order it received them.
    Records {
        /// The subscale.
        epoch: Epoch,
        /// The operator input.
        input: usize,
        /// The records.
        records: Vec<Record>,
    },
    /// Sender → receiver: the sender's event time advanced.
    Watermark {
        /// The subscale.
        epoch: Epoch,
        /// The new event time.
        time: Timestamp,
    },
    /// Sender → receiver: markers from every upstream arrived; nothing more comes here.
    Close {
        /// The subscale.
        epoch: Epoch,
    },
    /// Receiver → sender: the channel closed and every bucket from the sender arrived; nothing
    /// more comes from the receiver in this subscale (the sender is done only after it, so no
    /// message of the receiver can reach a sender that finished and exited).
    Received {
        /// The subscale.
        epoch: Epoch,
    },
    /// Receiver → sender: the receiver processed `records` more of the records the sender
    /// forwarded, so it may forward that many more (credit-based flow control: a sender never
    /// has more records forwarded and not processed than its window, so the receiver's wait
    /// buffer stays bounded without the receiver ever refusing its peer lane, which also carries
    /// the pushed buckets that drain it).
    Credit {
        /// The subscale.
        epoch: Epoch,
        /// Records the sender may forward in addition.
        records: usize,
    },
    /// Receiver → sender: records wait for `bucket`; push it next (prioritised migration).
    Prioritize {
        /// The subscale.
        epoch: Epoch,
        /// The bucket.
        bucket: BucketId,
    },
}

impl DrrsPeer {
    /// The subscale this message belongs to.
    pub fn epoch(&self) -> Epoch {
        match self {
            Self::Open { epoch, .. }
            | Self::FastForward { epoch, .. }
            | Self::Records { epoch, .. }
            | Self::Watermark { epoch, .. }
            | Self::Close { epoch }
            | Self::Received { epoch }
            | Self::Credit { epoch, .. }
            | Self::Prioritize { epoch, .. } => *epoch,
        }
    }
}
