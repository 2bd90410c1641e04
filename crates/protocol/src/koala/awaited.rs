//! The membership filters a Koala task asked old locations for and has not received yet
//! (docs/protocols.md §2, §6). Every request is answered once, by the location it went to, so
//! the task knows when nobody owes it a filter; until then the location must stay: a location
//! leaves once released, and its background builds go with it, so an answer it still owes would
//! never come and the task would wait for it for ever. Hence three rules, all this task's:
//! - it does not report `InputsEnded` while it awaits any filter (`TaskLife`), so a live location
//!   is not released at the end of the input before it answered;
//! - it does not report a location drained (`LocationDrained`) while it awaits a filter from it,
//!   so a retired location is not released before it answered — even if the layer the filter was
//!   for went meanwhile (a pull emptied it, or a fetch brought its last key);
//! - it does not hand a bucket over while it awaits a filter of that bucket, so a task cancelled
//!   by a reconfiguration leaves it owing nothing: a retired task's drain report is nobody's
//!   condition, so nothing else would hold the location for it.

use std::collections::BTreeMap;

use koala_types::{BucketId, TaskId};

/// Filter requests sent and not answered, per (location, bucket).
#[derive(Clone, Debug, Default)]
pub(crate) struct AwaitedFilters {
    asked: BTreeMap<(TaskId, BucketId), usize>,
}

impl AwaitedFilters {
    /// A request for the filter of `bucket` went to `location`.
    pub(crate) fn asked(&mut self, location: TaskId, bucket: BucketId) {
        *self.asked.entry((location, bucket)).or_default() += 1;
    }

    /// The filter of `bucket` from `location` arrived (installed or not).
    pub(crate) fn arrived(&mut self, location: TaskId, bucket: BucketId) {
        if let Some(n) = self.asked.get_mut(&(location, bucket)) {
            *n -= 1;
            if *n == 0 {
                self.asked.remove(&(location, bucket));
            }
        }
    }

    /// Whether any filter is awaited.
    pub(crate) fn any(&self) -> bool {
        !self.asked.is_empty()
    }

    /// Whether a filter from `location` is awaited.
    pub(crate) fn from(&self, location: TaskId) -> bool {
        self.asked.keys().any(|(l, _)| *l == location)
    }

    /// Whether a filter of one of `buckets` is awaited.
    pub(crate) fn of_any(&self, buckets: &[BucketId]) -> bool {
        self.asked.keys().any(|(_, b)| buckets.contains(b))
    }
}

#[cfg(test)]
mod tests {
    use koala_types::OperatorId;

    use super::*;

    #[test]
    fn each_request_is_awaited_until_its_answer() {
        let (l1, l2) = (TaskId::new(OperatorId(1), 1), TaskId::new(OperatorId(1), 2));
        let mut a = AwaitedFilters::default();
        assert!(!a.any());
        a.asked(l1, 3);
        a.asked(l1, 3);
        a.asked(l2, 5);
        assert!(a.from(l1) && a.from(l2) && a.of_any(&[3]) && a.of_any(&[4, 5]) && !a.of_any(&[4]));
        a.arrived(l1, 3);
        assert!(a.from(l1), "a second request of the same filter is still open");
        a.arrived(l1, 3);
        a.arrived(l1, 3);
        assert!(!a.from(l1) && !a.of_any(&[3]), "an answer nobody awaits changes nothing");
        a.arrived(l2, 5);
        assert!(!a.any());
    }
}
