//! The receiver's bounded wait buffer (docs/protocols.md §11): every record a DRRS task
//! holds — forwarded by a sender or taken directly from an upstream, waiting for its bucket's
//! state or for the peer channel's close — counts against `wait_records`.
//!
//! - **Forwarded records: credit.** A receiver lends each sender a window of its buffer
//!   ([`super::super::peer_window`], in [`DrrsPeer::Open`]); the sender forwards a record only
//!   with credit left ([`DrrsTask::data_room`] stops its data intake at the first record it
//!   cannot forward) and the receiver gives credit back as it processes forwarded records
//!   ([`DrrsPeer::Credit`]). So the receiver never refuses its peer lane — the runtime's lane also
//!   carries the pushed buckets, which are what frees the buffer — and a sender's backlog waits
//!   at its upstreams (source lag), not in memory.
//! - **Direct records that would wait** are taken only into the rest of the buffer: the bound
//!   less [`MAX_RUNNING_PER_TASK`] subscales' windows, so a subscale that starts while direct
//!   records wait still finds room for its senders' windows. Past it the task refuses such
//!   records (the rest of the batch waits at the head of its channel) until the buffer drained to
//!   the low-water mark ([`low_water`]); records of buckets it owns, watermarks and markers still
//!   go in.
//!
//! Nothing deadlocks: forwarded records wait only for their bucket's push, which no intake rule
//! holds back, and then return their credit; direct records wait for the push and for the
//! sender's `Close`, which needs only the sender's markers and credit for the records before
//! them — and an upstream sends a task's markers before any record a receiver could refuse (it
//! routes records of a moved bucket to the receiver only after its switch).

use std::collections::BTreeMap;

use koala_types::{Epoch, InputChannel, Record, TaskId, bucket_of};

use super::{DrrsTask, Route, TaskAction};
use crate::drrs::{DrrsPeer, MAX_RUNNING_PER_TASK};

/// A sender's window in a receiver's wait buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lent {
    /// The window: records the sender may have forwarded and the receiver not yet processed.
    pub(super) window: usize,
    /// Credit the sender has and not yet used, as the receiver counts it.
    pub(super) outstanding: usize,
    /// Forwarded records processed since credit was last given back.
    pub(super) freed: usize,
}

/// How many records may still wait when a task that refused direct records that would wait
/// takes them again: half of what it lets wait.
///
/// ```
/// # use koala_protocol::drrs::low_water;
/// assert_eq!((low_water(1), low_water(64), low_water(usize::MAX)), (0, 32, usize::MAX / 2));
/// ```
pub fn low_water(wait_records: usize) -> usize {
    wait_records / 2
}

impl DrrsTask {
    /// How many of `records`, from the front, the task takes now from data channel `channel`; the
    /// rest stays at the head of the channel (the runtime and the simulator split the batch).
    /// Refused: a record to forward to a receiver whose credit is used up, and a record that
    /// would wait for state or a close once direct waiting records fill their part of the buffer
    /// (module docs). With this rule [`Self::queued_records`] never exceeds
    /// [`Self::hold_bound`].
    pub fn data_room(&self, channel: InputChannel, records: &[Record]) -> usize {
        let cap = self.direct_cap();
        let mut direct = self.direct_waiting();
        let mut used: BTreeMap<TaskId, usize> = BTreeMap::new();
        for (taken, r) in records.iter().enumerate() {
            match self.route_direct(channel, bucket_of(&r.key, self.num_buckets)) {
                Route::Wait => {
                    if self.paused || direct >= cap {
                        return taken;
                    }
                    direct += 1;
                }
                Route::Forward(to, epoch) => {
                    let used = used.entry(to).or_default();
                    if *used >= self.credit(to, epoch) {
                        return taken;
                    }
                    *used += 1;
                }
                Route::Local | Route::Reject(_) => {}
            }
        }
        records.len()
    }

    /// The most records this task holds while its subscales run: `wait_records`, or, if that
    /// is less than one record per sender, the senders' windows (each at least one record).
    pub fn hold_bound(&self) -> usize {
        let windows: usize = self.subs.values().flat_map(|t| t.lent.values()).map(|l| l.window).sum();
        self.wait_bound().max(windows)
    }

    /// The smallest `wait_records` of the running subscales.
    fn wait_bound(&self) -> usize {
        self.subs.values().map(|t| t.sub.wait_records).min().unwrap_or(usize::MAX)
    }

    /// Direct records that wait (for their bucket's state or their sender's close).
    fn direct_waiting(&self) -> usize {
        self.subs.values().flat_map(|t| t.waiting.values()).map(|w| w.direct.len()).sum()
    }

    /// The part of the wait buffer direct records may fill: the bound less the windows
    /// [`MAX_RUNNING_PER_TASK`] subscales like the widest running one would lend.
    fn direct_cap(&self) -> usize {
        let widest =
            self.subs.values().map(|t| t.lent.values().map(|l| l.window).sum::<usize>()).max().unwrap_or(0);
        self.wait_bound().saturating_sub(widest.saturating_mul(MAX_RUNNING_PER_TASK))
    }

    /// Credit this task has to forward to `to` in subscale `epoch`.
    fn credit(&self, to: TaskId, epoch: Epoch) -> usize {
        self.subs.get(&epoch).and_then(|t| t.outbound.get(&to)).map_or(0, |o| o.credit)
    }

    /// Uses one record of credit to forward to `to`; false if there is none.
    pub(super) fn take_credit(&mut self, to: TaskId, epoch: Epoch) -> bool {
        match self.subs.get_mut(&epoch).and_then(|t| t.outbound.get_mut(&to)) {
            Some(o) if o.credit > 0 => {
                o.credit -= 1;
                true
            }
            _ => false,
        }
    }

    /// Gives senders credit back for the forwarded records processed, once half a window (so a
    /// sender whose window is used up always hears back: its records all get processed).
    pub(super) fn return_credit(&mut self, out: &mut Vec<TaskAction>) {
        for t in self.subs.values_mut() {
            let epoch = t.epoch();
            for (&from, lent) in t.lent.iter_mut() {
                let open = matches!(t.inbound.get(&from), Some((_, super::In::Forwarding)));
                if open && lent.freed > 0 && lent.freed >= (lent.window / 2).max(1) {
                    let records = std::mem::take(&mut lent.freed);
                    lent.outstanding += records;
                    out.push(TaskAction::SendToPeer {
                        to: from,
                        message: DrrsPeer::Credit { epoch, records },
                    });
                }
            }
        }
    }

    /// Refuses direct records that would wait once they fill their part of the buffer, and takes
    /// them again at the low-water mark (hysteresis, as DRRS's wait buffer).
    pub(super) fn backpressure(&mut self) {
        let (waiting, cap) = (self.direct_waiting(), self.direct_cap());
        if !self.paused && cap > 0 && waiting >= cap {
            self.paused = true;
        } else if self.paused && (waiting <= low_water(cap) || self.subs.is_empty()) {
            self.paused = false;
        }
    }
}
