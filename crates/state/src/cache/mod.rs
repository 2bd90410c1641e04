//! A bounded write-back cache per task in front of another store (fjall by default), so that a
//! task's working set is read and written in memory (docs/architecture.md §5, "Cache").
//!
//! Policy:
//! - **Reads** hit the cache; misses go to the inner store in one `get_many` per call and are
//!   cached, absent keys too (a new key then costs one LSM lookup, not one per batch).
//! - **Writes** only change the cache and mark the entry dirty (a delete is a dirty "absent").
//! - **Write-back** happens (a) on eviction: when the cache is over its byte budget, a CLOCK hand
//!   evicts cached entries until they are 1/256 of the budget below what is left of it; the
//!   dirty victims move to an *in-flight* map (still charged, still read by lookups) and a
//!   queued run, and the env's write-back thread writes all runs queued for the task as one
//!   batch, sorted by key, then drops them from the in-flight map (in slices of 1 024 keys per
//!   lock hold). The task thread never waits for the store below on eviction, unless the
//!   in-flight bytes pass 1/16 of the budget (the writer cannot keep up: backpressure), so the
//!   cache holds at most 17/16 of its budget;
//!   (b) before a bucket scan — [`StateBackend::scan_buckets`] (hand-over, stop-and-restart
//!   transfer) waits for the task's in-flight runs, then writes back the dirty entries of the
//!   buckets it reads (found through a per-bucket dirty list, O(their dirty keys), not O(cache));
//!   (c) at [`StateEnv::persist`]
//!   (checkpoints), which waits for the in-flight runs and writes back every task's dirty entries
//!   before the inner store syncs.
//!   Every synchronous write below first waits for the task's in-flight runs, so writes of a key
//!   reach the store below in the order they were made (last write wins there too).
//! - [`StateBackend::bucket_keys_after`] (the key-only pages progressive pulls and membership
//!   filters walk) writes nothing back: after waiting for the in-flight runs it merges the
//!   bucket's dirty keys, kept in stored order (what turned dirty since the last page is sorted
//!   and merged in), with the store's keys, a dirty entry deciding over the store (a deleted one
//!   is skipped). Writing back first made a retired task holding 2.3 M dirty keys (a cache
//!   sized to its state) write all of them to the LSM before its first filter could go out:
//!   5 s in which every new key of its buckets cost a round trip (the 10 M-key scale-in).
//! - [`StateBackend::delete_buckets`] waits for the in-flight runs, drops the buckets' cached
//!   entries (dirty ones are never written) and deletes them below. It walks the whole cache
//!   once: it runs once per bucket move.
//! - [`StateBackend::approximate_len`] is the inner estimate plus the dirty and in-flight puts.
//! - [`StateBackend::release_buckets`] (shared inner stores only: the remote backend) writes back
//!   the buckets' dirty entries and forgets them, leaving them in the shared store for the next
//!   owner (the `remote` protocol's flush, docs/protocols.md §7.1).
//!
//! All handles on one task share one cache (a store opened twice sees its own writes), guarded by
//! one mutex that is held across inner calls except a scan's sink (which may use the store) and
//! the writer thread's batches.
//!
//! Why write-back and not write-through: the workload that motivated it (a running aggregate over
//! 1 M uniform keys) rewrites every key it reads, so write-through would keep one LSM insert per
//! distinct key per batch on the hot path — the memtable skip-list search that dominated `perf`.
//! Why a writer thread: an eviction step written on the task thread stalled its batch (~10 ms
//! per MiB at 64 MiB), and fjall itself blocks a writer now and then (the journal lock is held
//! across an fsync when a memtable is flushed; writes halt while level 0 is too deep).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use koala_types::{BucketId, TaskId};

use crate::compact::{CompactKey, CompactValue, check_key};
use crate::frozen::{FrozenBuckets, OverlayView};
use crate::key::check_value;
use crate::scan::sorted_buckets;
use crate::{
    CacheCounts, FrozenView, ScanSink, StateBackend, StateEnv, StateError, StateKey, StateWrite, StoredBatch,
};

mod entries;
mod task_cache;

use task_cache::{Listing, Run, TaskCache};

/// Bytes charged per cached entry besides key and value bytes on the heap (long keys, values):
/// the hash table slot (inline key, inline value, flags: one 64-byte line) at a load of 1/2 (the
/// tables' load is between 1/4 and 7/8) with its control bytes, and a dirty-list copy of the key
/// (32), rounded up (a unit test checks it covers the real sizes). An in-flight entry (an
/// in-flight map slot and its run's copy of the key) costs less and is charged the same.
pub const ENTRY_OVERHEAD_BYTES: usize = 168;

/// Stores of another env, each behind a write-back cache of `cache_bytes` (see the module docs).
pub struct CachedEnv<E> {
    inner: E,
    cache_bytes: usize,
    /// Budgets set per task ([`StateEnv::set_cache_budget`]), instead of `cache_bytes`.
    budgets: Mutex<HashMap<TaskId, usize>>,
    tasks: Mutex<HashMap<TaskId, Arc<SharedCache>>>,
    writer: Arc<WriteBackQueue>,
    writer_thread: Option<JoinHandle<()>>,
}

impl<E: StateEnv> CachedEnv<E> {
    /// Puts a cache of `cache_bytes` in front of every store of `inner`.
    pub fn new(inner: E, cache_bytes: usize) -> Self {
        let writer = Arc::new(WriteBackQueue::default());
        let queue = Arc::clone(&writer);
        // Without the thread, every run is written by the task that queues it (see `enqueue`).
        let writer_thread =
            std::thread::Builder::new().name("koala-write-back".to_owned()).spawn(move || queue.run()).ok();
        if writer_thread.is_none() {
            writer.close();
        }
        Self { inner, cache_bytes, budgets: Mutex::default(), tasks: Mutex::default(), writer, writer_thread }
    }

    /// The wrapped env.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// The budget of `task`'s cache: the one set for it, else the env's.
    fn budget_of(&self, task: TaskId) -> Result<usize, StateError> {
        let budgets = self
            .budgets
            .lock()
            .map_err(|_| StateError::Poisoned { store: "state cache budgets".to_owned(), op: "budget" })?;
        Ok(budgets.get(&task).copied().unwrap_or(self.cache_bytes))
    }

    fn tasks(
        &self,
        op: &'static str,
    ) -> Result<MutexGuard<'_, HashMap<TaskId, Arc<SharedCache>>>, StateError> {
        self.tasks
            .lock()
            .map_err(|_| StateError::Poisoned { store: "state cache task registry".to_owned(), op })
    }
}

impl<E> Drop for CachedEnv<E> {
    /// Lets the writer finish the runs queued so far, then stops it.
    fn drop(&mut self) {
        self.writer.close();
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
    }
}

impl<E> std::fmt::Debug for CachedEnv<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedEnv").field("cache_bytes", &self.cache_bytes).finish_non_exhaustive()
    }
}

impl<E: StateEnv> StateEnv for CachedEnv<E> {
    fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError> {
        let mut tasks = self.tasks("open_task")?;
        let shared = match tasks.get(&task) {
            Some(shared) => Arc::clone(shared),
            None => {
                let inner = self.inner.open_task(task)?;
                // Which keys are below is known only if nothing else writes there and it starts
                // empty (a restarted worker's store holds keys this cache never wrote).
                let known_empty = !inner.is_shared() && inner.approximate_len()? == 0;
                let budget = self.budget_of(task)?;
                let shared = Arc::new(SharedCache {
                    task,
                    inner,
                    cache: Mutex::new(TaskCache::new(budget, known_empty)),
                    written_back: Condvar::new(),
                    writer: Arc::clone(&self.writer),
                    dropped: AtomicBool::new(false),
                });
                tasks.insert(task, Arc::clone(&shared));
                shared
            }
        };
        Ok(Box::new(CachedBackend { shared }))
    }

    fn drop_task(&self, task: TaskId) -> Result<(), StateError> {
        if let Ok(mut budgets) = self.budgets.lock() {
            budgets.remove(&task);
        }
        if let Some(shared) = self.tasks("drop_task")?.remove(&task) {
            shared.dropped.store(true, Ordering::Release);
        }
        self.inner.drop_task(task)
    }

    fn persist(&self) -> Result<(), StateError> {
        let shared: Vec<Arc<SharedCache>> = self.tasks("persist")?.values().cloned().collect();
        for shared in shared {
            let mut cache = shared.idle(shared.lock("persist")?, "persist")?;
            cache.write_back_all(shared.inner.as_ref())?;
        }
        self.inner.persist()
    }

    fn set_cache_budget(&self, task: TaskId, bytes: usize) -> Result<bool, StateError> {
        const OP: &str = "set_cache_budget";
        let bytes = bytes.max(MIN_BUDGET_BYTES);
        self.budgets
            .lock()
            .map_err(|_| StateError::Poisoned { store: "state cache budgets".to_owned(), op: OP })?
            .insert(task, bytes);
        let shared = self.tasks(OP)?.get(&task).cloned();
        if let Some(shared) = shared {
            let mut cache = shared.lock(OP)?;
            cache.capacity = bytes;
            // Evicts down to the new budget now; dirty victims go to the writer as on any
            // eviction. Without waiting for it: the caller is the worker's control loop, and
            // the task's own next operation waits if too much is in flight.
            shared.evict_without_waiting(cache);
        }
        Ok(true)
    }
}

/// The smallest budget a cache is given (a share can round to less): a few entries fit.
pub const MIN_BUDGET_BYTES: usize = 1 << 20;

/// The tasks whose caches queued runs for the write-back thread, oldest first.
#[derive(Default)]
struct WriteBackQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    tasks: VecDeque<Weak<SharedCache>>,
    closed: bool,
}

impl WriteBackQueue {
    /// Asks the writer to write `shared`'s queued runs; false if the writer is gone.
    fn notify(&self, shared: &Arc<SharedCache>) -> bool {
        let Ok(mut state) = self.state.lock() else { return false };
        if state.closed {
            return false;
        }
        state.tasks.push_back(Arc::downgrade(shared));
        self.ready.notify_one();
        true
    }

    fn close(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.closed = true;
        }
        self.ready.notify_all();
    }

    /// The writer thread: writes queued runs until closed and drained.
    fn run(&self) {
        loop {
            let next = {
                let Ok(mut state) = self.state.lock() else { return };
                loop {
                    if let Some(task) = state.tasks.pop_front() {
                        break task;
                    }
                    if state.closed {
                        return;
                    }
                    state = match self.ready.wait(state) {
                        Ok(state) => state,
                        Err(_) => return,
                    };
                }
            };
            // A dropped task's runs are not needed any more.
            if let Some(shared) = next.upgrade() {
                shared.write_queued_runs();
            }
        }
    }
}

struct SharedCache {
    task: TaskId,
    inner: Box<dyn StateBackend>,
    cache: Mutex<TaskCache>,
    /// Signalled whenever in-flight runs were written.
    written_back: Condvar,
    writer: Arc<WriteBackQueue>,
    dropped: AtomicBool,
}

impl SharedCache {
    fn lock(&self, op: &'static str) -> Result<MutexGuard<'_, TaskCache>, StateError> {
        if self.dropped.load(Ordering::Acquire) {
            return Err(StateError::Dropped { task: self.task, op });
        }
        let cache = self.cache.lock().map_err(|_| self.poisoned(op))?;
        self.check_writer(&cache, op)?;
        Ok(cache)
    }

    fn poisoned(&self, op: &'static str) -> StateError {
        StateError::Poisoned { store: format!("state cache of task {}", self.task), op }
    }

    /// A failed write-back fails every later operation (a store error is fatal, see [`StateError`]).
    fn check_writer(&self, cache: &TaskCache, op: &'static str) -> Result<(), StateError> {
        match &cache.write_back_failed {
            Some(message) => Err(StateError::Store {
                task: self.task,
                op,
                source: format!("an earlier background write-back failed: {message}").into(),
            }),
            None => Ok(()),
        }
    }

    /// Waits until the task has no in-flight runs (so a write below lands after them).
    fn idle<'a>(
        &'a self,
        cache: MutexGuard<'a, TaskCache>,
        op: &'static str,
    ) -> Result<MutexGuard<'a, TaskCache>, StateError> {
        if cache.is_idle() {
            return Ok(cache);
        }
        let cache = self.written_back.wait_while(cache, |c| !c.is_idle()).map_err(|_| self.poisoned(op))?;
        self.check_writer(&cache, op)?;
        Ok(cache)
    }

    /// Evicts if over budget; hands a run of dirty victims to the writer (or, without one,
    /// writes it here), and waits while too much is in flight.
    fn evict(
        self: &Arc<Self>,
        mut cache: MutexGuard<'_, TaskCache>,
        op: &'static str,
    ) -> Result<(), StateError> {
        if !cache.evict_if_full() {
            return Ok(());
        }
        if !self.writer.notify(self) {
            drop(cache);
            self.write_queued_runs();
            return self.lock(op).map(drop);
        }
        self.wait_for_room(cache, op)
    }

    /// Evicts if over budget and hands the dirty victims to the writer (or, without one, writes
    /// them here), without waiting for room (a resize by the worker's control loop).
    fn evict_without_waiting(self: &Arc<Self>, mut cache: MutexGuard<'_, TaskCache>) {
        if cache.evict_if_full() && !self.writer.notify(self) {
            drop(cache);
            self.write_queued_runs();
        }
    }

    /// Waits while more than 1/16 of the budget is in flight (backpressure on the task).
    fn wait_for_room(
        &self,
        mut cache: MutexGuard<'_, TaskCache>,
        op: &'static str,
    ) -> Result<(), StateError> {
        if cache.in_flight_bytes > cache.capacity / 16 {
            cache = self
                .written_back
                .wait_while(cache, |c| c.in_flight_bytes > c.capacity / 16 && !c.is_idle())
                .map_err(|_| self.poisoned(op))?;
            self.check_writer(&cache, op)?;
        }
        Ok(())
    }

    /// Writes every run queued so far, oldest first, as one batch sorted by key.
    fn write_queued_runs(&self) {
        loop {
            let runs = {
                let Ok(mut cache) = self.cache.lock() else { return };
                // One writer at a time per task, or runs could land out of order (only when the
                // env's writer is closing while a task still queues and writes runs itself).
                while cache.writing {
                    cache = match self.written_back.wait(cache) {
                        Ok(cache) => cache,
                        Err(_) => return,
                    };
                }
                if cache.queued.is_empty() {
                    return;
                }
                cache.writing = true;
                std::mem::take(&mut cache.queued)
            };
            // A panic below must not leave `writing` set: every waiter of the task would hang.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.inner.write_stored(&sorted_batch(&runs))
            }))
            .unwrap_or_else(|_| {
                Err(StateError::Store {
                    task: self.task,
                    op: "write-back",
                    source: "the store panicked while writing".into(),
                })
            });
            // In slices, releasing the lock in between: a batch holds tens of thousands of
            // keys, and the task thread must not wait for all of them (it reads the cache).
            let mut finished = runs.iter().flat_map(|run| run.keys.iter().map(move |key| (key, run.seq)));
            let mut cache = loop {
                let Ok(mut cache) = self.cache.lock() else { return };
                let mut slice = 0;
                for (key, seq) in finished.by_ref() {
                    cache.finish_in_flight(key, seq);
                    slice += 1;
                    if slice == 1024 {
                        break;
                    }
                }
                if slice < 1024 {
                    break cache;
                }
            };
            cache.writing = false;
            if let Err(e) = result
                && !self.dropped.load(Ordering::Acquire)
                && cache.write_back_failed.is_none()
            {
                cache.write_back_failed = Some(error_chain(&e));
            }
            drop(cache);
            self.written_back.notify_all();
        }
    }
}

/// An error with its sources, for a message kept after the error is gone.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// The writes of `runs` in one batch, sorted by stored key; a key in several runs keeps the
/// order of the runs (the sort is stable), so the last write wins.
fn sorted_batch(runs: &VecDeque<Run>) -> StoredBatch {
    let mut writes: Vec<(&[u8], Option<&[u8]>)> = runs.iter().flat_map(|run| run.writes.iter()).collect();
    writes.sort_by(|a, b| a.0.cmp(b.0));
    let mut batch = StoredBatch::default();
    for (key, value) in writes {
        batch.push(|out| out.extend_from_slice(key), value);
    }
    batch
}

/// A handle on one task's cached store in a [`CachedEnv`].
pub struct CachedBackend {
    shared: Arc<SharedCache>,
}

impl std::fmt::Debug for CachedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedBackend").field("task", &self.shared.task).finish_non_exhaustive()
    }
}

impl StateBackend for CachedBackend {
    fn task(&self) -> TaskId {
        self.shared.task
    }

    fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        const OP: &str = "get_many";
        let task = self.shared.task;
        let mut cache = self.shared.lock(OP)?;
        let mut out = Vec::with_capacity(keys.len());
        let mut misses = Vec::new();
        let mut located = Vec::with_capacity(keys.len());
        for key in keys {
            check_key(key).map_err(|source| StateError::Layout { task, op: OP, source })?;
            let cached = CompactKey::new(key);
            let (hash, shard) = cache.entries.locate(&cached);
            located.push((cached, hash, shard));
        }
        // A loop of loads alone, so that many are in flight at once. (Touching each key 16
        // keys ahead of its lookup instead measured slower.)
        let touched =
            located.iter().fold(0u8, |acc, &(_, hash, shard)| acc ^ cache.entries.touch(hash, shard));
        for (i, (cached, hash, shard)) in located.iter().enumerate() {
            match cache.entries.get_located(cached, *hash, *shard) {
                Some(slot) => {
                    slot.referenced = true;
                    out.push(slot.value.get());
                }
                None => {
                    out.push(None);
                    misses.push(i);
                }
            }
        }
        std::hint::black_box(touched);
        cache.counts.hits += (keys.len() - misses.len()) as u64;
        if misses.is_empty() {
            return Ok(out);
        }
        // The misses' written-keys filter blocks first, in one loop of loads (as above).
        if let Some(written) = &cache.written {
            let touched =
                misses.iter().fold(0u8, |acc, &i| acc ^ written.touch(located[i].0.bucket(), located[i].1));
            std::hint::black_box(touched);
        }
        // A miss in flight is read from there (cached clean: it equals what will be below once
        // its run is written); one never written below is absent without a read below.
        let mut below = Vec::with_capacity(misses.len());
        for i in misses {
            let (hash, shard) = (located[i].1, located[i].2);
            let cached = std::mem::take(&mut located[i].0);
            if let Some(in_flight) = cache.in_flight.get(&cached) {
                let value = in_flight.value.get();
                cache.counts.hits += 1;
                out[i].clone_from(&value);
                cache.set_hashed(cached, hash, shard, CompactValue::new(value), false);
            } else if cache.may_be_below(&cached, hash) {
                cache.counts.misses += 1;
                below.push((cached, hash, shard, i));
            } else {
                cache.counts.misses += 1;
                cache.set_hashed(cached, hash, shard, CompactValue::Absent, false);
            }
        }
        if !below.is_empty() {
            let keys: Vec<StateKey> = below.iter().map(|&(_, _, _, i)| keys[i].clone()).collect();
            let values = self.shared.inner.get_many(&keys)?;
            for ((cached, hash, shard, i), value) in below.into_iter().zip(values) {
                out[i].clone_from(&value);
                // A key asked for twice in one call is cached once (the second insert
                // overwrites an identical clean entry).
                cache.set_hashed(cached, hash, shard, CompactValue::new(value), false);
            }
        }
        self.shared.evict(cache, OP)?;
        Ok(out)
    }

    fn write_many(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        const OP: &str = "write_many";
        let task = self.shared.task;
        // Check everything first so a rejected entry leaves the store untouched (atomic batch).
        for write in &writes {
            check_key(write.key())
                .and_then(|()| match write {
                    StateWrite::Put(_, value) => check_value(value),
                    StateWrite::Delete(_) => Ok(()),
                })
                .map_err(|source| StateError::Layout { task, op: OP, source })?;
        }
        let mut cache = self.shared.lock(OP)?;
        // Located first, then every key's lines touched in one loop of loads (as in `get_many`):
        // a batch of keys new to a table bigger than the CPU caches (a pull's 512 keys at a
        // scale-in) waits for memory together, not one key after another.
        let located: Vec<(CompactKey, u64, usize, CompactValue)> = writes
            .into_iter()
            .map(|write| {
                let (key, value) = match write {
                    StateWrite::Put(key, value) => (CompactKey::new(&key), CompactValue::new(Some(value))),
                    StateWrite::Delete(key) => (CompactKey::new(&key), CompactValue::Absent),
                };
                let (hash, shard) = cache.entries.locate(&key);
                (key, hash, shard, value)
            })
            .collect();
        let touched =
            located.iter().fold(0u8, |acc, &(_, hash, shard, _)| acc ^ cache.entries.touch(hash, shard));
        std::hint::black_box(touched);
        for (key, hash, shard, value) in located {
            cache.set_hashed(key, hash, shard, value, true);
        }
        self.shared.evict(cache, OP)?;
        Ok(())
    }

    fn scan_buckets(
        &self,
        buckets: &[BucketId],
        chunk_bytes: usize,
        sink: ScanSink<'_>,
    ) -> Result<u64, StateError> {
        const OP: &str = "scan_buckets";
        self.shared
            .idle(self.shared.lock(OP)?, OP)?
            .write_back_buckets(&sorted_buckets(buckets), self.shared.inner.as_ref())?;
        // Without the lock: the sink may use this store. Writes it makes land in the cache and are
        // not part of this scan, as with the inner store's snapshot.
        self.shared.inner.scan_buckets(buckets, chunk_bytes, sink)
    }

    fn bucket_keys_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        const OP: &str = "bucket_keys_after";
        let mut cache = self.shared.idle(self.shared.lock(OP)?, OP)?;
        cache.keys_after(bucket, after, limit, self.shared.inner.as_ref(), Listing::Exact)
    }

    fn bucket_key_candidates_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        const OP: &str = "bucket_key_candidates_after";
        let mut cache = self.shared.idle(self.shared.lock(OP)?, OP)?;
        cache.keys_after(bucket, after, limit, self.shared.inner.as_ref(), Listing::Candidates)
    }

    fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
        const OP: &str = "delete_buckets";
        let mut cache = self.shared.idle(self.shared.lock(OP)?, OP)?;
        let buckets = sorted_buckets(buckets);
        cache.forget_buckets(&buckets);
        self.shared.inner.delete_buckets(&buckets)
    }

    fn approximate_len(&self) -> Result<u64, StateError> {
        let cache = self.shared.lock("approximate_len")?;
        Ok(self.shared.inner.approximate_len()? + cache.dirty_puts + cache.in_flight_puts)
    }

    fn is_shared(&self) -> bool {
        self.shared.inner.is_shared()
    }

    fn freeze(&self, buckets: &[BucketId]) -> Result<Box<dyn FrozenView>, StateError> {
        const OP: &str = "freeze";
        let cache = self.shared.idle(self.shared.lock(OP)?, OP)?;
        let overlay = cache.dirty_overlay(buckets);
        // Under the lock, with nothing in flight: no write reaches the store below between the
        // copy and the view of it.
        let below = self.shared.inner.freeze(buckets)?;
        drop(cache);
        Ok(Box::new(OverlayView::new(below, overlay, FrozenBuckets::new(self.shared.task, buckets))))
    }

    fn cache_counts(&self) -> Option<CacheCounts> {
        self.shared.lock("cache_counts").ok().map(|cache| cache.counts)
    }

    fn charge_outside(&self, bytes: usize) {
        if let Ok(mut cache) = self.shared.lock("charge_outside") {
            cache.outside = bytes.min(cache.capacity / 2);
            // Room is made now, for the task's next batch; waiting (backpressure) is left to it.
            self.shared.evict_without_waiting(cache);
        }
    }

    /// Writes back the buckets' dirty entries, forgets every cached entry of them (absent ones
    /// too: the next owner may write them), then lets the inner store release them.
    fn release_buckets(&self, buckets: &[BucketId]) -> Result<u64, StateError> {
        const OP: &str = "release_buckets";
        if !self.shared.inner.is_shared() {
            // Checked before anything is forgotten: a private store would lose the buckets.
            return Err(StateError::Unsupported { task: self.shared.task, op: OP });
        }
        let buckets = sorted_buckets(buckets);
        let mut cache = self.shared.idle(self.shared.lock(OP)?, OP)?;
        let bytes = cache.write_back_buckets(&buckets, self.shared.inner.as_ref())?;
        cache.forget_buckets(&buckets);
        Ok(bytes + self.shared.inner.release_buckets(&buckets)?)
    }
}

#[cfg(test)]
mod tests;
