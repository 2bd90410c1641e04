//! Per-batch latency, one ruler for every protocol (docs/architecture.md §9).
//!
//! A batch's latency runs from when its task starts working on it — the later of when its first
//! record was taken and when the task's previous batch ended — to when its output is ready to
//! emit. That is its head-of-line service time: every wait for its state counts (Koala's
//! on-demand fetch, DRRS's bucket arrival, Remote's round trips), the time it queued behind the
//! task's earlier batches does not (end-to-end latency counts that, for every protocol alike).
//! A loop that processes a batch as it takes it (stop-and-restart, Remote, sinks) and one whose
//! core keeps records ahead (Koala, DRRS: up to 32 768) are measured the same way.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The task's batch clock: intake tags for a protocol core (which has no clock) and the end of
/// the task's last batch.
#[derive(Debug)]
pub(crate) struct BatchClock {
    /// Intake tags are microseconds since this instant.
    origin: Instant,
    /// When the task's last batch (or timer round) ended.
    last_end: Option<Instant>,
}

impl BatchClock {
    pub(crate) fn new() -> Self {
        Self { origin: Instant::now(), last_end: None }
    }

    /// The intake tag of records taken now (`KoalaTask::set_intake_tag`, `DrrsTask::set_intake_tag`).
    pub(crate) fn tag_now(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    /// When records tagged `tag` were taken.
    pub(crate) fn taken_at(&self, tag: u64) -> Instant {
        self.origin + Duration::from_micros(tag)
    }

    /// A batch whose first record was taken at `taken` had its output ready at `done`: its
    /// latency, from the later of `taken` and the end of the task's previous batch.
    pub(crate) fn ended(&mut self, taken: Instant, done: Instant) -> Duration {
        let start = self.last_end.map_or(taken, |end| end.max(taken));
        self.last_end = Some(self.last_end.map_or(done, |end| end.max(done)));
        done.saturating_duration_since(start)
    }
}

/// The batches among one event's `Process` actions, for a loop whose protocol core keeps records
/// (Koala, DRRS): the core reports per batch the intake tag of its oldest record and how many
/// `Process` actions carry it, in action order. Fed the end of each `Process`, it says when the
/// batch that ended there was taken.
pub(crate) struct BatchEnds {
    batches: VecDeque<(u64, usize)>,
    runs: usize,
}

impl BatchEnds {
    /// Batches of one event's actions: (oldest intake tag, `Process` actions), in order.
    pub(crate) fn new(batches: impl IntoIterator<Item = (u64, usize)>) -> Self {
        Self { batches: batches.into_iter().collect(), runs: 0 }
    }

    /// One `Process` ended: the intake tag of the batch it completed, if it did. A `Process` the
    /// core reported no batch for completes none.
    pub(crate) fn processed(&mut self) -> Option<u64> {
        let &(taken, actions) = self.batches.front()?;
        self.runs += 1;
        if self.runs < actions {
            return None;
        }
        self.batches.pop_front();
        self.runs = 0;
        Some(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch completes with its last `Process`, and carries its oldest record's tag.
    #[test]
    fn batch_ends_name_each_batch_at_its_last_action() {
        // A batch taken at 5 ms in one action, then one taken at 7 ms in two (two inputs).
        let mut ends = BatchEnds::new([(5_000, 1), (7_000, 2)]);
        assert_eq!(ends.processed(), Some(5_000));
        assert_eq!(ends.processed(), None, "the second batch has one more action");
        assert_eq!(ends.processed(), Some(7_000));
        assert_eq!(ends.processed(), None, "no batch reported");
    }

    /// Two batches taken together: the second queued behind a slow first one is charged only its
    /// own service, not the first one's time.
    #[test]
    fn a_batch_queued_behind_a_slow_one_is_not_charged_its_time() {
        let mut clock = BatchClock::new();
        let origin = clock.origin;
        let at = |ms: u64| origin + Duration::from_millis(ms);
        let (t0, slow_end, next_end) = (at(10), at(510), at(512));
        assert_eq!(clock.ended(t0, slow_end), Duration::from_millis(500), "the slow batch itself");
        assert_eq!(clock.ended(t0, next_end), Duration::from_millis(2), "from the slow one's end");
    }

    /// A batch that waits for its state (a fetch, a bucket's arrival) while the task has nothing
    /// else to process is charged the wait; one taken after the task went idle starts when taken.
    #[test]
    fn a_batch_waiting_for_state_is_charged_the_wait() {
        let mut clock = BatchClock::new();
        let origin = clock.origin;
        let at = |ms: u64| origin + Duration::from_millis(ms);
        let (previous_end, taken, fetched_and_done) = (at(5), at(20), at(220));
        assert_eq!(clock.ended(at(1), previous_end), Duration::from_millis(4));
        assert_eq!(clock.ended(taken, fetched_and_done), Duration::from_millis(200), "the fetch counts");
        // Taken 1 s later on an idle task, processed in 3 ms: 3 ms, not the idle second.
        assert_eq!(clock.ended(at(1_220), at(1_223)), Duration::from_millis(3));
        // Tags round-trip to the instants they name.
        assert_eq!(clock.taken_at(20_000), at(20));
    }
}
