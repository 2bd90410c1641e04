//! One task's cache: its entries, dirty lists, in-flight write-backs and byte accounting
//! (docs/architecture.md §5, "Cache"); the locking and the writer thread are in `mod.rs`.

use std::collections::{HashMap, VecDeque};

use koala_types::BucketId;

use super::ENTRY_OVERHEAD_BYTES;
use super::entries::{DirtyList, Entries, ListLookups, Slot, compact};
use crate::compact::{CompactKey, CompactValue, KeyHash};
use crate::written_keys::WrittenKeys;
use crate::{CacheCounts, StateBackend, StateError, StateKey, StoredBatch};

/// What a key scan of the cache lists ([`TaskCache::keys_after`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Listing {
    /// The keys that hold a value, checked entry by entry.
    Exact,
    /// A superset: also keys of the dirty list written back or deleted since.
    Candidates,
}

/// A dirty entry evicted and queued for the writer, not yet below.
#[derive(Debug)]
pub(super) struct InFlight {
    /// The run that writes it (a key evicted again before the first run is written is in a
    /// later run; only that one removes it).
    pub(super) run: u64,
    pub(super) value: CompactValue,
}

/// Dirty victims of one eviction step, for the writer.
#[derive(Debug)]
pub(super) struct Run {
    pub(super) seq: u64,
    pub(super) keys: Vec<CompactKey>,
    pub(super) writes: StoredBatch,
}

/// What an entry costs: its map slot and index ([`ENTRY_OVERHEAD_BYTES`]), a dirty-list copy of
/// its key, and whatever of key and value lives on the heap.
pub(super) fn entry_cost(key: &CompactKey, value: &CompactValue) -> usize {
    ENTRY_OVERHEAD_BYTES + 2 * key.heap_len() + value.heap_len()
}

#[derive(Debug)]
pub(super) struct TaskCache {
    /// A hash map, not an ordered one: a lookup is one probe of the table, whose slot holds the
    /// inline key and value (two cache misses on a big cache, where an `IndexMap` takes three).
    pub(super) entries: Entries,
    pub(super) dirty: HashMap<BucketId, DirtyList, KeyHash>,
    /// Evicted dirty entries the writer has not written yet; an entry in `entries` is newer.
    pub(super) in_flight: HashMap<CompactKey, InFlight, KeyHash>,
    /// Runs not yet taken by the writer, oldest first.
    pub(super) queued: VecDeque<Run>,
    /// The writer is writing runs it took from `queued`.
    pub(super) writing: bool,
    pub(super) next_run: u64,
    /// Bytes charged for in-flight entries (part of `bytes`).
    pub(super) in_flight_bytes: usize,
    /// In-flight entries holding a value (for `approximate_len`).
    pub(super) in_flight_puts: u64,
    /// Set by the writer when a write-back failed.
    pub(super) write_back_failed: Option<String>,
    /// The keys written below (`written_keys.rs`), if the store below started empty and only
    /// this cache writes it; `None` once its filters would take more than a quarter of the
    /// budget (every miss then reads below).
    pub(super) written: Option<WrittenKeys>,
    /// Dirty entries holding a value (for `approximate_len`).
    pub(super) dirty_puts: u64,
    pub(super) bytes: usize,
    /// The budget: the env's, or the task's share set by the worker (resizable).
    pub(super) capacity: usize,
    /// Bytes the task holds outside the cache that the budget covers (the KLT; at most half).
    pub(super) outside: usize,
    /// Lookups answered from the cache and not, since it was opened.
    pub(super) counts: CacheCounts,
}

impl TaskCache {
    pub(super) fn new(capacity: usize, known_empty: bool) -> Self {
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
            outside: 0,
            counts: CacheCounts::default(),
        }
    }

    /// No run is queued or being written.
    pub(super) fn is_idle(&self) -> bool {
        self.queued.is_empty() && !self.writing
    }

    /// The writer wrote `key` in run `seq`: forget it unless a later run holds it.
    pub(super) fn finish_in_flight(&mut self, key: &CompactKey, seq: u64) {
        if self.in_flight.get(key).is_some_and(|f| f.run == seq)
            && let Some(done) = self.in_flight.remove(key)
        {
            let cost = entry_cost(key, &done.value);
            self.bytes -= cost;
            self.in_flight_bytes -= cost;
            self.in_flight_puts -= u64::from(done.value.is_present());
        }
    }

    /// Sets `key` (dirty if `dirty`), [`Entries::locate`]d already (its hash and table),
    /// keeping the byte count and dirty bookkeeping.
    pub(super) fn set_hashed(
        &mut self,
        key: CompactKey,
        hash: u64,
        shard: usize,
        value: CompactValue,
        dirty: bool,
    ) {
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
    pub(super) fn mark_clean(&mut self, key: &CompactKey) {
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
    pub(super) fn write_back_buckets(
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

    /// Every dirty entry (puts and deletes) of `buckets` in stored form, unsorted: what differs
    /// from the store below there. Entries of other buckets are not copied (a checkpoint reads
    /// only the buckets it rewrites). The caller waited for the in-flight runs.
    pub(super) fn dirty_overlay(&self, buckets: &[BucketId]) -> StoredBatch {
        let mut out = StoredBatch::default();
        // Through the buckets' dirty lists, not the table: a freeze of a few buckets costs their
        // dirty keys, not a pass over the working set.
        for bucket in buckets {
            let Some(list) = self.dirty.get(bucket) else { continue };
            // A key that turned dirty again since the list was last compacted is listed again.
            let mut keys: Vec<&CompactKey> = list.keys.iter().collect();
            keys.sort_unstable();
            keys.dedup();
            for key in keys {
                if let Some(slot) = self.entries.get(key).filter(|slot| slot.dirty) {
                    out.push(|o| key.put_stored(o), slot.value.as_slice());
                }
            }
        }
        out
    }

    /// Writes back every dirty entry (they stay cached, clean). The caller waited for the
    /// in-flight runs.
    pub(super) fn write_back_all(&mut self, inner: &dyn StateBackend) -> Result<u64, StateError> {
        let mut keys: Vec<CompactKey> =
            self.entries.iter().filter(|(_, slot)| slot.dirty).map(|(key, _)| key.clone()).collect();
        keys.sort_unstable();
        self.dirty.clear();
        self.commit(keys, inner)
    }

    /// Writes the (dirty) entries of `keys` below and marks them clean; returns the bytes
    /// written (key and value bytes, as scans count them).
    pub(super) fn commit(
        &mut self,
        keys: Vec<CompactKey>,
        inner: &dyn StateBackend,
    ) -> Result<u64, StateError> {
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
    pub(super) fn evict_if_full(&mut self) -> bool {
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
    /// [`Listing::Candidates`] lists every key of the dirty list without looking its entry up
    /// (no random read per key), so also keys written back since or deleted.
    pub(super) fn keys_after(
        &mut self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
        inner: &dyn StateBackend,
        listing: Listing,
    ) -> Result<Vec<StateKey>, StateError> {
        let exact = listing == Listing::Exact;
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
        let mut lookups = ListLookups::default();
        while out.len() < limit {
            while exact && dirty_at < list.keys.len() && !lookups.get(entries, &list.keys, dirty_at).0 {
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
                    if !exact || lookups.get(entries, &list.keys, dirty_at).1 {
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
    pub(super) fn cached_bytes(&self) -> usize {
        self.bytes - self.in_flight_bytes
    }

    /// Drops the written-keys filters if they outgrew a quarter of the budget.
    pub(super) fn check_written_size(&mut self) {
        if self.written.as_ref().is_some_and(|w| w.bytes() > self.capacity / 4) {
            self.written = None;
        }
    }

    /// Whether `key`, of hash `hash` ([`Entries::locate`]), may be below (false: a miss is
    /// certainly absent, no need to read below).
    pub(super) fn may_be_below(&self, key: &CompactKey, hash: u64) -> bool {
        self.written.as_ref().is_none_or(|w| w.may_hold(key.bucket(), hash))
    }

    /// Bytes charged against the budget: entries (cached and in flight), the written-keys
    /// filters and what the task holds outside the cache (`outside`, the KLT).
    pub(super) fn charged(&self) -> usize {
        self.bytes + self.outside + self.written.as_ref().map_or(0, WrittenKeys::bytes)
    }

    /// Forgets every entry of `buckets` without writing anything back. The caller waited for
    /// the in-flight runs.
    pub(super) fn forget_buckets(&mut self, buckets: &[BucketId]) {
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
