//! Event-time timers of one task, kept in memory in fire order. They are operator metadata: a
//! reconfiguration moves the timers of moved buckets with them (stop-and-restart and DRRS together
//! with the keys' state; Koala without it, fetched when needed: docs/protocols.md §6).

use std::collections::BTreeSet;

use koala_types::Timestamp;

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

    /// Removes and returns, in time order, every timer due at watermark `watermark`.
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
}
