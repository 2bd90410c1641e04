//! Event-time timers of one task, kept in memory in fire order. They are operator metadata: a
//! reconfiguration moves the timers of moved buckets with them (stop-and-restart and DRRS together
//! with the keys' state; Koala without it, fetched when needed: docs/protocols.md §6).

use std::collections::BTreeSet;

use koala_types::{PROCESSING_TIME, TimeDomain, Timestamp};

/// Pending (time, key) timers; duplicates collapse.
#[derive(Debug, Default)]
pub struct TimerService {
    pending: BTreeSet<(Timestamp, Vec<u8>)>,
}

impl TimerService {
    /// Registers timers.
    pub fn register(&mut self, timers: impl IntoIterator<Item = (Vec<u8>, Timestamp)>) {
        for (key, time) in timers {
            self.pending.insert((time, key));
        }
    }

    /// Whether a processing-time timer is pending.
    pub fn has_processing(&self) -> bool {
        self.pending.range((PROCESSING_TIME, Vec::new())..).next().is_some_and(|(t, _)| *t != Timestamp::MAX)
    }

    /// Removes and returns, in time order, every processing-time timer due at clock `now`.
    pub fn pop_processing_due(&mut self, now: Timestamp) -> Vec<(Timestamp, Vec<u8>)> {
        let due_at = TimeDomain::ProcessingTime.queue_time(now).min(Timestamp::MAX - 1);
        let mut due = Vec::new();
        while let Some(first) = self.pending.range((PROCESSING_TIME, Vec::new())..).next() {
            if first.0 > due_at {
                break;
            }
            let first = first.clone();
            self.pending.remove(&first);
            due.push(first);
        }
        due
    }

    /// Removes and returns, in time order, every timer due at watermark `watermark` (processing-
    /// time timers only at the end of input, [`Timestamp::MAX`]).
    pub fn pop_due(&mut self, watermark: Timestamp) -> Vec<(Timestamp, Vec<u8>)> {
        let mut due = Vec::new();
        while let Some(first) = self.pending.first() {
            if first.0 > watermark {
                break;
            }
            if let Some(t) = self.pending.pop_first() {
                due.push(t);
            }
        }
        due
    }

    /// Removes and returns, in time order, every timer due at `watermark` whose key matches.
    pub fn pop_due_where(
        &mut self,
        watermark: Timestamp,
        mut matches: impl FnMut(&[u8]) -> bool,
    ) -> Vec<(Timestamp, Vec<u8>)> {
        let due: Vec<(Timestamp, Vec<u8>)> = self
            .pending
            .iter()
            .take_while(|(t, _)| *t <= watermark)
            .filter(|(_, k)| matches(k))
            .cloned()
            .collect();
        for t in &due {
            self.pending.remove(t);
        }
        due
    }

    /// Removes and returns every timer whose key matches (the timers of moved buckets).
    pub fn take_where(&mut self, mut moved: impl FnMut(&[u8]) -> bool) -> Vec<(Timestamp, Vec<u8>)> {
        let (out, keep): (BTreeSet<_>, BTreeSet<_>) =
            std::mem::take(&mut self.pending).into_iter().partition(|(_, k)| moved(k));
        self.pending = keep;
        out.into_iter().collect()
    }

    /// Every pending timer, in fire order (what a checkpoint records).
    pub fn pending(&self) -> Vec<(Timestamp, Vec<u8>)> {
        self.pending.iter().cloned().collect()
    }

    /// Number of pending timers.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_in_time_order_and_collapses_duplicates() {
        let mut t = TimerService::default();
        t.register([(b"b".to_vec(), 20), (b"a".to_vec(), 10), (b"a".to_vec(), 10), (b"c".to_vec(), 30)]);
        assert_eq!(t.len(), 3);
        assert_eq!(t.pop_due(20), vec![(10, b"a".to_vec()), (20, b"b".to_vec())]);
        assert_eq!(t.pop_due(25), vec![]);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn processing_time_timers_fire_by_the_clock_not_by_watermarks() {
        let mut t = TimerService::default();
        let p = |time| TimeDomain::ProcessingTime.queue_time(time);
        t.register([(b"a".to_vec(), 10), (b"b".to_vec(), p(20)), (b"c".to_vec(), p(5))]);
        assert_eq!(t.pop_due(1 << 62), vec![(10, b"a".to_vec())]);
        assert_eq!(t.pop_processing_due(4), vec![]);
        assert_eq!(t.pop_processing_due(20), vec![(p(5), b"c".to_vec()), (p(20), b"b".to_vec())]);
        t.register([(b"d".to_vec(), p(30))]);
        assert_eq!(t.pop_due(Timestamp::MAX), vec![(p(30), b"d".to_vec())], "the end fires every timer");
    }
}
