//! DRRS, the live-migration baseline (paper §5.1; the authors' `drrs` branches, artifact notes
//! §5.6; docs/protocols.md §11), as sans-IO state machines on Koala's utilities: the upstream
//! routers ([`crate::koala::UpstreamRouter`], markers and routing switches), the per-channel
//! event time of a task, and peer channels between the operator's tasks.
//!
//! One reconfiguration, as implemented:
//! 1. [`plan::subscales`] splits the moves into subscales as the Koala authors' port does
//!    ([`DrrsSchedule::Ported`]): by default as many as there are sender→receiver pairs
//!    ([`DrrsOptions::subscales`]), each with a slice of every pair, a new task's first bucket in
//!    the first and a removed task's last bucket in the last, so all links work at once. They
//!    run one after another, each its own epoch ([`subscale_epoch`]); [`DrrsCoordinator`]
//!    (inside [`crate::engine::Engine`]) drives them:
//!    `Begin` → every `PeerReady` → upstreams `Switch` to the subscale's table with markers →
//!    every `Done` → the next subscale. Under the original DRRS's schedule
//!    ([`DrrsSchedule::Overlapping`]) [`plan::single_pairs`] cuts each pair into subscales of
//!    about half a pair, and several run at once: the next (the least-loaded task's, as the
//!    original's controller picks) begins as soon as its sender and receiver each move in fewer
//!    than [`MAX_RUNNING_PER_TASK`] running ones; switches go in the order they began.
//! 2. A receiver sends `Open` with the watermark it emitted. The sender, once its event time
//!    caught up, fires the moved buckets' due timers, sets their other timers aside and
//!    *fast-forwards*: from then on it forwards the moved buckets' records (and its event time)
//!    over the peer channel, and pushes the buckets' whole state with their timers in the
//!    background, one bucket at a time, buckets the receiver has records waiting for first.
//! 3. The receiver processes records out of order: records of a bucket whose state has not
//!    arrived wait in a per-bucket buffer while every other record is processed. Direct records of
//!    a moved bucket also wait until the peer channel closed (per-key order across the peer and
//!    the direct path). Every record waiting counts against [`DrrsOptions::wait_records`]
//!    (`task/room.rs`): a sender forwards only with credit the receiver lent it
//!    ([`peer_window`], [`DrrsPeer::Credit`]), and direct records that would wait fill only the
//!    rest; past it the task refuses them ([`DrrsTask::data_room`]) until at most half of that
//!    rest waits ([`low_water`]).
//! 4. Watermark propagation (the paper's extension of DRRS): a receiver emits no watermark while
//!    its wait buffer holds records or a moved bucket's state and timers have not arrived.
//! 5. A sender closes its peer channel after markers from every upstream; a task is `Done` once
//!    markers, closes and every pushed bucket are through.

mod coordinator;
pub(crate) mod messages;
pub mod plan;
mod task;
#[cfg(test)]
mod tests;

use koala_types::Epoch;

pub use coordinator::{DrrsCoordinator, DrrsStep, MAX_RUNNING_PER_TASK};
pub use messages::{DrrsCommand, DrrsControl, DrrsPeer, Subscale};
pub use task::{DrrsLife, DrrsTask, LoopHolds, TaskAction, TaskConfig, TaskEvent, low_water};

/// The window a receiver lends each of the `senders` of a subscale in its wait buffer of
/// `wait_records` (credit for forwarded records, [`DrrsPeer::Credit`]): together with as many
/// windows for [`MAX_RUNNING_PER_TASK`] subscales, at most half the buffer; at least one record.
///
/// ```
/// use koala_protocol::drrs::peer_window;
/// assert_eq!((peer_window(2048, 1), peer_window(2048, 4), peer_window(2, 3)), (512, 128, 1));
/// ```
pub fn peer_window(wait_records: usize, senders: usize) -> usize {
    (wait_records / (2 * MAX_RUNNING_PER_TASK * senders.max(1))).max(1)
}

/// DRRS knobs (`[drrs]` in a job config).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DrrsOptions {
    /// How the moves are split into subscales and run.
    pub schedule: DrrsSchedule,
    /// Subscales a reconfiguration is split into, each with a slice of every sender→receiver
    /// pair; 0 = as many as there are pairs (the default, the artifact's `NumSubscales: -1`).
    /// The ported schedule's knob: the overlapping one cuts pairs itself and refuses
    /// any other value.
    pub subscales: usize,
    /// Records a receiver lets wait for their bucket's state or their peer channel's close,
    /// forwarded and direct ones alike (the artifact's `WaitBufferSize`, 2 batches there):
    /// senders get credit for a window of it ([`peer_window`]), direct records that would wait
    /// fill the rest and are refused past it until half of it drained ([`low_water`]).
    pub wait_records: usize,
}

impl Default for DrrsOptions {
    fn default() -> Self {
        Self { schedule: DrrsSchedule::Ported, subscales: 0, wait_records: 2048 }
    }
}

/// `[drrs] schedule`: which DRRS runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DrrsSchedule {
    /// The Koala authors' port (the paper's baseline; their `drrs` branch,
    /// `getDRRSSubscales`): subscales run one after another, each with a slice of every
    /// sender→receiver pair, so all links work at once ([`plan::subscales`]).
    #[default]
    Ported,
    /// The original DRRS (a Flink 1.17 fork): single-pair subscales (about two per pair) that
    /// overlap, at most two active per task, the least-loaded task's first
    /// ([`plan::single_pairs`], [`MAX_RUNNING_PER_TASK`]). Unlike the original, a new subscale
    /// starts as soon as the cap allows (the original starts at most one per second; the core
    /// has no clock) and routing switches go in the order subscales began
    /// (docs/protocols.md §11).
    Overlapping,
}

impl DrrsSchedule {
    /// Every schedule.
    pub const ALL: [Self; 2] = [Self::Ported, Self::Overlapping];

    /// The name in a config.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ported => "ported",
            Self::Overlapping => "overlapping",
        }
    }

    /// What the schedule does, in a few words (the settings line of a comparison).
    pub fn describe(self) -> &'static str {
        match self {
            Self::Ported => {
                "the Koala authors' port: subscales one after another, each a slice of every sender→receiver pair"
            }
            Self::Overlapping => {
                "the original DRRS: single-pair subscales (about two per pair), several at once, at most two per task"
            }
        }
    }

    /// The schedule with this config name.
    ///
    /// ```
    /// use koala_protocol::drrs::DrrsSchedule;
    /// assert_eq!(DrrsSchedule::parse("overlapping"), Some(DrrsSchedule::Overlapping));
    /// assert_eq!(DrrsSchedule::parse("sequential"), None);
    /// ```
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// Bits of a subscale epoch that number the subscale within its reconfiguration.
pub const SUBSCALE_BITS: u32 = 16;

/// The epoch of subscale `index` of reconfiguration `epoch`: subscales are epochs of their own
/// (markers, peer messages and acks carry it), above every epoch of earlier reconfigurations.
///
/// ```
/// use koala_protocol::drrs::{plan_epoch, subscale_epoch};
/// assert!(subscale_epoch(2, 0) > subscale_epoch(1, 9));
/// assert_eq!(plan_epoch(subscale_epoch(7, 3)), 7);
/// ```
pub fn subscale_epoch(epoch: Epoch, index: usize) -> Epoch {
    (epoch << SUBSCALE_BITS) | index as Epoch
}

/// The reconfiguration a subscale epoch belongs to.
pub fn plan_epoch(subscale: Epoch) -> Epoch {
    subscale >> SUBSCALE_BITS
}

/// The most subscales one reconfiguration may have.
pub const MAX_SUBSCALES: usize = 1 << SUBSCALE_BITS;
