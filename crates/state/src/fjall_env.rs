//! The default state stores: one embedded fjall LSM database per worker, one keyspace per task.
//!
//! Tuned for a stream processor: writes are never fsynced (durability comes from checkpoints,
//! which call [`StateEnv::persist`]), and by default a batch is not even handed to the OS: the
//! journal keeps it in its userspace buffer until the buffer fills, `persist` runs, or the env is
//! dropped. After a crash without `persist`, a store is not a consistent prefix of its writes and
//! must be restored from a checkpoint.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, OwnedWriteBatch, PersistMode, Readable, Snapshot};
use koala_types::{BucketId, TaskId};

use crate::frozen::{FrozenSink, FrozenView};
use crate::scan::{Chunker, sorted_buckets};
use crate::{
    ScanSink, StateBackend, StateEnv, StateError, StateKey, StateWrite, StoredBatch, bucket_bounds,
    decode_state_key, encode_state_key, encode_write, keys_after_bounds,
};

/// How many tombstones `delete_buckets` commits per batch, bounding its memory on huge buckets.
const DELETE_BATCH_KEYS: usize = 16 * 1024;

/// Tuning of a [`FjallEnv`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FjallConfig {
    /// Block cache shared by all tasks of the worker, in bytes.
    pub cache_bytes: u64,
    /// Write buffer (memtable) of each task's keyspace, in bytes; a full one is flushed to disk.
    pub memtable_bytes: u64,
    /// Hand every committed batch to the OS (`write(2)`, still no fsync), so that it survives a
    /// crash of the process but not of the machine. Off by default: recovery restores checkpoints.
    pub flush_batches_to_os: bool,
    /// fjall's flush and compaction threads (at least 1). Four by default, whatever the cores:
    /// with two, fjall 3.1.13's worker 0 re-sends a compaction request to the pool in a busy
    /// loop for as long as worker 1 compacts (`worker_pool.rs`, the `Compact` arm: it leaves
    /// compactions to the others), and with three or more an idle worker takes the re-sent
    /// request at once. `perf` of the cached sliding-window bench: that loop was 7.8 % of all
    /// samples with two (the fjall workers 9.2 CPU-seconds of 38.5), 0.1 % with four (6.2 of
    /// 36.8). A single worker thread can deadlock fjall 3.1 under write load (fjall PR #323).
    pub worker_threads: usize,
}

impl Default for FjallConfig {
    fn default() -> Self {
        Self {
            cache_bytes: 256 * 1024 * 1024,
            memtable_bytes: 16 * 1024 * 1024,
            flush_batches_to_os: false,
            worker_threads: 4,
        }
    }
}

/// A worker's state stores in one fjall database directory (one keyspace per task).
pub struct FjallEnv {
    db: Database,
    path: PathBuf,
    config: FjallConfig,
    /// Stores opened through this env, so `drop_task` can invalidate their handles.
    tasks: Mutex<HashMap<TaskId, Arc<FjallStore>>>,
}

impl FjallEnv {
    /// Opens (creating if needed) the state directory `dir` with [`FjallConfig::default`].
    ///
    /// # Errors
    /// [`StateError::Open`] if fjall cannot open the directory (I/O error, or another process
    /// holds it).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StateError> {
        Self::open_with(dir, FjallConfig::default())
    }

    /// Opens (creating if needed) the state directory `dir` with the given tuning.
    ///
    /// # Errors
    /// [`StateError::Open`] if fjall cannot open the directory.
    pub fn open_with(dir: impl AsRef<Path>, config: FjallConfig) -> Result<Self, StateError> {
        let path = dir.as_ref().to_path_buf();
        let db = Database::builder(&path)
            .cache_size(config.cache_bytes)
            .manual_journal_persist(!config.flush_batches_to_os)
            .worker_threads(config.worker_threads.max(1))
            .open()
            .map_err(|e| StateError::Open { path: path.clone(), source: Box::new(e) })?;
        Ok(Self { db, path, config, tasks: Mutex::default() })
    }

    /// The state directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name of `task`'s keyspace: `t{operator}_{index}`.
    pub fn keyspace_name(task: TaskId) -> String {
        format!("t{}_{}", task.operator.0, task.index)
    }

    /// Opens a task's store and returns the concrete handle (the trait method boxes it).
    ///
    /// # Errors
    /// [`StateError::Store`] if fjall cannot create or open the keyspace.
    pub fn open_fjall_task(&self, task: TaskId) -> Result<FjallBackend, StateError> {
        let mut tasks = self.tasks("open_task")?;
        let store = match tasks.get(&task) {
            Some(store) => Arc::clone(store),
            None => {
                let keyspace = self
                    .db
                    .keyspace(&Self::keyspace_name(task), || self.keyspace_options())
                    .map_err(store_error(task, "open_task"))?;
                let store = Arc::new(FjallStore { task, keyspace, dropped: AtomicBool::new(false) });
                tasks.insert(task, Arc::clone(&store));
                store
            }
        };
        Ok(FjallBackend {
            store,
            db: self.db.clone(),
            durability: self.config.flush_batches_to_os.then_some(PersistMode::Buffer),
        })
    }

    fn keyspace_options(&self) -> KeyspaceCreateOptions {
        KeyspaceCreateOptions::default()
            .max_memtable_size(self.config.memtable_bytes)
            .manual_journal_persist(!self.config.flush_batches_to_os)
    }

    fn tasks(
        &self,
        op: &'static str,
    ) -> Result<MutexGuard<'_, HashMap<TaskId, Arc<FjallStore>>>, StateError> {
        self.tasks.lock().map_err(|_| StateError::Poisoned {
            store: format!("task registry of state directory {}", self.path.display()),
            op,
        })
    }
}

impl std::fmt::Debug for FjallEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallEnv")
            .field("path", &self.path)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl StateEnv for FjallEnv {
    fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError> {
        Ok(Box::new(self.open_fjall_task(task)?))
    }

    fn drop_task(&self, task: TaskId) -> Result<(), StateError> {
        const OP: &str = "drop_task";
        let mut tasks = self.tasks(OP)?;
        if let Some(store) = tasks.remove(&task) {
            store.dropped.store(true, Ordering::Release);
        }
        let name = Self::keyspace_name(task);
        if self.db.keyspace_exists(&name) {
            // fjall deletes the keyspace's files once the last handle on it is gone.
            let keyspace =
                self.db.keyspace(&name, || self.keyspace_options()).map_err(store_error(task, OP))?;
            self.db.delete_keyspace(keyspace).map_err(store_error(task, OP))?;
        }
        Ok(())
    }

    fn persist(&self) -> Result<(), StateError> {
        self.db.persist(PersistMode::SyncAll).map_err(|e| StateError::Env {
            path: self.path.clone(),
            op: "persist",
            source: Box::new(e),
        })
    }
}

struct FjallStore {
    task: TaskId,
    keyspace: Keyspace,
    dropped: AtomicBool,
}

/// A handle on one task's keyspace in a [`FjallEnv`].
pub struct FjallBackend {
    store: Arc<FjallStore>,
    db: Database,
    /// `None`: leave committed batches in the journal buffer (see the module docs).
    durability: Option<PersistMode>,
}

impl FjallBackend {
    /// The task's keyspace, unless the task was dropped.
    fn keyspace(&self, op: &'static str) -> Result<&Keyspace, StateError> {
        if self.store.dropped.load(Ordering::Acquire) {
            return Err(StateError::Dropped { task: self.store.task, op });
        }
        Ok(&self.store.keyspace)
    }

    fn batch(&self, capacity: usize) -> OwnedWriteBatch {
        OwnedWriteBatch::with_capacity(self.db.clone(), capacity).durability(self.durability)
    }

    /// Flushes the task's memtable and merges all its tables into one run, waiting for both (a
    /// fjall major compaction): a store as a long-running task's is, not one whose bulk load
    /// is still being flushed and compacted in the background. For measurements that must
    /// start from a settled store (`progressive_drain_rate`).
    ///
    /// # Errors
    /// [`StateError::Store`] if fjall fails, [`StateError::Dropped`] if the task was dropped.
    pub fn settle(&self) -> Result<(), StateError> {
        let keyspace = self.keyspace("settle")?;
        keyspace.rotate_memtable_and_wait().map_err(store_error(self.store.task, "settle"))?;
        keyspace.major_compact().map_err(store_error(self.store.task, "settle"))
    }
}

impl std::fmt::Debug for FjallBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallBackend").field("task", &self.store.task).finish_non_exhaustive()
    }
}

impl StateBackend for FjallBackend {
    fn task(&self) -> TaskId {
        self.store.task
    }

    fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        const OP: &str = "get_many";
        let task = self.store.task;
        let keyspace = self.keyspace(OP)?;
        keys.iter()
            .map(|key| {
                let key =
                    encode_state_key(key).map_err(|source| StateError::Layout { task, op: OP, source })?;
                let value = keyspace.get(&key).map_err(store_error(task, OP))?;
                Ok(value.map(|v| v.to_vec()))
            })
            .collect()
    }

    fn write_many(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        const OP: &str = "write_many";
        let task = self.store.task;
        let keyspace = self.keyspace(OP)?;
        let mut batch = self.batch(writes.len());
        for write in writes {
            // A rejected entry returns before commit, so nothing of the batch is written.
            let (key, value) =
                encode_write(write).map_err(|source| StateError::Layout { task, op: OP, source })?;
            match value {
                Some(value) => batch.insert(keyspace, key, value),
                None => batch.remove(keyspace, key),
            }
        }
        // Within one batch all items share a sequence number and the memtable keeps the last
        // item of a key, which gives "last write wins".
        batch.commit().map_err(store_error(task, OP))
    }

    fn write_stored(&self, writes: &StoredBatch) -> Result<(), StateError> {
        const OP: &str = "write_stored";
        let task = self.store.task;
        let keyspace = self.keyspace(OP)?;
        let mut batch = self.batch(writes.len());
        for (key, value) in writes.iter() {
            // Short keys and values are copied inline into fjall's slices: no allocation.
            match value {
                Some(value) => batch.insert(keyspace, key, value),
                None => batch.remove(keyspace, key),
            }
        }
        batch.commit().map_err(store_error(task, OP))
    }

    fn scan_buckets(
        &self,
        buckets: &[BucketId],
        chunk_bytes: usize,
        sink: ScanSink<'_>,
    ) -> Result<u64, StateError> {
        const OP: &str = "scan_buckets";
        let task = self.store.task;
        let keyspace = self.keyspace(OP)?;
        let mut chunker = Chunker::new(chunk_bytes, sink);
        for bucket in sorted_buckets(buckets) {
            for guard in keyspace.range(bucket_bounds(bucket)) {
                let (key, value) = guard.into_inner().map_err(store_error(task, OP))?;
                let key =
                    decode_state_key(&key).map_err(|source| StateError::Layout { task, op: OP, source })?;
                chunker.push(key, value.to_vec())?;
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
        let keyspace = self.keyspace(OP)?;
        // The LSM seeks to the range start, so keys removed before `after` (their tombstones)
        // are not walked; `Guard::key` does not copy the value (nor read it from a blob file).
        keyspace
            .range(range)
            .take(limit)
            .map(|guard| decode_state_key(&guard.key().map_err(store_error(task, OP))?).map_err(layout))
            .collect()
    }

    fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
        const OP: &str = "delete_buckets";
        let task = self.store.task;
        let keyspace = self.keyspace(OP)?;
        // fjall 3 has no range tombstones: write one tombstone per key, in bounded batches.
        let mut batch = self.batch(DELETE_BATCH_KEYS);
        for bucket in sorted_buckets(buckets) {
            for guard in keyspace.range(bucket_bounds(bucket)) {
                let key = guard.key().map_err(store_error(task, OP))?;
                batch.remove(keyspace, key);
                if batch.len() >= DELETE_BATCH_KEYS {
                    std::mem::replace(&mut batch, self.batch(DELETE_BATCH_KEYS))
                        .commit()
                        .map_err(store_error(task, OP))?;
                }
            }
        }
        batch.commit().map_err(store_error(task, OP))
    }

    fn approximate_len(&self) -> Result<u64, StateError> {
        Ok(self.keyspace("approximate_len")?.approximate_len() as u64)
    }

    fn freeze(&self, _buckets: &[BucketId]) -> Result<Box<dyn FrozenView>, StateError> {
        let keyspace = self.keyspace("freeze")?.clone();
        Ok(Box::new(FjallView { task: self.store.task, snapshot: self.db.snapshot(), keyspace }))
    }
}

/// An MVCC read snapshot of a task's keyspace: fjall keeps the versions it sees until it is
/// dropped.
struct FjallView {
    task: TaskId,
    snapshot: Snapshot,
    keyspace: Keyspace,
}

impl FrozenView for FjallView {
    fn scan_bucket(&self, bucket: BucketId, sink: FrozenSink<'_>) -> Result<(), StateError> {
        for guard in self.snapshot.range(&self.keyspace, bucket_bounds(bucket)) {
            let (key, value) = guard.into_inner().map_err(store_error(self.task, "freeze"))?;
            sink(&key, &value)?;
        }
        Ok(())
    }
}

/// Wraps a fjall error of `op` on `task`'s store.
fn store_error(task: TaskId, op: &'static str) -> impl FnOnce(fjall::Error) -> StateError {
    move |e| StateError::Store { task, op, source: Box::new(e) }
}
