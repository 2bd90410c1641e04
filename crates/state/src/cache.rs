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

use crate::compact::{CompactKey, CompactValue, KeyHash, check_key};
use crate::key::check_value;
use crate::scan::sorted_buckets;
use crate::written_keys::WrittenKeys;
use crate::{ScanSink, StateBackend, StateEnv, StateError, StateKey, StateWrite, StoredBatch};
use hashbrown::HashTable;

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
        Self { inner, cache_bytes, tasks: Mutex::default(), writer, writer_thread }
    }

    /// The wrapped env.
    pub fn inner(&self) -> &E {
        &self.inner
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
                let shared = Arc::new(SharedCache {
                    task,
                    inner,
                    cache: Mutex::new(TaskCache::new(self.cache_bytes, known_empty)),
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
}

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

/// One cached entry.
#[derive(Debug)]
struct Slot {
    value: CompactValue,
    /// Differs from the inner store; must be written before it is dropped.
    dirty: bool,
    /// Read or written since the CLOCK hand last passed.
    referenced: bool,
}

/// A cached key and its entry in one cache line: aligned and 64 bytes, so reading an entry
/// after its control byte touches one line (at 72 bytes, unaligned, every entry spanned two).
#[derive(Debug)]
#[repr(align(64))]
struct Line {
    key: CompactKey,
    slot: Slot,
}

const _: () = assert!(std::mem::size_of::<Line>() == 64, "a cache entry is one cache line");

/// Hash tables of the cache's entries, one picked per key by bits of its hash, so that a table
/// that grows rehashes 1/[`SHARDS`] of the entries on the task thread: one table passing 1.8 M
/// entries (a 2 GiB cache) stalled a batch for 1.3 s, the rehash and the page faults of the
/// doubled table. The tables grow at staggered fills (see [`Entries::insert_new`]), so a
/// table's load is between 1/4 and 7/8. A key is hashed once per operation.
///
/// The CLOCK hand walks the tables' slots in memory order (see [`Entries::evict_next`]): a
/// victim costs a sequential read, not a lookup of a key from a separate ring (a random miss
/// per visited entry, and 32 more bytes per entry for the ring's copy of the key).
#[derive(Debug)]
struct Entries {
    shards: Box<[HashTable<Line>]>,
    /// Entries in all tables.
    len: usize,
    /// The CLOCK hand: the table and the slot it looks at next.
    hand: (usize, usize),
}

/// Tables of [`Entries`].
const SHARDS: usize = 1024;

impl Default for Entries {
    fn default() -> Self {
        Self { shards: (0..SHARDS).map(|_| HashTable::new()).collect(), len: 0, hand: (0, 0) }
    }
}

impl Entries {
    /// The key's hash and its table. The table is picked by middle bits: hashbrown places by the
    /// low bits and tags by the top seven.
    fn locate(&self, key: &CompactKey) -> (u64, usize) {
        let hash = key.hash_value();
        (hash, (hash >> 32) as usize % SHARDS)
    }

    fn get(&self, key: &CompactKey) -> Option<&Slot> {
        let (hash, shard) = self.locate(key);
        self.get_hashed(key, hash, shard)
    }

    /// [`Self::get`] of a key [`Self::locate`]d already.
    fn get_hashed(&self, key: &CompactKey, hash: u64, shard: usize) -> Option<&Slot> {
        self.shards[shard].find(hash, |line| line.key == *key).map(|line| &line.slot)
    }

    fn get_mut(&mut self, key: &CompactKey) -> Option<&mut Slot> {
        let (hash, shard) = self.locate(key);
        self.get_located(key, hash, shard)
    }

    /// [`Self::get_mut`] of a key [`Self::locate`]d already.
    fn get_located(&mut self, key: &CompactKey, hash: u64, shard: usize) -> Option<&mut Slot> {
        self.shards[shard].find_mut(hash, |line| line.key == *key).map(|line| &mut line.slot)
    }

    /// Reads the lines a lookup of `hash` reads (its control bytes and the first entry whose tag
    /// matches, almost always the key's) and returns a byte of them. A batch touches all its keys
    /// first: the loads are independent, so the keys wait for memory together instead of one
    /// after another (two dependent misses each on a table bigger than the CPU caches).
    fn touch(&self, hash: u64, shard: usize) -> u8 {
        self.shards[shard].iter_hash(hash).next().map_or(0, |line| line.key.bytes()[0])
    }

    /// Adds a key that is not in the table (the callers looked it up first), [`Self::locate`]d
    /// already.
    fn insert_new(&mut self, key: CompactKey, hash: u64, shard: usize, slot: Slot) {
        let table = &mut self.shards[shard];
        debug_assert!(table.find(hash, |line| line.key == key).is_none(), "inserted twice");
        // Tables fill at the same rate, so at the same fill they would all grow within the same
        // few batches, as one table did. Table i
        // grows early, at (1 + i / SHARDS) / 2 of its room: one after another as the cache fills.
        let room = table.capacity();
        if room > 64 && table.len() >= room / 2 + room * shard / (2 * SHARDS) {
            table.reserve(room + 1 - table.len(), |line| line.key.hash_value());
        }
        table.insert_unique(hash, Line { key, slot }, |line| line.key.hash_value());
        self.len += 1;
    }

    fn retain(&mut self, mut keep: impl FnMut(&CompactKey, &mut Slot) -> bool) {
        for shard in &mut self.shards {
            shard.retain(|line| keep(&line.key, &mut line.slot));
        }
        self.len = self.shards.iter().map(HashTable::len).sum();
    }

    /// The CLOCK hand's next victim, removed: the hand walks the slots of table after table,
    /// clears the reference bit of each entry it passes that has one, and takes the first that
    /// has none. `None` if the cache is empty. A table that grew since the hand entered it has
    /// new places for its entries, so the hand may pass some twice or not at all in that round:
    /// CLOCK is an approximation of LRU either way. At most two rounds: the first clears every
    /// bit it does not stop at.
    fn evict_next(&mut self) -> Option<(CompactKey, Slot)> {
        let mut wraps = 0;
        while self.len > 0 {
            let (shard, index) = self.hand;
            let table = &mut self.shards[shard];
            if index >= table.num_buckets() {
                self.hand = ((shard + 1) % SHARDS, 0);
                if self.hand.0 == 0 {
                    wraps += 1;
                    if wraps > 2 {
                        debug_assert!(false, "{} entries counted, none found in two rounds", self.len);
                        return None;
                    }
                }
                continue;
            }
            self.hand.1 += 1;
            let Some(line) = table.get_bucket_mut(index) else { continue };
            if std::mem::take(&mut line.slot.referenced) {
                continue;
            }
            let Ok(entry) = table.get_bucket_entry(index) else { continue };
            self.len -= 1;
            let Line { key, slot } = entry.remove().0;
            return Some((key, slot));
        }
        None
    }

    fn iter(&self) -> impl Iterator<Item = (&CompactKey, &Slot)> {
        self.shards.iter().flat_map(|shard| shard.iter().map(|line| (&line.key, &line.slot)))
    }
}

/// A dirty entry evicted and queued for the writer, not yet below.
#[derive(Debug)]
struct InFlight {
    /// The run that writes it (a key evicted again before the first run is written is in a
    /// later run; only that one removes it).
    run: u64,
    value: CompactValue,
}

/// Dirty victims of one eviction step, for the writer.
#[derive(Debug)]
struct Run {
    seq: u64,
    keys: Vec<CompactKey>,
    writes: StoredBatch,
}

/// What an entry costs: its map slot and index ([`ENTRY_OVERHEAD_BYTES`]), a dirty-list copy of
/// its key, and whatever of key and value lives on the heap.
fn entry_cost(key: &CompactKey, value: &CompactValue) -> usize {
    ENTRY_OVERHEAD_BYTES + 2 * key.heap_len() + value.heap_len()
}

/// Keys of one bucket that turned dirty, maybe with stale repeats (checked when read or written
/// back).
#[derive(Debug, Default)]
struct DirtyList {
    keys: Vec<CompactKey>,
    /// `keys[..sorted]` is in stored order without repeats (what a key scan merges with the
    /// store below); later keys turned dirty since.
    sorted: usize,
    /// Entries of the bucket that are dirty now.
    live: usize,
}

impl DirtyList {
    /// Sorts the keys that turned dirty since the last call and merges them into the sorted
    /// part: O(keys) when some did, nothing otherwise.
    fn sort(&mut self) {
        if self.sorted == self.keys.len() {
            return;
        }
        let mut tail = self.keys.split_off(self.sorted);
        tail.sort_unstable_by(|a, b| a.stored_order().cmp(&b.stored_order()));
        let head = std::mem::take(&mut self.keys);
        let mut merged = Vec::with_capacity(head.len() + tail.len());
        let (mut head, mut tail) = (head.into_iter().peekable(), tail.into_iter().peekable());
        loop {
            let next = match (head.peek(), tail.peek()) {
                (Some(h), Some(t)) if h.stored_order() <= t.stored_order() => head.next(),
                (_, Some(_)) => tail.next(),
                (Some(_), None) => head.next(),
                (None, None) => break,
            };
            if let Some(key) = next
                && merged.last() != Some(&key)
            {
                merged.push(key);
            }
        }
        self.keys = merged;
        self.sorted = self.keys.len();
    }
}

#[derive(Debug)]
struct TaskCache {
    /// A hash map, not an ordered one: a lookup is one probe of the table, whose slot holds the
    /// inline key and value (two cache misses on a big cache, where an `IndexMap` takes three).
    entries: Entries,
    dirty: HashMap<BucketId, DirtyList, KeyHash>,
    /// Evicted dirty entries the writer has not written yet; an entry in `entries` is newer.
    in_flight: HashMap<CompactKey, InFlight, KeyHash>,
    /// Runs not yet taken by the writer, oldest first.
    queued: VecDeque<Run>,
    /// The writer is writing runs it took from `queued`.
    writing: bool,
    next_run: u64,
    /// Bytes charged for in-flight entries (part of `bytes`).
    in_flight_bytes: usize,
    /// In-flight entries holding a value (for `approximate_len`).
    in_flight_puts: u64,
    /// Set by the writer when a write-back failed.
    write_back_failed: Option<String>,
    /// The keys written below (`written_keys.rs`), if the store below started empty and only
    /// this cache writes it; `None` once its filters would take more than a quarter of the
    /// budget (every miss then reads below).
    written: Option<WrittenKeys>,
    /// Dirty entries holding a value (for `approximate_len`).
    dirty_puts: u64,
    bytes: usize,
    capacity: usize,
}

impl TaskCache {
    fn new(capacity: usize, known_empty: bool) -> Self {
        Self {
            entries: Entries::default(),
            dirty: HashMap::default(),
            in_flight: HashMap::default(),
            queued: VecDeque::new(),
            writing: false,
            next_run: 0,
            in_flight_bytes: 0,
            in_flight_puts: 0,
            write_back_failed: None,
            written: known_empty.then(WrittenKeys::default),
            dirty_puts: 0,
            bytes: 0,
            capacity,
        }
    }

    /// No run is queued or being written.
    fn is_idle(&self) -> bool {
        self.queued.is_empty() && !self.writing
    }

    /// The writer wrote `key` in run `seq`: forget it unless a later run holds it.
    fn finish_in_flight(&mut self, key: &CompactKey, seq: u64) {
        if self.in_flight.get(key).is_some_and(|f| f.run == seq)
            && let Some(done) = self.in_flight.remove(key)
        {
            let cost = entry_cost(key, &done.value);
            self.bytes -= cost;
            self.in_flight_bytes -= cost;
            self.in_flight_puts -= u64::from(done.value.is_present());
        }
    }

    /// Sets `key` (dirty if `dirty`), keeping the byte count and dirty bookkeeping.
    fn set(&mut self, key: CompactKey, value: CompactValue, dirty: bool) {
        let (hash, shard) = self.entries.locate(&key);
        self.set_hashed(key, hash, shard, value, dirty);
    }

    /// [`Self::set`] of a key [`Entries::locate`]d already (its hash and table).
    fn set_hashed(&mut self, key: CompactKey, hash: u64, shard: usize, value: CompactValue, dirty: bool) {
        let new_cost = entry_cost(&key, &value);
        let turned_dirty = match self.entries.get_located(&key, hash, shard) {
            Some(slot) => {
                self.bytes = self.bytes - entry_cost(&key, &slot.value) + new_cost;
                if slot.dirty && slot.value.is_present() {
                    self.dirty_puts -= 1;
                }
                let was_dirty = slot.dirty;
                slot.value = value;
                slot.referenced = true;
                slot.dirty |= dirty;
                if slot.dirty && slot.value.is_present() {
                    self.dirty_puts += 1;
                }
                (slot.dirty && !was_dirty).then_some(key)
            }
            None => {
                self.bytes += new_cost;
                if dirty && value.is_present() {
                    self.dirty_puts += 1;
                }
                let listed = dirty.then(|| key.clone());
                self.entries.insert_new(key, hash, shard, Slot { value, dirty, referenced: true });
                listed
            }
        };
        if let Some(key) = turned_dirty {
            let list = self.dirty.entry(key.bucket()).or_default();
            list.live += 1;
            list.keys.push(key);
            if list.keys.len() > 64 && list.keys.len() > 2 * list.live {
                compact(list, &self.entries);
            }
        }
    }

    /// Marks a written-back entry clean.
    fn mark_clean(&mut self, key: &CompactKey) {
        if let Some(slot) = self.entries.get_mut(key)
            && slot.dirty
        {
            slot.dirty = false;
            if slot.value.is_present() {
                self.dirty_puts -= 1;
            }
            if let Some(list) = self.dirty.get_mut(&key.bucket()) {
                list.live -= 1;
            }
        }
    }

    /// Writes back the dirty entries of `buckets`; they stay cached, clean. The caller waited
    /// for the in-flight runs ([`SharedCache::idle`]).
    fn write_back_buckets(
        &mut self,
        buckets: &[BucketId],
        inner: &dyn StateBackend,
    ) -> Result<u64, StateError> {
        let mut keys = Vec::new();
        for bucket in buckets {
            if let Some(list) = self.dirty.remove(bucket) {
                keys.extend(list.keys.into_iter().filter(|k| self.entries.get(k).is_some_and(|s| s.dirty)));
            }
        }
        keys.sort_unstable();
        keys.dedup();
        self.commit(keys, inner)
    }

    /// Writes back every dirty entry (they stay cached, clean). The caller waited for the
    /// in-flight runs.
    fn write_back_all(&mut self, inner: &dyn StateBackend) -> Result<u64, StateError> {
        let mut keys: Vec<CompactKey> =
            self.entries.iter().filter(|(_, slot)| slot.dirty).map(|(key, _)| key.clone()).collect();
        keys.sort_unstable();
        self.dirty.clear();
        self.commit(keys, inner)
    }

    /// Writes the (dirty) entries of `keys` below and marks them clean; returns the bytes
    /// written (key and value bytes, as scans count them).
    fn commit(&mut self, keys: Vec<CompactKey>, inner: &dyn StateBackend) -> Result<u64, StateError> {
        debug_assert!(self.is_idle(), "a synchronous write-back overtakes in-flight runs");
        let mut writes = StoredBatch::default();
        for key in &keys {
            if let Some(slot) = self.entries.get(key) {
                writes.push(|out| key.put_stored(out), slot.value.as_slice());
                if slot.value.is_present()
                    && let Some(written) = &mut self.written
                {
                    written.insert(key.bucket(), key.hash_value());
                }
            }
        }
        if writes.is_empty() {
            return Ok(0);
        }
        self.check_written_size();
        inner.write_stored(&writes)?;
        for key in &keys {
            self.mark_clean(key);
        }
        // Lists were removed by the caller; a key marked clean found no list to count down.
        Ok(writes.byte_len() as u64)
    }

    /// If over budget, evicts with a CLOCK hand down to 255/256 of it; the dirty victims move
    /// in flight and into a queued run. Returns whether it queued one. A failed write-back
    /// loses them, but a store error is fatal anyway (the worker stops and recovers from a
    /// checkpoint, see [`StateError`]).
    fn evict_if_full(&mut self) -> bool {
        if self.charged() <= self.capacity {
            return false;
        }
        // Small steps: each moves the CLOCK hand on the task thread (the writer batches them).
        // The target is for cached entries: what is in flight stays charged until written, so
        // the dirty victims of this step overshoot the budget until then (by at most what
        // backpressure lets be in flight).
        let target =
            (self.capacity - self.capacity / 256).saturating_sub(self.charged() - self.cached_bytes());
        let seq = self.next_run;
        let mut run = Run { seq, keys: Vec::new(), writes: StoredBatch::default() };
        while self.cached_bytes() > target {
            let Some((key, slot)) = self.entries.evict_next() else { break };
            let cost = entry_cost(&key, &slot.value);
            if !slot.dirty {
                self.bytes -= cost;
                continue;
            }
            if let Some(list) = self.dirty.get_mut(&key.bucket()) {
                list.live -= 1;
            }
            if slot.value.is_present() {
                self.dirty_puts -= 1;
                self.in_flight_puts += 1;
                if let Some(written) = &mut self.written {
                    written.insert(key.bucket(), key.hash_value());
                }
            }
            // Still charged (in `bytes`) until the writer wrote it.
            self.in_flight_bytes += cost;
            run.writes.push(|out| key.put_stored(out), slot.value.as_slice());
            run.keys.push(key.clone());
            if let Some(older) = self.in_flight.insert(key.clone(), InFlight { run: seq, value: slot.value })
            {
                // Evicted again before its first run was written: that run no longer owns it.
                let cost = entry_cost(&key, &older.value);
                self.bytes -= cost;
                self.in_flight_bytes -= cost;
                self.in_flight_puts -= u64::from(older.value.is_present());
            }
        }
        self.check_written_size();
        if run.keys.is_empty() {
            return false;
        }
        self.next_run += 1;
        self.queued.push_back(run);
        true
    }

    /// Up to `limit` keys of `bucket` after `after`, in stored order, as this cache and the store
    /// below hold them together: the bucket's dirty keys merged with the store's (a dirty entry
    /// decides: one holding a value is listed once, a deleted one not at all; clean entries equal
    /// the store). The caller waited for the in-flight runs, so nothing is between the two.
    fn keys_after(
        &mut self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
        inner: &dyn StateBackend,
    ) -> Result<Vec<StateKey>, StateError> {
        debug_assert!(self.is_idle(), "a key scan with writes in flight");
        let Self { dirty, entries, .. } = self;
        let Some(list) = dirty.get_mut(&bucket).filter(|_| limit > 0) else {
            return inner.bucket_keys_after(bucket, after, limit);
        };
        list.sort();
        // Keys of another bucket compare by bucket first, as the store's cursor does.
        let is_after = |key: &CompactKey| {
            after.is_none_or(|a| (bucket, key.stored_order()) > (a.bucket, (a.state, a.key.as_slice())))
        };
        let mut dirty_at = list.keys.partition_point(|key| !is_after(key));
        let mut below = inner.bucket_keys_after(bucket, after, limit)?;
        let mut below_at = 0;
        let mut out = Vec::new();
        while out.len() < limit {
            while dirty_at < list.keys.len() && !entries.get(&list.keys[dirty_at]).is_some_and(|s| s.dirty) {
                dirty_at += 1;
            }
            if below_at == below.len() && below.len() == limit {
                // The page below is used up and may have more after it.
                let cursor = below.pop();
                below = inner.bucket_keys_after(bucket, cursor.as_ref(), limit)?;
                below_at = 0;
            }
            let stored = below.get(below_at);
            let order =
                |key: &CompactKey| stored.map(|s| key.stored_order().cmp(&(s.state, s.key.as_slice())));
            match list.keys.get(dirty_at) {
                // The next dirty key comes first (or is the same key): the cache decides.
                Some(key) if order(key).is_none_or(|o| o != std::cmp::Ordering::Greater) => {
                    if order(key) == Some(std::cmp::Ordering::Equal) {
                        below_at += 1;
                    }
                    if entries.get(key).is_some_and(|slot| slot.value.is_present()) {
                        out.push(key.to_state_key());
                    }
                    dirty_at += 1;
                }
                // The store's next key comes first, and is not dirty here: the store is right.
                _ => match stored {
                    Some(stored) => {
                        out.push(stored.clone());
                        below_at += 1;
                    }
                    None => break,
                },
            }
        }
        Ok(out)
    }

    /// Bytes charged for cached entries (not in flight).
    fn cached_bytes(&self) -> usize {
        self.bytes - self.in_flight_bytes
    }

    /// Drops the written-keys filters if they outgrew a quarter of the budget.
    fn check_written_size(&mut self) {
        if self.written.as_ref().is_some_and(|w| w.bytes() > self.capacity / 4) {
            self.written = None;
        }
    }

    /// Whether `key`, of hash `hash` ([`Entries::locate`]), may be below (false: a miss is
    /// certainly absent, no need to read below).
    fn may_be_below(&self, key: &CompactKey, hash: u64) -> bool {
        self.written.as_ref().is_none_or(|w| w.may_hold(key.bucket(), hash))
    }

    /// Bytes charged against the budget: entries (cached and in flight) and the written-keys
    /// filters.
    fn charged(&self) -> usize {
        self.bytes + self.written.as_ref().map_or(0, WrittenKeys::bytes)
    }

    /// Forgets every entry of `buckets` without writing anything back. The caller waited for
    /// the in-flight runs.
    fn forget_buckets(&mut self, buckets: &[BucketId]) {
        debug_assert!(
            self.is_idle() && self.in_flight.is_empty(),
            "forgetting buckets with writes in flight"
        );
        let mut freed = 0;
        let mut dirty_puts = 0;
        self.entries.retain(|key, slot| {
            let keep = !buckets.contains(&key.bucket());
            if !keep {
                freed += entry_cost(key, &slot.value);
                dirty_puts += u64::from(slot.dirty && slot.value.is_present());
            }
            keep
        });
        self.bytes -= freed;
        self.dirty_puts -= dirty_puts;
        for bucket in buckets {
            self.dirty.remove(bucket);
            if let Some(written) = &mut self.written {
                written.clear_bucket(*bucket);
            }
        }
    }
}

/// Drops stale keys (no longer dirty, or repeated) from a bucket's dirty list. The lines of all
/// its keys are touched first, so their misses overlap; the sorted part stays sorted, and only
/// the keys listed since the last sort are sorted and merged into it (`DirtyList::sort`): a
/// whole sort of the list was most of the cost in the cached sliding-window bench.
fn compact(list: &mut DirtyList, entries: &Entries) {
    let located: Vec<(u64, usize)> = list.keys.iter().map(|key| entries.locate(key)).collect();
    let touched = located.iter().fold(0u8, |acc, &(hash, shard)| acc ^ entries.touch(hash, shard));
    std::hint::black_box(touched);
    let mut at = 0;
    let mut sorted_kept = 0;
    let sorted = list.sorted;
    list.keys.retain(|key| {
        let (hash, shard) = located[at];
        let keep = entries.get_hashed(key, hash, shard).is_some_and(|slot| slot.dirty);
        sorted_kept += usize::from(keep && at < sorted);
        at += 1;
        keep
    });
    list.sorted = sorted_kept;
    list.sort();
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
                out[i].clone_from(&value);
                cache.set_hashed(cached, hash, shard, CompactValue::new(value), false);
            } else if cache.may_be_below(&cached, hash) {
                below.push((cached, hash, shard, i));
            } else {
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
        for write in writes {
            match write {
                StateWrite::Put(key, value) => {
                    cache.set(CompactKey::new(&key), CompactValue::new(Some(value)), true)
                }
                StateWrite::Delete(key) => cache.set(CompactKey::new(&key), CompactValue::Absent, true),
            }
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
        cache.keys_after(bucket, after, limit, self.shared.inner.as_ref())
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
mod tests {
    use super::*;
    use crate::MemoryEnv;
    use koala_types::OperatorId;

    fn key(bucket: BucketId, user: u32) -> StateKey {
        StateKey::new(bucket, 0, user.to_be_bytes().to_vec())
    }

    #[test]
    fn the_cache_stays_within_its_budget_and_writes_back_dirty_victims() -> Result<(), StateError> {
        let budget = 100 * (ENTRY_OVERHEAD_BYTES + 16);
        let env = CachedEnv::new(MemoryEnv::new(), budget);
        let task = TaskId::new(OperatorId(1), 0);
        let store = env.open_task(task)?;
        let below = env.inner().open_task(task)?;
        for i in 0..1000u32 {
            store.write_many(vec![StateWrite::Put(key(1, i), i.to_le_bytes().to_vec())])?;
            // Dirty victims stay charged while in flight: up to 1/16 of the budget more.
            let cache = store_cache(&env, task)?;
            assert!(cache <= budget + budget / 16, "cache holds {cache} bytes, budget {budget}");
        }
        // Most entries were evicted, so written below; all are readable through the cache.
        let written_below = below.approximate_len()?;
        assert!(written_below >= 800, "only {written_below} entries written back");
        let keys: Vec<StateKey> = (0..1000).map(|i| key(1, i)).collect();
        let values = store.get_many(&keys)?;
        assert!(values.iter().enumerate().all(|(i, v)| *v == Some((i as u32).to_le_bytes().to_vec())));
        // Nothing reaches the inner store before eviction or a bucket scan; a key-only page lists
        // the cached key without writing it back.
        store.write_many(vec![StateWrite::Put(key(2, 0), b"x".to_vec())])?;
        assert_eq!(below.get_many(&[key(2, 0)])?, vec![None]);
        assert_eq!(store.bucket_keys_after(2, None, 10)?, vec![key(2, 0)]);
        assert_eq!(below.get_many(&[key(2, 0)])?, vec![None]);
        store.scan_buckets(&[2], 1 << 20, &mut |_| Ok(()))?;
        assert_eq!(below.get_many(&[key(2, 0)])?, vec![Some(b"x".to_vec())]);
        Ok(())
    }

    #[test]
    fn key_pages_merge_dirty_entries_with_the_store_below() -> Result<(), StateError> {
        let env = CachedEnv::new(MemoryEnv::new(), 1 << 20);
        let task = TaskId::new(OperatorId(1), 0);
        let store = env.open_task(task)?;
        let below = env.inner().open_task(task)?;
        // Keys 0, 2, …, 18 of bucket 3 below (a bucket scan writes them back), clean here.
        store.write_many((0..10).map(|i| StateWrite::Put(key(3, 2 * i), vec![1])).collect())?;
        store.scan_buckets(&[3], 1 << 20, &mut |_| Ok(()))?;
        // Dirty here only: 2 and 6 deleted, 5 and 19 new, 4 rewritten, a key of bucket 4.
        store.write_many(vec![
            StateWrite::Delete(key(3, 2)),
            StateWrite::Delete(key(3, 6)),
            StateWrite::Put(key(3, 5), vec![2]),
            StateWrite::Put(key(3, 19), vec![2]),
            StateWrite::Put(key(3, 4), vec![2]),
            StateWrite::Put(key(4, 1), vec![2]),
        ])?;
        let expected: Vec<StateKey> = [0, 4, 5, 8, 10, 12, 14, 16, 18, 19].map(|i| key(3, i)).to_vec();
        for page in [1, 2, 3, 4, 100] {
            let (mut keys, mut at) = (Vec::new(), None);
            loop {
                let got = store.bucket_keys_after(3, at.as_ref(), page)?;
                assert!(got.len() <= page);
                at = got.last().cloned().or(at);
                let end = got.len() < page;
                keys.extend(got);
                if end {
                    break;
                }
            }
            assert_eq!(keys, expected, "pages of {page}");
        }
        assert_eq!(store.bucket_keys_after(3, Some(&key(3, 6)), 2)?, vec![key(3, 8), key(3, 10)]);
        assert_eq!(store.bucket_keys_after(3, Some(&key(2, 99)), 2)?, vec![key(3, 0), key(3, 4)]);
        assert_eq!(store.bucket_keys_after(3, Some(&key(4, 0)), 2)?, Vec::<StateKey>::new());
        // Keys that turn dirty after a page are merged into the next one.
        store.write_many(vec![StateWrite::Put(key(3, 1), vec![3]), StateWrite::Delete(key(3, 8))])?;
        assert_eq!(store.bucket_keys_after(3, None, 4)?, [0, 1, 4, 5].map(|i| key(3, i)).to_vec());
        assert_eq!(store.bucket_keys_after(3, Some(&key(3, 5)), 2)?, vec![key(3, 10), key(3, 12)]);
        // None of it was written back: the store below still holds the ten keys it had.
        assert_eq!(
            below.bucket_keys_after(3, None, 100)?,
            (0..10).map(|i| key(3, 2 * i)).collect::<Vec<_>>()
        );
        Ok(())
    }

    #[test]
    fn writes_in_flight_are_read_scanned_and_written_in_order() -> Result<(), StateError> {
        // Room for 1 000 entries, so ~60 may be in flight before a writer must catch up.
        let env = CachedEnv::new(MemoryEnv::new(), 1000 * (ENTRY_OVERHEAD_BYTES + 16));
        let task = TaskId::new(OperatorId(1), 0);
        let store = env.open_task(task)?;
        let keys: Vec<StateKey> = (0..5000).map(|i| key(1 + (i % 3) as BucketId, i)).collect();
        let value = |round: u32, i: u32| (round * 10_000 + i).to_le_bytes().to_vec();
        for round in 0..4u32 {
            // Every key is evicted (and queued again) in every round: runs overlap.
            for chunk in keys.chunks(100) {
                store.write_many(
                    chunk.iter().map(|k| StateWrite::Put(k.clone(), value(round, key_index(k)))).collect(),
                )?;
            }
            let read = store.get_many(&keys)?;
            assert!(
                read.iter().zip(&keys).all(|(v, k)| *v == Some(value(round, key_index(k)))),
                "round {round}: a read missed the latest write"
            );
        }
        store.write_many(vec![StateWrite::Delete(keys[0].clone())])?;
        let mut scanned = Vec::new();
        store.scan_buckets(&[1, 2, 3], 1 << 20, &mut |chunk| {
            scanned.extend(chunk);
            Ok(())
        })?;
        assert_eq!(scanned.len(), 4999);
        assert!(scanned.iter().all(|(k, v)| *v == value(3, key_index(k))), "a scan read a stale value");
        // Below, after a persist: the last write of every key.
        env.persist()?;
        let below = env.inner().open_task(task)?;
        let read = below.get_many(&keys)?;
        assert_eq!(read[0], None);
        assert!(read[1..].iter().zip(&keys[1..]).all(|(v, k)| *v == Some(value(3, key_index(k)))));
        store.delete_buckets(&[1, 2, 3])?;
        assert_eq!(store.get_many(&keys[..10])?, vec![None; 10]);
        assert_eq!(below.approximate_len()?, 0);
        Ok(())
    }

    fn key_index(key: &StateKey) -> u32 {
        u32::from_be_bytes([key.key[0], key.key[1], key.key[2], key.key[3]])
    }

    /// A memory env whose stores refuse every write.
    #[derive(Default)]
    struct RefusingEnv(MemoryEnv);

    struct RefusingBackend(Box<dyn StateBackend>);

    impl StateEnv for RefusingEnv {
        fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError> {
            Ok(Box::new(RefusingBackend(self.0.open_task(task)?)))
        }
        fn drop_task(&self, task: TaskId) -> Result<(), StateError> {
            self.0.drop_task(task)
        }
        fn persist(&self) -> Result<(), StateError> {
            Ok(())
        }
    }

    impl StateBackend for RefusingBackend {
        fn task(&self) -> TaskId {
            self.0.task()
        }
        fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
            self.0.get_many(keys)
        }
        fn write_many(&self, _: Vec<StateWrite>) -> Result<(), StateError> {
            Err(StateError::Unsupported { task: self.task(), op: "write_many" })
        }
        fn scan_buckets(&self, b: &[BucketId], c: usize, sink: ScanSink<'_>) -> Result<u64, StateError> {
            self.0.scan_buckets(b, c, sink)
        }
        fn bucket_keys_after(
            &self,
            bucket: BucketId,
            after: Option<&StateKey>,
            limit: usize,
        ) -> Result<Vec<StateKey>, StateError> {
            self.0.bucket_keys_after(bucket, after, limit)
        }
        fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
            self.0.delete_buckets(buckets)
        }
        fn approximate_len(&self) -> Result<u64, StateError> {
            self.0.approximate_len()
        }
    }

    #[test]
    fn a_failed_background_write_back_fails_later_operations() -> Result<(), StateError> {
        let env = CachedEnv::new(RefusingEnv::default(), 10 * (ENTRY_OVERHEAD_BYTES + 16));
        let store = env.open_task(TaskId::new(OperatorId(1), 0))?;
        let failed = (0..1000u32)
            .find_map(|i| store.write_many(vec![StateWrite::Put(key(1, i), vec![1])]).err())
            .map(|e| error_chain(&e));
        let failed =
            failed.ok_or(StateError::Unsupported { task: store.task(), op: "test: nothing failed" })?;
        assert!(failed.contains("background write-back failed"), "{failed}");
        assert!(failed.contains("write_many is not supported"), "the cause is kept: {failed}");
        assert!(store.get_many(&[key(1, 0)]).is_err(), "the store stays failed");
        Ok(())
    }

    #[test]
    fn the_charged_overhead_covers_the_real_layout() {
        let slot = std::mem::size_of::<Line>();
        let key = std::mem::size_of::<CompactKey>();
        assert!(ENTRY_OVERHEAD_BYTES >= 2 * (slot + 1) + key, "slot {slot} B, key {key} B");
    }

    #[test]
    fn persist_writes_back_every_dirty_entry() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let task = TaskId::new(OperatorId(1), 0);
        {
            let env = CachedEnv::new(crate::FjallEnv::open(dir.path())?, 1 << 20);
            let store = env.open_task(task)?;
            store.write_many(vec![StateWrite::Put(key(3, 1), b"a".to_vec())])?;
            assert_eq!(env.inner().open_task(task)?.get_many(&[key(3, 1)])?, vec![None]);
            env.persist()?;
        }
        let reopened = crate::FjallEnv::open(dir.path())?;
        assert_eq!(reopened.open_task(task)?.get_many(&[key(3, 1)])?, vec![Some(b"a".to_vec())]);
        Ok(())
    }

    /// A memory env that counts the keys read from it.
    #[derive(Default)]
    struct CountingEnv {
        inner: MemoryEnv,
        reads: Arc<std::sync::atomic::AtomicUsize>,
    }

    struct CountingBackend {
        inner: Box<dyn StateBackend>,
        reads: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl StateEnv for CountingEnv {
        fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError> {
            Ok(Box::new(CountingBackend { inner: self.inner.open_task(task)?, reads: self.reads.clone() }))
        }
        fn drop_task(&self, task: TaskId) -> Result<(), StateError> {
            self.inner.drop_task(task)
        }
        fn persist(&self) -> Result<(), StateError> {
            Ok(())
        }
    }

    impl StateBackend for CountingBackend {
        fn task(&self) -> TaskId {
            self.inner.task()
        }
        fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
            self.reads.fetch_add(keys.len(), Ordering::Relaxed);
            self.inner.get_many(keys)
        }
        fn write_many(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
            self.inner.write_many(writes)
        }
        fn scan_buckets(
            &self,
            buckets: &[BucketId],
            chunk: usize,
            sink: ScanSink<'_>,
        ) -> Result<u64, StateError> {
            self.inner.scan_buckets(buckets, chunk, sink)
        }
        fn bucket_keys_after(
            &self,
            bucket: BucketId,
            after: Option<&StateKey>,
            limit: usize,
        ) -> Result<Vec<StateKey>, StateError> {
            self.inner.bucket_keys_after(bucket, after, limit)
        }
        fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
            self.inner.delete_buckets(buckets)
        }
        fn approximate_len(&self) -> Result<u64, StateError> {
            self.inner.approximate_len()
        }
    }

    /// A cache over a [`CountingEnv`], a task's store in it, and the count of keys read below.
    type Counted = (CachedEnv<CountingEnv>, Box<dyn StateBackend>, Arc<std::sync::atomic::AtomicUsize>);

    /// A cache of `budget` bytes over a [`CountingEnv`] (see [`Counted`]).
    fn counted_cache(budget: usize) -> Result<Counted, StateError> {
        let counting = CountingEnv::default();
        let reads = counting.reads.clone();
        let env = CachedEnv::new(counting, budget);
        let store = env.open_task(TaskId::new(OperatorId(1), 0))?;
        Ok((env, store, reads))
    }

    #[test]
    fn a_miss_of_a_key_never_written_below_reads_nothing_below() -> Result<(), StateError> {
        let (_env, store, reads) = counted_cache(100 * (ENTRY_OVERHEAD_BYTES + 16))?;
        let read_below = || reads.load(Ordering::Relaxed);
        let fresh: Vec<StateKey> = (0..50).map(|i| key(1, 1_000_000 + i)).collect();
        assert_eq!(store.get_many(&fresh)?, vec![None; 50]);
        assert_eq!(read_below(), 0, "new keys of an empty store are absent without a read");

        // Most of 1 000 keys are evicted, so written below; each reads back.
        for i in 0..1000u32 {
            store.write_many(vec![StateWrite::Put(key(1, i), i.to_le_bytes().to_vec())])?;
        }
        let keys: Vec<StateKey> = (0..1000).map(|i| key(1, i)).collect();
        let values = store.get_many(&keys)?;
        assert!(values.iter().enumerate().all(|(i, v)| *v == Some((i as u32).to_le_bytes().to_vec())));
        let after_written = read_below();
        assert!(after_written >= 800, "evicted keys are read below: {after_written}");
        // Keys never written: only false positives of the filter read below.
        let strangers: Vec<StateKey> = (0..1000).map(|i| key(1, 2_000_000 + i)).collect();
        assert_eq!(store.get_many(&strangers)?, vec![None; 1000]);
        let false_positives = read_below() - after_written;
        assert!(false_positives < 100, "{false_positives} of 1 000 new keys read below");
        // A deleted bucket has nothing below.
        store.delete_buckets(&[1])?;
        let before = read_below();
        assert_eq!(store.get_many(&keys[..100])?, vec![None; 100]);
        assert_eq!(read_below(), before, "a deleted bucket's keys are absent without a read");
        Ok(())
    }

    #[test]
    fn keys_read_between_evictions_stay_cached_and_the_rest_are_evicted() -> Result<(), StateError> {
        // Room for about 100 entries; 10 hot keys are read after every 10 writes of new keys.
        let (_env, store, reads) = counted_cache(100 * (ENTRY_OVERHEAD_BYTES + 16))?;
        let read_below = || reads.load(Ordering::Relaxed);
        let hot: Vec<StateKey> = (0..10).map(|i| key(i as BucketId, i)).collect();
        store.write_many(hot.iter().map(|k| StateWrite::Put(k.clone(), b"hot".to_vec())).collect())?;
        for i in 0..5_000u32 {
            store.write_many(vec![StateWrite::Put(key((i % 64) as BucketId, 1000 + i), vec![1])])?;
            if i % 10 == 9 {
                assert_eq!(store.get_many(&hot)?, vec![Some(b"hot".to_vec()); 10]);
            }
        }
        assert_eq!(read_below(), 0, "a hot key was evicted: CLOCK gave it no second chance");
        // The cold keys were evicted: an early one is read from below.
        assert_eq!(store.get_many(&[key(0, 1000)])?, vec![Some(vec![1])]);
        assert_eq!(read_below(), 1, "an early cold key was still cached");
        Ok(())
    }

    #[test]
    fn a_cache_over_a_store_that_already_holds_data_reads_every_miss_below() -> Result<(), StateError> {
        let counting = CountingEnv::default();
        let task = TaskId::new(OperatorId(1), 0);
        counting.open_task(task)?.write_many(vec![StateWrite::Put(key(4, 7), b"old".to_vec())])?;
        let env = CachedEnv::new(counting, 1 << 20);
        let store = env.open_task(task)?;
        assert_eq!(store.get_many(&[key(4, 7), key(4, 8)])?, vec![Some(b"old".to_vec()), None]);
        Ok(())
    }

    /// Keys that turn dirty, are evicted, and turn dirty again make a bucket's dirty list
    /// compact many times; key pages still list exactly the live keys in stored order, and the
    /// list stays within twice its live keys (plus the slack before a compaction).
    #[test]
    fn compacted_dirty_lists_stay_sorted_and_bounded() -> Result<(), StateError> {
        let env = CachedEnv::new(MemoryEnv::new(), 200 * (ENTRY_OVERHEAD_BYTES + 16));
        let task = TaskId::new(OperatorId(1), 0);
        let store = env.open_task(task)?;
        let mut model = std::collections::BTreeSet::new();
        // A permutation of 0..3000 (7 is coprime to 3000), so keys arrive out of order.
        for round in 0..3u32 {
            for i in 0..3000u32 {
                let user = (i * 7 + round) % 3000;
                if (user + round) % 5 == 0 {
                    store.write_many(vec![StateWrite::Delete(key(9, user))])?;
                    model.remove(&user);
                } else {
                    store.write_many(vec![StateWrite::Put(key(9, user), vec![round as u8])])?;
                    model.insert(user);
                }
                if i % 500 == 0 {
                    let pages: Vec<StateKey> = store.bucket_keys_after(9, None, usize::MAX)?;
                    let expected: Vec<StateKey> = model.iter().map(|&u| key(9, u)).collect();
                    assert_eq!(pages, expected, "round {round}, after {i} writes");
                }
                let tasks = env.tasks("test")?;
                let cache = tasks.get(&task).ok_or(StateError::Dropped { task, op: "test" })?.lock("test")?;
                if let Some(list) = cache.dirty.get(&9) {
                    assert!(
                        list.keys.len() <= 2 * list.live + 65,
                        "{} listed, {} live",
                        list.keys.len(),
                        list.live
                    );
                    assert!(
                        list.keys[..list.sorted].is_sorted_by(|a, b| a.stored_order() < b.stored_order())
                    );
                }
            }
        }
        Ok(())
    }

    fn store_cache(env: &CachedEnv<MemoryEnv>, task: TaskId) -> Result<usize, StateError> {
        let tasks = env.tasks("test")?;
        let shared = tasks.get(&task).ok_or(StateError::Dropped { task, op: "test" })?;
        Ok(shared.lock("test")?.bytes)
    }
}
