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
//!
//! Processing-time timers (marked by [`PROCESSING_TIME`] in the same queue) work the same way on
//! the task's clock ([`crate::koala::TaskEvent::ProcessingTime`]): once the clock reaches a handed-over
//! one, its key is accessed, and the processing time the core lets the runtime fire up to
//! ([`crate::koala::TaskAction::FireProcessingTimers`]) stays below it until that access's batch is done.
//! Past every event time, they hold no watermark below the end of input.

use std::collections::{BTreeSet, HashSet};

use koala_types::{BucketId, PROCESSING_TIME, Record, TimeDomain, Timestamp, bucket_of};

use super::KoalaTask;
use super::limits::MAX_BATCH_RECORDS;
use super::pipeline::InputRecord;

/// The operator input of an access in the inbox: no real input has it.
pub(crate) const ACCESS: usize = usize::MAX;

/// Timers that came with hand-overs and whose key has not been accessed yet.
#[derive(Clone, Debug, Default)]
pub(crate) struct HandedTimers {
    /// (queue time, key), earliest first; one per key and time domain (its earliest timer: once
    /// its state is here, the later ones fire on local state too).
    pending: BTreeSet<(Timestamp, Vec<u8>)>,
    /// Accesses in the inbox, not yet through a batch.
    pub(crate) queued: usize,
}

impl HandedTimers {
    /// Adds the timers of a hand-over (in any order; a key's earliest counts).
    pub(crate) fn add(&mut self, timers: &[(Timestamp, Vec<u8>)]) {
        let mut sorted: Vec<&(Timestamp, Vec<u8>)> = timers.iter().collect();
        sorted.sort_unstable();
        let mut seen: HashSet<(TimeDomain, &[u8])> = HashSet::with_capacity(sorted.len());
        for (t, k) in sorted {
            if seen.insert((TimeDomain::of(*t).0, k.as_slice())) {
                self.pending.insert((*t, k.clone()));
            }
        }
    }

    /// The earliest pending timer: the task's event time stays below it (a processing-time one
    /// holds it only below the end of input).
    pub(crate) fn hold(&self) -> Option<Timestamp> {
        self.pending.first().map(|(t, _)| *t)
    }

    /// The earliest pending processing-time timer: the processing time the runtime may fire up
    /// to stays below it.
    pub(crate) fn processing_hold(&self) -> Option<Timestamp> {
        self.first_processing().map(|(t, _)| TimeDomain::of(*t).1)
    }

    fn first_processing(&self) -> Option<&(Timestamp, Vec<u8>)> {
        self.pending.range((PROCESSING_TIME, Vec::new())..).next()
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
    /// Queues an access for every handed-over timer the upstream channels' event time or the
    /// task's clock reached, at the front of the inbox, at most a batch's worth at a time; true if
    /// it queued any.
    pub(in crate::koala) fn queue_timer_accesses(&mut self) -> bool {
        let up_to = self.watermarks.min_upstream();
        let clock = self.clock;
        let mut queued = false;
        while self.timers.queued < MAX_BATCH_RECORDS {
            let by_event_time = self.timers.pending.first().filter(|(t, _)| up_to.is_some_and(|u| *t <= u));
            let by_clock = self
                .timers
                .first_processing()
                .filter(|(t, _)| clock.is_some_and(|c| TimeDomain::of(*t).1 <= c));
            let Some(next) = by_event_time.or(by_clock).cloned() else { break };
            self.timers.pending.remove(&next);
            let (time, key) = next;
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
