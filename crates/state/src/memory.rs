//! In-memory state stores (`[state] backend = "memory"`, Flink's heap backend analogue, and
//! tests): one hash table per bucket of each task, with the same key limits, chunking, order of
//! range reads and lifecycle semantics as the fjall stores. State is bounded by RAM and lost with
//! the process.
//!
//! Why hash tables and not one ordered map: a record's state access is a point read and a point
//! write, and a 1 M-key ordered map spends them in key comparisons and node allocations (`perf`
//! of `koala bench --backend memory`: half of the aggregate task's time in `BTreeMap` search,
//! insert and `malloc`). Range reads — a bucket's scan (hand-over, snapshot) and the progressive
//! pull cursor — sort one bucket's keys: a scan once per call (it reads the whole bucket anyway),
//! the cursor once per bucket and then again only after a new key arrived in it (a bucket being
//! pulled from is no longer owned, so its keys only leave), which keeps a pull O(keys returned)
//! plus the deleted keys it steps over once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use koala_types::{BucketId, TaskId};

use crate::compact::{CompactKey, CompactValue, KeyHash, check_key};
use crate::key::check_value;
use crate::scan::{Chunker, sorted_buckets};
use crate::{ScanSink, StateBackend, StateEnv, StateError, StateKey, StateWrite};
use hashbrown::HashTable;

/// A worker's stores kept in memory; data lives as long as the env.
#[derive(Debug, Default)]
pub struct MemoryEnv {
    tasks: Mutex<HashMap<TaskId, Arc<MemoryStore>>>,
}

impl MemoryEnv {
    /// An env without stores.
    pub fn new() -> Self {
        Self::default()
    }

    fn tasks(
        &self,
        op: &'static str,
    ) -> Result<MutexGuard<'_, HashMap<TaskId, Arc<MemoryStore>>>, StateError> {
        self.tasks
            .lock()
            .map_err(|_| StateError::Poisoned { store: "memory state env task registry".to_owned(), op })
    }
}

impl StateEnv for MemoryEnv {
    fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError> {
        let store = self
            .tasks("open_task")?
            .entry(task)
            .or_insert_with(|| {
                Arc::new(MemoryStore { task, buckets: Mutex::default(), dropped: AtomicBool::new(false) })
            })
            .clone();
        Ok(Box::new(MemoryBackend { store }))
    }

    fn drop_task(&self, task: TaskId) -> Result<(), StateError> {
        if let Some(store) = self.tasks("drop_task")?.remove(&task) {
            store.dropped.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn persist(&self) -> Result<(), StateError> {
        Ok(())
    }
}

/// One bucket's entries: a hash table of inline keys and values, probed with a hash computed
/// once per key ([`CompactKey::hash_value`]), so a batch can touch its keys' slots in one loop of loads
/// before it reads them (as the cache does, `cache.rs`).
#[derive(Debug, Default)]
struct Bucket {
    entries: HashTable<(CompactKey, CompactValue)>,
    /// The keys in stored order for the pull cursor, built on demand and dropped when a key is
    /// added; keys deleted since it was built stay in it and are skipped.
    sorted: Option<Vec<CompactKey>>,
}

impl Bucket {
    fn get(&self, key: &CompactKey, hash: u64) -> Option<&CompactValue> {
        self.entries.find(hash, |(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets the key's value; true if the key is new.
    fn put(&mut self, key: CompactKey, hash: u64, value: CompactValue) -> bool {
        if let Some((_, old)) = self.entries.find_mut(hash, |(k, _)| *k == key) {
            *old = value;
            return false;
        }
        self.entries.insert_unique(hash, (key, value), |(k, _)| k.hash_value());
        self.sorted = None;
        true
    }

    /// Removes the key; true if it was there.
    fn remove(&mut self, key: &CompactKey, hash: u64) -> bool {
        match self.entries.find_entry(hash, |(k, _)| k == key) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Reads the slot a lookup of `hash` reads and returns a byte of it.
    fn touch(&self, hash: u64) -> u8 {
        self.entries.iter_hash(hash).next().map_or(0, |(k, _)| k.bytes()[0])
    }

    /// The keys in stored order (rebuilt when a new key arrived or most listed keys are gone),
    /// and the entries to check them against.
    fn sorted(&mut self) -> (&[CompactKey], &HashTable<(CompactKey, CompactValue)>) {
        let live = self.entries.len();
        if self.sorted.as_ref().is_some_and(|keys| keys.len() > 2 * live + 64) {
            self.sorted = None;
        }
        let entries = &self.entries;
        let sorted = self.sorted.get_or_insert_with(|| {
            let mut keys: Vec<CompactKey> = entries.iter().map(|(k, _)| k.clone()).collect();
            keys.sort_unstable_by(|a, b| a.stored_order().cmp(&b.stored_order()));
            keys
        });
        (sorted, entries)
    }
}

#[derive(Debug, Default)]
struct Buckets {
    by_id: HashMap<BucketId, Bucket, KeyHash>,
    len: u64,
}

#[derive(Debug)]
struct MemoryStore {
    task: TaskId,
    buckets: Mutex<Buckets>,
    dropped: AtomicBool,
}

/// A handle on one task's in-memory store.
#[derive(Debug)]
pub struct MemoryBackend {
    store: Arc<MemoryStore>,
}

impl MemoryBackend {
    /// Locks the task's buckets, refusing if the task was dropped.
    fn buckets(&self, op: &'static str) -> Result<MutexGuard<'_, Buckets>, StateError> {
        let task = self.store.task;
        if self.store.dropped.load(Ordering::Acquire) {
            return Err(StateError::Dropped { task, op });
        }
        self.store
            .buckets
            .lock()
            .map_err(|_| StateError::Poisoned { store: format!("memory state store of task {task}"), op })
    }
}

impl StateBackend for MemoryBackend {
    fn task(&self) -> TaskId {
        self.store.task
    }

    fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        const OP: &str = "get_many";
        let task = self.store.task;
        for key in keys {
            check_key(key).map_err(|source| StateError::Layout { task, op: OP, source })?;
        }
        let buckets = self.buckets(OP)?;
        let located: Vec<(Option<&Bucket>, CompactKey, u64)> = keys
            .iter()
            .map(|key| {
                let compact = CompactKey::new(key);
                let hash = compact.hash_value();
                (buckets.by_id.get(&key.bucket), compact, hash)
            })
            .collect();
        // A loop of loads alone, so that the keys wait for memory together.
        let touched = located.iter().fold(0u8, |acc, (b, _, hash)| acc ^ b.map_or(0, |b| b.touch(*hash)));
        std::hint::black_box(touched);
        Ok(located
            .iter()
            .map(|(bucket, key, hash)| bucket.and_then(|b| b.get(key, *hash)).and_then(CompactValue::get))
            .collect())
    }

    fn write_many(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        const OP: &str = "write_many";
        let task = self.store.task;
        // Check everything first so a rejected entry leaves the store untouched (atomic batch).
        for write in &writes {
            let checked = match write {
                StateWrite::Put(key, value) => check_key(key).and_then(|()| check_value(value)),
                StateWrite::Delete(key) => check_key(key),
            };
            checked.map_err(|source| StateError::Layout { task, op: OP, source })?;
        }
        let mut guard = self.buckets(OP)?;
        let Buckets { by_id, len } = &mut *guard;
        for write in writes {
            match write {
                StateWrite::Put(key, value) => {
                    let bucket = by_id.entry(key.bucket).or_default();
                    let compact = CompactKey::new(&key);
                    let hash = compact.hash_value();
                    if bucket.put(compact, hash, CompactValue::new(Some(value))) {
                        *len += 1;
                    }
                }
                StateWrite::Delete(key) => {
                    let Some(bucket) = by_id.get_mut(&key.bucket) else { continue };
                    let compact = CompactKey::new(&key);
                    if bucket.remove(&compact, compact.hash_value()) {
                        *len -= 1;
                        if bucket.entries.is_empty() {
                            by_id.remove(&key.bucket);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn scan_buckets(
        &self,
        buckets: &[BucketId],
        chunk_bytes: usize,
        sink: ScanSink<'_>,
    ) -> Result<u64, StateError> {
        const OP: &str = "scan_buckets";
        let mut chunker = Chunker::new(chunk_bytes, sink);
        for bucket in sorted_buckets(buckets) {
            // Copy the bucket out so the sink runs without the lock (it may use the store).
            let mut snapshot: Vec<(StateKey, Vec<u8>)> = match self.buckets(OP)?.by_id.get(&bucket) {
                Some(b) => b.entries.iter().filter_map(|(k, v)| Some((k.to_state_key(), v.get()?))).collect(),
                None => Vec::new(),
            };
            snapshot.sort_unstable_by(|(a, _), (b, _)| (a.state, &a.key).cmp(&(b.state, &b.key)));
            for (key, value) in snapshot {
                chunker.push(key, value)?;
            }
        }
        chunker.finish()
    }

    fn bucket_keys_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        const OP: &str = "bucket_keys_after";
        let task = self.store.task;
        let after = match after {
            Some(after) if after.bucket > bucket => return Ok(Vec::new()),
            Some(after) if after.bucket == bucket => {
                check_key(after).map_err(|source| StateError::Layout { task, op: OP, source })?;
                Some((after.state, after.key.as_slice()))
            }
            _ => None,
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut buckets = self.buckets(OP)?;
        let Some(b) = buckets.by_id.get_mut(&bucket) else { return Ok(Vec::new()) };
        let (sorted, entries) = b.sorted();
        let start = after.map_or(0, |after| sorted.partition_point(|k| k.stored_order() <= after));
        let found: Vec<StateKey> = sorted[start..]
            .iter()
            .filter(|k| entries.find(k.hash_value(), |(e, _)| e == *k).is_some())
            .take(limit)
            .map(CompactKey::to_state_key)
            .collect();
        Ok(found)
    }

    fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
        let mut guard = self.buckets("delete_buckets")?;
        let Buckets { by_id, len } = &mut *guard;
        for bucket in buckets {
            if let Some(removed) = by_id.remove(bucket) {
                *len -= removed.entries.len() as u64;
            }
        }
        Ok(())
    }

    fn approximate_len(&self) -> Result<u64, StateError> {
        Ok(self.buckets("approximate_len")?.len)
    }
}
