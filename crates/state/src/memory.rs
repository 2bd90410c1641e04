//! In-memory state stores (`[state] backend = "memory"`, and tests): one ordered map per task,
//! with the same key layout, limits, chunking and lifecycle semantics as the fjall stores. State
//! is bounded by RAM and lost with the process.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use koala_types::{BucketId, TaskId};

use crate::scan::{Chunker, sorted_buckets};
use crate::{
    ScanSink, StateBackend, StateEnv, StateError, StateKey, StateWrite, bucket_bounds, decode_state_key,
    encode_state_key, encode_write, keys_after_bounds,
};

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
                Arc::new(MemoryStore { task, entries: Mutex::default(), dropped: AtomicBool::new(false) })
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

/// Encoded key → value, so iteration order is the stored-key order of the LSM.
type Entries = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Debug)]
struct MemoryStore {
    task: TaskId,
    entries: Mutex<Entries>,
    dropped: AtomicBool,
}

/// A handle on one task's in-memory store.
#[derive(Debug)]
pub struct MemoryBackend {
    store: Arc<MemoryStore>,
}

impl MemoryBackend {
    /// Locks the task's map, refusing if the task was dropped.
    fn entries(&self, op: &'static str) -> Result<MutexGuard<'_, Entries>, StateError> {
        let task = self.store.task;
        if self.store.dropped.load(Ordering::Acquire) {
            return Err(StateError::Dropped { task, op });
        }
        self.store
            .entries
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
        let encoded = keys
            .iter()
            .map(encode_state_key)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| StateError::Layout { task, op: OP, source })?;
        let entries = self.entries(OP)?;
        Ok(encoded.iter().map(|key| entries.get(key).cloned()).collect())
    }

    fn write_many(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        const OP: &str = "write_many";
        let task = self.store.task;
        // Encode everything first so a rejected entry leaves the store untouched (atomic batch).
        let encoded = writes
            .into_iter()
            .map(encode_write)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| StateError::Layout { task, op: OP, source })?;
        let mut entries = self.entries(OP)?;
        for (key, value) in encoded {
            match value {
                Some(value) => entries.insert(key, value),
                None => entries.remove(&key),
            };
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
        let task = self.store.task;
        let mut chunker = Chunker::new(chunk_bytes, sink);
        for bucket in sorted_buckets(buckets) {
            // Copy the bucket out so the sink runs without the lock (it may use the store).
            let snapshot: Vec<(Vec<u8>, Vec<u8>)> =
                self.entries(OP)?.range(bucket_bounds(bucket)).map(|(k, v)| (k.clone(), v.clone())).collect();
            for (key, value) in snapshot {
                let key =
                    decode_state_key(&key).map_err(|source| StateError::Layout { task, op: OP, source })?;
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
        let layout = |source| StateError::Layout { task, op: OP, source };
        let Some(range) = keys_after_bounds(bucket, after).map_err(layout)? else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let entries = self.entries(OP)?;
        entries.range(range).take(limit).map(|(k, _)| decode_state_key(k).map_err(layout)).collect()
    }

    fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
        let mut entries = self.entries("delete_buckets")?;
        for bucket in sorted_buckets(buckets) {
            let doomed: Vec<Vec<u8>> = entries.range(bucket_bounds(bucket)).map(|(k, _)| k.clone()).collect();
            for key in doomed {
                entries.remove(&key);
            }
        }
        Ok(())
    }

    fn approximate_len(&self) -> Result<u64, StateError> {
        Ok(self.entries("approximate_len")?.len() as u64)
    }
}
