//! What changed in a task's store since its last checkpoint (docs/architecture.md §10,
//! "Incremental"): a [`ChangeTracking`] store sits in front of the task's store and logs, per
//! bucket group (the unit a checkpoint part covers), every write since the last
//! [`StateBackend::freeze`] — the entries themselves while a group's log stays within its
//! budget, or only "the whole group changed" past it. The freeze hands the log to the checkpoint
//! writer with the frozen view ([`FrozenView::changes`]), so the writer links the files of
//! unchanged groups, appends a small delta file for a group with a few changes, and scans only
//! the groups that changed a lot — it never re-reads state that did not change.
//!
//! The budget of a group is set by the writer from the group's last full part (an eighth of it,
//! at least [`MIN_GROUP_BUDGET`]): a log never holds more than about an eighth of the state, and
//! a job that rewrites most of its state every interval pays one flag check per write.
//!
//! The freeze covers only the groups the writer will read: those marked whole, and those with
//! logged changes that the writer marked for compaction ([`GroupBudgets::set_compact`], decided
//! from the part it wrote last). The store below copies only those ([`Changes::frozen`]: the
//! write-back cache copies their dirty entries, not the whole working set); a scan of any other
//! bucket fails ([`StateError::NotFrozen`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use koala_types::{BucketId, TaskId};

use crate::frozen::{FrozenSink, FrozenView};
use crate::{
    CacheCounts, ScanSink, StateBackend, StateError, StateKey, StateWrite, StoredBatch, encode_state_key,
};

/// The least a group may log before it counts as wholly changed, bytes.
pub const MIN_GROUP_BUDGET: u64 = 16 << 10;

/// What changed in one bucket group since the previous freeze.
#[derive(Debug, Default)]
pub enum GroupChanges {
    /// Nothing: the previous part's files hold it.
    #[default]
    Unchanged,
    /// These entries, by stored key (`None`: deleted), the last write of each.
    Entries {
        /// Stored key → value.
        entries: HashMap<Vec<u8>, Option<Vec<u8>>>,
        /// Bytes the log holds (keys and values; an overwrite counts its new value instead of the
        /// old one, so a hot key rewritten every batch counts once).
        bytes: u64,
    },
    /// Too much to log (or not known): the writer scans the group.
    Whole,
}

/// Per group, how many bytes of changes the tracker logs before it marks the group whole, and
/// whether the next checkpoint compacts it; set by the checkpoint writer from the parts it wrote.
#[derive(Debug)]
pub struct GroupBudgets {
    bytes: Vec<AtomicU64>,
    compact: Vec<AtomicBool>,
}

impl GroupBudgets {
    fn new(groups: usize) -> Self {
        Self {
            bytes: (0..groups).map(|_| AtomicU64::new(0)).collect(),
            compact: (0..groups).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Sets group `g`'s budget from the bytes of its full part (an eighth of them, at least
    /// [`MIN_GROUP_BUDGET`]).
    pub fn set_from_part(&self, g: usize, part_bytes: u64) {
        if let Some(b) = self.bytes.get(g) {
            b.store((part_bytes / 8).max(MIN_GROUP_BUDGET), Ordering::Relaxed);
        }
    }

    /// Whether the next freeze takes group `g` whole if it has logged changes, for the writer
    /// to compact it (rewrite its deltas into one full part).
    pub fn set_compact(&self, g: usize, compact: bool) {
        if let Some(c) = self.compact.get(g) {
            c.store(compact, Ordering::Relaxed);
        }
    }

    fn get(&self, g: usize) -> u64 {
        self.bytes.get(g).map_or(0, |b| b.load(Ordering::Relaxed))
    }

    fn compacts(&self, g: usize) -> bool {
        self.compact.get(g).is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

/// The log a freeze hands over: every group's changes since the previous freeze.
#[derive(Debug)]
pub struct Changes {
    /// Buckets per group.
    pub group_buckets: u16,
    /// Per group, in bucket order.
    pub groups: Vec<GroupChanges>,
    /// Per group, whether the frozen view covers it: the groups marked whole and those with
    /// logged changes marked for compaction. The writer scans these, links or appends to the
    /// others.
    pub frozen: Vec<bool>,
    /// The budgets the writer updates.
    pub budgets: Arc<GroupBudgets>,
}

impl Changes {
    fn new(
        num_buckets: u16,
        group_buckets: u16,
        budgets: Arc<GroupBudgets>,
        initial: fn() -> GroupChanges,
    ) -> Self {
        let n = usize::from(num_buckets.div_ceil(group_buckets.max(1)));
        let groups = (0..n).map(|_| initial()).collect();
        Self { group_buckets: group_buckets.max(1), groups, frozen: vec![false; n], budgets }
    }

    /// Whether a freeze now covers group `g` (see [`Self::frozen`]).
    fn freezes(&self, g: usize) -> bool {
        match self.groups.get(g) {
            Some(GroupChanges::Whole) | None => true,
            Some(GroupChanges::Entries { .. }) => self.budgets.compacts(g),
            Some(GroupChanges::Unchanged) => false,
        }
    }

    fn group_of(&self, bucket: BucketId) -> usize {
        usize::from(bucket / self.group_buckets)
    }

    /// Logs a write of stored key `key` in `bucket` (`value` `None`: a delete).
    fn log(&mut self, bucket: BucketId, key: &[u8], value: Option<&[u8]>) {
        let g = self.group_of(bucket);
        let budget = self.budgets.get(g);
        let Some(group) = self.groups.get_mut(g) else { return };
        if let GroupChanges::Unchanged = group {
            *group = if budget == 0 {
                GroupChanges::Whole
            } else {
                GroupChanges::Entries { entries: HashMap::new(), bytes: 0 }
            };
        }
        if let GroupChanges::Entries { entries, bytes } = group {
            let len = value.map_or(0, <[u8]>::len) as u64;
            match entries.get_mut(key) {
                Some(logged) => {
                    *bytes = (*bytes + len).saturating_sub(logged.as_ref().map_or(0, Vec::len) as u64);
                    *logged = value.map(<[u8]>::to_vec);
                }
                None => {
                    *bytes += key.len() as u64 + len;
                    entries.insert(key.to_vec(), value.map(<[u8]>::to_vec));
                }
            }
            if *bytes > budget {
                *group = GroupChanges::Whole;
            }
        }
    }

    fn whole(&mut self, bucket: BucketId) {
        let g = self.group_of(bucket);
        if let Some(group) = self.groups.get_mut(g) {
            *group = GroupChanges::Whole;
        }
    }
}

/// A task's store that logs its changes since the last freeze (see the module docs). Everything
/// else passes through.
pub struct ChangeTracking {
    inner: Box<dyn StateBackend>,
    num_buckets: u16,
    /// The log; held across each write so a freeze sees a write wholly before or after it.
    log: Mutex<Changes>,
}

impl ChangeTracking {
    /// Tracks `inner`, whose operator has `num_buckets` buckets, in groups of `group_buckets`.
    /// Until the first freeze every group counts as wholly changed (no earlier part to build on).
    pub fn new(inner: Box<dyn StateBackend>, num_buckets: u16, group_buckets: u16) -> Self {
        let n = usize::from(num_buckets.div_ceil(group_buckets.max(1)));
        let budgets = Arc::new(GroupBudgets::new(n));
        let log = Changes::new(num_buckets, group_buckets, budgets, || GroupChanges::Whole);
        Self { inner, num_buckets, log: Mutex::new(log) }
    }

    fn lock(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, Changes>, StateError> {
        self.log
            .lock()
            .map_err(|_| StateError::Poisoned { store: format!("changes of task {}", self.inner.task()), op })
    }
}

impl StateBackend for ChangeTracking {
    fn task(&self) -> TaskId {
        self.inner.task()
    }

    fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        self.inner.get_many(keys)
    }

    fn write_many(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        let mut log = self.lock("write_many")?;
        for write in &writes {
            let (key, value) = match write {
                StateWrite::Put(key, value) => (key, Some(value.as_slice())),
                StateWrite::Delete(key) => (key, None),
            };
            let g = log.group_of(key.bucket);
            if matches!(log.groups.get(g), Some(GroupChanges::Whole)) {
                continue;
            }
            match encode_state_key(key) {
                Ok(stored) => log.log(key.bucket, &stored, value),
                // The store below refuses it (and the whole batch) with the layout error.
                Err(_) => log.whole(key.bucket),
            }
        }
        self.inner.write_many(writes)
    }

    fn write_stored(&self, writes: &StoredBatch) -> Result<(), StateError> {
        let mut log = self.lock("write_stored")?;
        for (key, value) in writes.iter() {
            let bucket = if key.len() >= 2 { u16::from_be_bytes([key[0], key[1]]) } else { 0 };
            log.log(bucket, key, value);
        }
        self.inner.write_stored(writes)
    }

    fn scan_buckets(
        &self,
        buckets: &[BucketId],
        chunk_bytes: usize,
        sink: ScanSink<'_>,
    ) -> Result<u64, StateError> {
        self.inner.scan_buckets(buckets, chunk_bytes, sink)
    }

    fn bucket_keys_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        self.inner.bucket_keys_after(bucket, after, limit)
    }

    fn bucket_key_candidates_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        self.inner.bucket_key_candidates_after(bucket, after, limit)
    }

    fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
        let mut log = self.lock("delete_buckets")?;
        for &bucket in buckets {
            log.whole(bucket);
        }
        self.inner.delete_buckets(buckets)
    }

    fn approximate_len(&self) -> Result<u64, StateError> {
        self.inner.approximate_len()
    }

    fn is_shared(&self) -> bool {
        self.inner.is_shared()
    }

    fn release_buckets(&self, buckets: &[BucketId]) -> Result<u64, StateError> {
        let mut log = self.lock("release_buckets")?;
        for &bucket in buckets {
            log.whole(bucket);
        }
        self.inner.release_buckets(buckets)
    }

    /// Freezes only the buckets of the groups the writer will read ([`Changes::frozen`]).
    fn freeze(&self, buckets: &[BucketId]) -> Result<Box<dyn FrozenView>, StateError> {
        let mut log = self.lock("freeze")?;
        let frozen: Vec<bool> = (0..log.groups.len()).map(|g| log.freezes(g)).collect();
        let covered: Vec<BucketId> = buckets
            .iter()
            .copied()
            .filter(|&b| frozen.get(log.group_of(b)).copied().unwrap_or(true))
            .collect();
        let view = self.inner.freeze(&covered)?;
        let fresh = Changes::new(
            self.num_buckets,
            log.group_buckets,
            Arc::clone(&log.budgets),
            GroupChanges::default,
        );
        let mut changes = std::mem::replace(&mut *log, fresh);
        changes.frozen = frozen;
        Ok(Box::new(TrackedView { task: self.inner.task(), view, changes }))
    }

    fn cache_counts(&self) -> Option<CacheCounts> {
        self.inner.cache_counts()
    }

    fn charge_outside(&self, bytes: usize) {
        self.inner.charge_outside(bytes);
    }
}

/// A frozen view of the groups the writer reads, with the changes logged since the previous
/// freeze.
struct TrackedView {
    task: TaskId,
    view: Box<dyn FrozenView>,
    changes: Changes,
}

impl FrozenView for TrackedView {
    fn scan_bucket(&self, bucket: BucketId, sink: FrozenSink<'_>) -> Result<(), StateError> {
        // Whatever the store below would show, a group not frozen was not copied: never read it.
        if !self.changes.frozen.get(self.changes.group_of(bucket)).copied().unwrap_or(false) {
            return Err(StateError::NotFrozen { task: self.task, bucket });
        }
        self.view.scan_bucket(bucket, sink)
    }

    fn changes(&self) -> Option<&Changes> {
        Some(&self.changes)
    }

    fn copied_bytes(&self) -> u64 {
        self.view.copied_bytes()
    }
}

#[cfg(test)]
mod tests {
    use koala_types::OperatorId;

    use super::*;
    use crate::{MemoryEnv, StateEnv};

    fn key(bucket: BucketId, user: &str) -> StateKey {
        StateKey::new(bucket, 0, user.as_bytes().to_vec())
    }

    fn tracked() -> ChangeTracking {
        let store = MemoryEnv::new().open_task(TaskId::new(OperatorId(1), 0)).expect("store");
        ChangeTracking::new(store, 8, 2)
    }

    fn groups(view: &dyn FrozenView) -> Vec<&'static str> {
        let changes = view.changes().expect("tracked");
        changes
            .groups
            .iter()
            .map(|g| match g {
                GroupChanges::Unchanged => "unchanged",
                GroupChanges::Entries { .. } => "entries",
                GroupChanges::Whole => "whole",
            })
            .collect()
    }

    #[test]
    fn the_first_freeze_has_no_base_and_later_ones_log_entries_within_the_budget() -> Result<(), StateError> {
        let store = tracked();
        store.write_many(vec![StateWrite::Put(key(0, "a"), b"1".to_vec())])?;
        let first = store.freeze(&(0..8).collect::<Vec<_>>())?;
        assert_eq!(groups(first.as_ref()), ["whole"; 4]);
        let budgets = Arc::clone(&first.changes().expect("tracked").budgets);
        budgets.set_from_part(0, 0);
        store.write_many(vec![
            StateWrite::Put(key(1, "b"), b"2".to_vec()),
            StateWrite::Delete(key(0, "a")),
            StateWrite::Put(key(5, "c"), b"3".to_vec()),
        ])?;
        store.delete_buckets(&[7])?;
        let second = store.freeze(&(0..8).collect::<Vec<_>>())?;
        // Group 0 has a budget; group 2 has none yet (no part written), group 3 was deleted.
        assert_eq!(groups(second.as_ref()), ["entries", "unchanged", "whole", "whole"]);
        let GroupChanges::Entries { entries, .. } = &second.changes().expect("tracked").groups[0] else {
            panic!("group 0 logged its entries");
        };
        let stored = |k: &StateKey| encode_state_key(k).expect("key");
        assert_eq!(entries.get(&stored(&key(0, "a"))), Some(&None));
        assert_eq!(entries.get(&stored(&key(1, "b"))), Some(&Some(b"2".to_vec())));
        Ok(())
    }

    #[test]
    fn a_group_past_its_budget_is_whole_and_drops_its_log() -> Result<(), StateError> {
        let store = tracked();
        let first = store.freeze(&[])?;
        first.changes().expect("tracked").budgets.set_from_part(1, 0);
        let big = vec![0u8; (MIN_GROUP_BUDGET as usize) / 2];
        // A hot key rewritten many times counts once: the group stays within its budget.
        for _ in 0..8 {
            store.write_many(vec![StateWrite::Put(key(2, "x"), big.clone())])?;
        }
        let hot = store.freeze(&[])?;
        assert_eq!(groups(hot.as_ref()), ["unchanged", "entries", "unchanged", "unchanged"]);
        store.write_many(vec![StateWrite::Put(key(2, "x"), big.clone())])?;
        store.write_many(vec![StateWrite::Put(key(3, "y"), big)])?;
        let second = store.freeze(&[])?;
        assert_eq!(groups(second.as_ref()), ["unchanged", "whole", "unchanged", "unchanged"]);
        Ok(())
    }
}
