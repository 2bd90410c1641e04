//! Lazy windows (docs/protocols.md §6): a hand-over carries the moved buckets' timers (time, key),
//! not their keys' state, which stays where the bucket's locations say. A timer must fire on its
//! key's state, so a timer that came with a hand-over holds the receiver's event time below its
//! time until its key has been *accessed*: once the event time of the task's upstream channels
//! reaches the timer, the key goes to the front of the inbox as an access — a record that reads
//! the key's state and is not processed — and is looked up and fetched like any record's key, in
//! one hop; the hold lifts when that access's batch is done, so the watermark that fires the timer
//! comes after the state is installed. A record of the key that comes first fetches it the same
//! way; the later access then finds it in the task's own store (no round trip).
//!
//! Each handed-over timer is accessed once; timers the operator sets here later are on local
//! state. A bucket handed on again takes its keys' pending accesses along: its timers go with it.

use std::collections::{BTreeSet, HashSet};

use koala_types::{BucketId, Record, Timestamp, bucket_of};

use super::pipeline::{InputRecord, MAX_BATCH_RECORDS};
use super::task::KoalaTask;

/// The operator input of an access in the inbox: no real input has it.
pub(crate) const ACCESS: usize = usize::MAX;

/// Timers that came with hand-overs and whose key has not been accessed yet.
#[derive(Clone, Debug, Default)]
pub(crate) struct HandedTimers {
    /// (time, key), earliest first; one per key (its earliest timer: once its state is here, the
    /// later ones fire on local state too).
    pending: BTreeSet<(Timestamp, Vec<u8>)>,
    /// Accesses in the inbox, not yet through a batch.
    pub(crate) queued: usize,
}

impl HandedTimers {
    /// Adds the timers of a hand-over (in any order; a key's earliest counts).
    pub(crate) fn add(&mut self, timers: &[(Timestamp, Vec<u8>)]) {
        let mut sorted: Vec<&(Timestamp, Vec<u8>)> = timers.iter().collect();
        sorted.sort_unstable();
        let mut seen: HashSet<&[u8]> = HashSet::with_capacity(sorted.len());
        for (t, k) in sorted {
            if seen.insert(k.as_slice()) {
                self.pending.insert((*t, k.clone()));
            }
        }
    }

    /// The earliest pending timer: the task's event time stays below it.
    pub(crate) fn hold(&self) -> Option<Timestamp> {
        self.pending.first().map(|(t, _)| *t)
    }

    /// Whether a timer waits for its access, queued or not.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.queued == 0
    }

    /// Forgets the timers of `buckets` (handed on: they travel with the runtime's timers).
    pub(crate) fn drop_buckets(&mut self, buckets: &BTreeSet<BucketId>, num_buckets: u16) {
        if !self.pending.is_empty() {
            self.pending.retain(|(_, k)| !buckets.contains(&bucket_of(k, num_buckets)));
        }
    }
}

impl KoalaTask {
    /// Queues an access for every handed-over timer the upstream channels' event time reached, at
    /// the front of the inbox, at most a batch's worth at a time; true if it queued any.
    pub(super) fn queue_timer_accesses(&mut self) -> bool {
        let Some(up_to) = self.watermarks.min_upstream() else { return false };
        let mut queued = false;
        while self.timers.queued < MAX_BATCH_RECORDS
            && self.timers.pending.first().is_some_and(|(t, _)| *t <= up_to)
        {
            let Some((time, key)) = self.timers.pending.pop_first() else { break };
            let access = InputRecord::arrived(
                ACCESS,
                Record { key, value: Vec::new(), time, due_ms: 0 },
                self.num_buckets,
            );
            self.held.add(time);
            self.pipeline.inbox.push_front(access);
            self.timers.queued += 1;
            queued = true;
        }
        queued
    }
}
