//! A store whose state arrives on first access (docs/architecture.md §10, "Lazy recovery"): a
//! [`LazyBackend`] wraps a task's store after a failure, while its state is still in a
//! checkpoint. Its buckets fall into groups of `group_buckets` consecutive buckets; a group is
//! *loaded* once its [`GroupLoader`] wrote it into the store below. Every operation that touches
//! a bucket — read, write, scan, key listing, delete, release — first loads the bucket's group
//! (once, under that group's lock: a concurrent access waits for the load, never sees half of
//! it), so the task sees exactly the state it would have seen had every group been loaded before
//! it started; a background thread ([`LazyBackend::start_background`]) loads the groups nobody
//! asked for yet, in order. A freeze (a checkpoint's barrier) loads every group first: a
//! checkpoint holds the whole state.
//!
//! ```
//! use koala_state::lazy::{GroupLoader, LazyBackend};
//! use koala_state::{MemoryEnv, StateBackend, StateEnv, StateError, StateKey, StateWrite};
//! use koala_types::{OperatorId, TaskId};
//!
//! /// Puts one key, `k`, in each bucket of a group.
//! struct OneKeyPerBucket;
//! impl GroupLoader for OneKeyPerBucket {
//!     fn load(&self, store: &dyn StateBackend, buckets: std::ops::Range<u16>) -> Result<(), StateError> {
//!         let writes = buckets.map(|b| StateWrite::Put(StateKey::new(b, 0, b"k".to_vec()), b"v".to_vec()));
//!         store.write_many(writes.collect())
//!     }
//! }
//!
//! # fn main() -> Result<(), StateError> {
//! let inner = MemoryEnv::new().open_task(TaskId::new(OperatorId(1), 0))?;
//! let store = LazyBackend::new(inner, 16, 4, Box::new(OneKeyPerBucket));
//! assert_eq!(store.unloaded_groups(), 4);
//! // Reading bucket 5 loads buckets 4..8 only.
//! assert_eq!(store.get_many(&[StateKey::new(5, 0, b"k".to_vec())])?, vec![Some(b"v".to_vec())]);
//! assert_eq!(store.unloaded_groups(), 3);
//! # Ok(())
//! # }
//! ```

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use koala_types::{BucketId, TaskId};

use crate::{CacheCounts, FrozenView, ScanSink, StateBackend, StateError, StateKey, StateWrite, StoredBatch};

/// Writes a group's state into a store on its first access.
pub trait GroupLoader: Send + Sync {
    /// Writes the state of `buckets` into `store`, replacing whatever it holds of them. Called
    /// at most once per group that succeeds; a failed load is tried again on the next access.
    fn load(&self, store: &dyn StateBackend, buckets: Range<BucketId>) -> Result<(), StateError>;
}

/// What the handle and its background loader share.
struct Groups {
    inner: Box<dyn StateBackend>,
    loader: Box<dyn GroupLoader>,
    num_buckets: u16,
    group_buckets: u16,
    loaded: Vec<AtomicBool>,
    locks: Vec<Mutex<()>>,
    unloaded: AtomicUsize,
    /// Set when the handle is dropped: the background loader stops at its next group.
    stop: AtomicBool,
}

impl Groups {
    fn group_of(&self, bucket: BucketId) -> usize {
        usize::from(bucket / self.group_buckets).min(self.loaded.len().saturating_sub(1))
    }

    fn buckets_of(&self, group: usize) -> Range<BucketId> {
        let start = (group as u32 * u32::from(self.group_buckets)).min(u32::from(self.num_buckets));
        let end = (start + u32::from(self.group_buckets)).min(u32::from(self.num_buckets));
        start as BucketId..end as BucketId
    }

    /// Loads `group` unless it is loaded.
    fn ensure(&self, group: usize) -> Result<(), StateError> {
        let Some(loaded) = self.loaded.get(group) else { return Ok(()) };
        if loaded.load(Ordering::Acquire) {
            return Ok(());
        }
        let _guard = self.locks[group].lock().map_err(|_| StateError::Poisoned {
            store: format!("lazily loaded store of task {}", self.inner.task()),
            op: "load a bucket group",
        })?;
        if loaded.load(Ordering::Acquire) {
            return Ok(());
        }
        self.loader.load(self.inner.as_ref(), self.buckets_of(group))?;
        loaded.store(true, Ordering::Release);
        self.unloaded.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }

    fn ensure_bucket(&self, bucket: BucketId) -> Result<(), StateError> {
        if self.unloaded.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.ensure(self.group_of(bucket))
    }

    fn ensure_buckets(&self, buckets: impl IntoIterator<Item = BucketId>) -> Result<(), StateError> {
        for bucket in buckets {
            self.ensure_bucket(bucket)?;
        }
        Ok(())
    }

    fn ensure_all(&self) -> Result<(), StateError> {
        for group in 0..self.loaded.len() {
            self.ensure(group)?;
        }
        Ok(())
    }
}

/// A task's store whose bucket groups are loaded on first access (see the module docs).
pub struct LazyBackend {
    groups: Arc<Groups>,
}

impl LazyBackend {
    /// Wraps `inner`, none of whose `num_buckets` buckets is loaded yet, in groups of
    /// `group_buckets` (at least 1) that `loader` loads.
    pub fn new(
        inner: Box<dyn StateBackend>,
        num_buckets: u16,
        group_buckets: u16,
        loader: Box<dyn GroupLoader>,
    ) -> Self {
        let group_buckets = group_buckets.max(1);
        let n = usize::from(num_buckets.div_ceil(group_buckets));
        Self {
            groups: Arc::new(Groups {
                inner,
                loader,
                num_buckets,
                group_buckets,
                loaded: (0..n).map(|_| AtomicBool::new(false)).collect(),
                locks: (0..n).map(|_| Mutex::new(())).collect(),
                unloaded: AtomicUsize::new(n),
                stop: AtomicBool::new(false),
            }),
        }
    }

    /// Loads every group not loaded yet, on this thread.
    pub fn load_all(&self) -> Result<(), StateError> {
        self.groups.ensure_all()
    }

    /// Groups not loaded yet.
    pub fn unloaded_groups(&self) -> usize {
        self.groups.unloaded.load(Ordering::Acquire)
    }

    /// Starts a thread that loads every group not loaded yet, in order, and logs when all are
    /// (or why it stopped: a group that failed is tried again by the access that needs it).
    pub fn start_background(&self) -> Result<(), StateError> {
        let groups = Arc::clone(&self.groups);
        let task = groups.inner.task();
        std::thread::Builder::new()
            .name(format!("lazy-{}-{}", task.operator.0, task.index))
            .spawn(move || {
                let started = Instant::now();
                for group in 0..groups.loaded.len() {
                    if groups.stop.load(Ordering::Acquire) {
                        return;
                    }
                    if let Err(e) = groups.ensure(group) {
                        tracing::warn!(%task, group, error = %e, "loading a bucket group in the background failed");
                        return;
                    }
                }
                tracing::info!(%task, secs = started.elapsed().as_secs_f64(), "every bucket group loaded");
            })
            .map(drop)
            .map_err(|e| StateError::Store { task, op: "start the background loader", source: Box::new(e) })
    }
}

impl Drop for LazyBackend {
    fn drop(&mut self) {
        self.groups.stop.store(true, Ordering::Release);
    }
}

/// The bucket of a stored key (its first two bytes), if it has one.
fn stored_bucket(key: &[u8]) -> Option<BucketId> {
    Some(u16::from_be_bytes([*key.first()?, *key.get(1)?]))
}

impl StateBackend for LazyBackend {
    fn task(&self) -> TaskId {
        self.groups.inner.task()
    }

    fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        self.groups.ensure_buckets(keys.iter().map(|k| k.bucket))?;
        self.groups.inner.get_many(keys)
    }

    fn write_many(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        self.groups.ensure_buckets(writes.iter().map(|w| w.key().bucket))?;
        self.groups.inner.write_many(writes)
    }

    fn write_stored(&self, writes: &StoredBatch) -> Result<(), StateError> {
        // A key too short to name a bucket is the store's to refuse.
        self.groups.ensure_buckets(writes.iter().filter_map(|(key, _)| stored_bucket(key)))?;
        self.groups.inner.write_stored(writes)
    }

    fn scan_buckets(
        &self,
        buckets: &[BucketId],
        chunk_bytes: usize,
        sink: ScanSink<'_>,
    ) -> Result<u64, StateError> {
        self.groups.ensure_buckets(buckets.iter().copied())?;
        self.groups.inner.scan_buckets(buckets, chunk_bytes, sink)
    }

    fn bucket_keys_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        self.groups.ensure_bucket(bucket)?;
        self.groups.inner.bucket_keys_after(bucket, after, limit)
    }

    fn bucket_key_candidates_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        self.groups.ensure_bucket(bucket)?;
        self.groups.inner.bucket_key_candidates_after(bucket, after, limit)
    }

    fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
        self.groups.ensure_buckets(buckets.iter().copied())?;
        self.groups.inner.delete_buckets(buckets)
    }

    fn approximate_len(&self) -> Result<u64, StateError> {
        self.groups.inner.approximate_len()
    }

    fn is_shared(&self) -> bool {
        self.groups.inner.is_shared()
    }

    fn release_buckets(&self, buckets: &[BucketId]) -> Result<u64, StateError> {
        self.groups.ensure_buckets(buckets.iter().copied())?;
        self.groups.inner.release_buckets(buckets)
    }

    fn freeze(&self, buckets: &[BucketId]) -> Result<Box<dyn FrozenView>, StateError> {
        // A checkpoint holds the whole state: what is still only in the restored checkpoint is
        // loaded first (that checkpoint may be deleted once this one completes).
        self.groups.ensure_all()?;
        self.groups.inner.freeze(buckets)
    }

    fn cache_counts(&self) -> Option<CacheCounts> {
        self.groups.inner.cache_counts()
    }

    fn charge_outside(&self, bytes: usize) {
        self.groups.inner.charge_outside(bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;
    use crate::{MemoryEnv, StateEnv};
    use koala_types::OperatorId;

    /// Loads `k` = "old" into every bucket of a group, counting loads.
    struct Counting(Arc<AtomicU32>);

    impl GroupLoader for Counting {
        fn load(&self, store: &dyn StateBackend, buckets: Range<BucketId>) -> Result<(), StateError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            store.delete_buckets(&buckets.clone().collect::<Vec<_>>())?;
            let writes =
                buckets.map(|b| StateWrite::Put(StateKey::new(b, 0, b"k".to_vec()), b"old".to_vec()));
            store.write_many(writes.collect())
        }
    }

    fn lazy(loads: &Arc<AtomicU32>) -> Result<LazyBackend, StateError> {
        let inner = MemoryEnv::new().open_task(TaskId::new(OperatorId(1), 0))?;
        // Stale state of before the failure: the load replaces it.
        inner.write_many(vec![StateWrite::Put(StateKey::new(9, 0, b"stale".to_vec()), b"x".to_vec())])?;
        Ok(LazyBackend::new(inner, 10, 4, Box::new(Counting(Arc::clone(loads)))))
    }

    /// A write loads its group first: the load never overwrites it, and a group loads once.
    #[test]
    fn a_write_lands_on_its_loaded_group_and_each_group_loads_once() -> Result<(), StateError> {
        let loads = Arc::new(AtomicU32::new(0));
        let store = lazy(&loads)?;
        let k = StateKey::new(5, 0, b"k".to_vec());
        store.write_many(vec![StateWrite::Put(k.clone(), b"new".to_vec())])?;
        assert_eq!((loads.load(Ordering::SeqCst), store.unloaded_groups()), (1, 2));
        store.start_background()?;
        while store.unloaded_groups() > 0 {
            std::thread::yield_now();
        }
        assert_eq!(loads.load(Ordering::SeqCst), 3, "10 buckets in groups of 4: 3 loads");
        assert_eq!(store.get_many(&[k])?, vec![Some(b"new".to_vec())]);
        let last = StateKey::new(9, 0, b"k".to_vec());
        assert_eq!(store.get_many(&[last])?, vec![Some(b"old".to_vec())]);
        assert_eq!(store.get_many(&[StateKey::new(9, 0, b"stale".to_vec())])?, vec![None]);
        Ok(())
    }

    /// A freeze loads every group: the checkpoint it writes holds the whole state.
    #[test]
    fn a_freeze_loads_every_group() -> Result<(), StateError> {
        let loads = Arc::new(AtomicU32::new(0));
        let store = lazy(&loads)?;
        let view = store.freeze(&[0, 9])?;
        assert_eq!(store.unloaded_groups(), 0);
        let mut seen = Vec::new();
        view.scan_bucket(9, &mut |key, value| {
            seen.push((key.to_vec(), value.to_vec()));
            Ok(())
        })?;
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].1, b"old".to_vec());
        Ok(())
    }
}
