//! The key lookup table (KLT) of a Koala task (paper §3 "Koala ownership metadata", §3.3;
//! docs/protocols.md §6): for each bucket the task owns, where its keys' state may be.
//!
//! Local first: a key whose state is in the task's own store is local, always, and the table is
//! consulted only on a local miss (the core asks the runtime's store through
//! [`LocalKeys`](super::LocalKeys)). Per owned bucket the table holds *layers* — the tasks that
//! handed the bucket over while holding some of its state, newest first, each with the membership
//! filter of the keys it held ([`KeyFilter`], built by that task in the background and shipped
//! when ready; until then any key may be there) — and a few *explicit entries* (key hash →
//! location) that overrule the layers. A bucket the task has always owned, or whose old locations
//! are all drained, has neither: every key is local. A local miss asks every layer whose filter
//! may hold the key (in the same round, so a lookup is one round trip) and, if none does or all
//! answer "not here", the key is new and created locally — no round trip and no entry for a key
//! outside every filter.
//!
//! Entries exist only where a layer would mislead: while a layer of the bucket still waits for
//! its filter, a key every candidate answered "not here" for gets an entry "here or nowhere", so
//! it is not asked about again; those entries go once the bucket's filters are all there. A
//! filter's false positive gets no entry: the key's state is created here when its record is
//! processed, and the store answers first from then on (a key that gets no state, or whose state
//! is deleted, costs a round trip each time it comes back). A hand-over carries the layers (filters
//! included) and the entries, with the sender's own layer in front, so every later fetch is one
//! hop whatever the number of earlier reconfigurations; the sender never scans its store.
//! Locations are `u16` indices into a per-table list of task ids.
//!
//! Lookup cost: a batch looks up each of its keys, so the table is laid out for that path. It
//! is an array indexed by bucket (buckets are `0..num_buckets`); a bucket owned outright is one
//! read of that array, and a bucket after one hand-over, once its filter arrived, is that read
//! plus one cache line of the filter (a blocked Bloom filter, [`KeyFilter`]). Only other
//! shapes (a layer waiting for its filter, several layers, entries) go through a table behind a
//! pointer. A single key's lookup reads the local-first memo only if some layer may hold the key;
//! a batch's probes it for every key, overlapped with the filter loads ([`KeyLookupTable::lookup_batch`]).
//!
//! Size (the `klt` benchmark): a filter costs ≈ 1.5 bytes per key its location held; an explicit
//! entry 28.5 bytes (a std `HashMap<u64, u16>` slot is 16 bytes plus a control byte, at most 7/8
//! full, power-of-two sized). With the full 64-bit hash a collision (two keys sharing an entry)
//! has probability ≈ 2e-8 at 10 M keys.

use hashbrown::HashTable;
use std::collections::{BTreeMap, BTreeSet};

use koala_types::{BucketId, Epoch, TaskId};

use super::filter::KeyFilter;
use super::messages::{BucketLocations, HandOver, Layer};
use crate::common::error::ProtocolError;

mod slot;
#[cfg(test)]
mod tests;

use slot::{BucketTable, ExceptionMap, Slot, TableLayer};

/// A filter the table waits for: ask `location` for the filter of `bucket` it handed over at `since`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PendingFilter {
    /// The location that builds it.
    pub location: TaskId,
    /// The bucket.
    pub bucket: BucketId,
    /// The epoch of its hand-over.
    pub since: Epoch,
}

/// The keys of one batch for [`KeyLookupTable::lookup_batch`] and its answer: the keys some
/// location may hold, with the locations to ask. Kept between batches for its allocations.
#[derive(Clone, Debug, Default)]
pub struct BatchLookup {
    keys: Vec<(BucketId, u64)>,
    /// (position in `keys`, its range of `locations`).
    named: Vec<(usize, std::ops::Range<usize>)>,
    locations: Vec<TaskId>,
    /// Per key: whether the memo knows it is local.
    local: Vec<bool>,
}

impl BatchLookup {
    /// Empties the batch (the allocations stay).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.named.clear();
        self.locations.clear();
        self.local.clear();
    }

    /// Adds the key with hash `hash` of `bucket`; its position is the number of keys before it.
    pub fn push(&mut self, bucket: BucketId, hash: u64) {
        self.keys.push((bucket, hash));
    }

    /// The keys added, in order.
    pub fn keys(&self) -> &[(BucketId, u64)] {
        &self.keys
    }

    /// After [`KeyLookupTable::lookup_batch`]: the position of each key a location may hold
    /// (ascending) with the locations to ask; every other key is local or new.
    pub fn named(&self) -> impl Iterator<Item = (usize, &[TaskId])> + '_ {
        self.named.iter().map(|(i, r)| (*i, self.locations.get(r.clone()).unwrap_or_default()))
    }
}

/// Keys the local-first memo holds at most (≈ 35 KB, allocated when the first layer arrives);
/// it is emptied between two events once fuller.
const LOCAL_MEMO_MAX: usize = 1024;

/// Where the state of every key of this task's owned buckets may be.
#[derive(Clone, Debug)]
pub struct KeyLookupTable {
    locations: Vec<TaskId>,
    index: BTreeMap<TaskId, u16>,
    /// Indexed by bucket; buckets past the end are not owned.
    slots: Vec<Slot>,
    /// Keys of buckets with layers known to be local (found in the store, or whose state arrived
    /// here), hash → bucket: a bounded memo of the store's answer, so a hot key is not read from
    /// the store on every batch. A key stays local while its bucket is owned (its state is here or
    /// nowhere; only a hand-over of the bucket moves it), so entries go with their bucket. A
    /// hashbrown table (not a std map) so that a batch can touch its lines before it reads them
    /// ([`Self::lookup_batch`]).
    memo: HashTable<(u64, BucketId)>,
}

impl KeyLookupTable {
    /// A table for task `me` that owns `buckets` with all their state local.
    pub fn new(me: TaskId, buckets: impl IntoIterator<Item = BucketId>) -> Self {
        let mut table = Self {
            locations: vec![me],
            index: BTreeMap::from([(me, 0)]),
            slots: Vec::new(),
            memo: HashTable::new(),
        };
        for b in buckets {
            table.set(b, Slot::Local);
        }
        table
    }

    fn slot(&self, bucket: BucketId) -> &Slot {
        self.slots.get(usize::from(bucket)).unwrap_or(&Slot::NotOwned)
    }

    fn set(&mut self, bucket: BucketId, slot: Slot) {
        let i = usize::from(bucket);
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, Slot::default);
        }
        self.slots[i] = slot;
    }

    /// Whether the task owns `bucket`.
    pub fn owns(&self, bucket: BucketId) -> bool {
        !matches!(self.slot(bucket), Slot::NotOwned)
    }

    /// The owned buckets, ascending.
    pub fn owned(&self) -> impl Iterator<Item = BucketId> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !matches!(s, Slot::NotOwned))
            .map(|(b, _)| b as BucketId)
    }

    /// Where the state of the key with hash `hash` in `bucket` may be if it is not in the task's
    /// own store: the locations to ask (in one round; at most one has it), or none if a local miss
    /// means the key is new. `None` if the bucket is not owned.
    pub fn candidates(&self, bucket: BucketId, hash: u64, out: &mut Vec<TaskId>) -> Option<()> {
        out.clear();
        self.push_candidates(bucket, hash, out)
    }

    /// [`Self::candidates`], appended to `out`.
    #[inline]
    fn push_candidates(&self, bucket: BucketId, hash: u64, out: &mut Vec<TaskId>) -> Option<()> {
        match self.slot(bucket) {
            Slot::NotOwned => return None,
            Slot::Local => {}
            Slot::Filtered { location, filter, .. } => {
                if filter.contains(hash) {
                    out.extend(self.locations.get(usize::from(*location)));
                }
            }
            Slot::Layered(table) => table.candidates(hash, &self.locations, out),
        }
        Some(())
    }

    /// A batch's lookup of a key on the hot path: [`Self::candidates`], and none for a key
    /// known to be local ([`Self::known_local`]). The memo is read only when the layers name a
    /// location, so a key no filter may hold (most new keys) costs the bucket's slot and one
    /// line of its filter.
    #[inline]
    pub fn lookup(&self, bucket: BucketId, hash: u64, out: &mut Vec<TaskId>) -> Option<()> {
        self.candidates(bucket, hash, out)?;
        if !out.is_empty() && self.known_local(hash) {
            out.clear();
        }
        Some(())
    }

    /// [`Self::lookup`] of a batch's keys ([`BatchLookup::push`]), in two loops so that the
    /// batch's cache misses overlap instead of coming one by one. The first loop only loads:
    /// each key's filter line (its bucket's newest filter) and its probe of the memo, whose
    /// answer it keeps; the second reads the filters, which are in cache by then, and names a
    /// key only if some filter may hold it and the memo does not know it is local. A running
    /// worker's other tasks evict the table between two batches of a task: in the demo, one key
    /// at a time, the filter line was 89 % of a lookup (`perf annotate`). Probing the memo only
    /// for the keys a filter names (a third of the demo's, hot keys the old location held), in
    /// the second loop, made it a chain of two dependent misses per such key — half of the
    /// lookup's time in an instrumented demo; in the first loop, for every key, those chains
    /// overlap and a key the memo lacks mostly costs one line of its 2 KB of control bytes —
    /// as long as the memo is at its bound ([`Self::trim_memo`] shrinks it back: in a scale-in,
    /// where every fetched key is noted, a memo left at the size one event had grown it to made
    /// the lookups after the hand-over 3–5× slower).
    /// Keys of buckets not owned have no candidate (callers check [`Self::owns`] first).
    pub fn lookup_batch(&self, batch: &mut BatchLookup) {
        batch.named.clear();
        batch.locations.clear();
        batch.local.clear();
        let mut touched = 0;
        for &(bucket, hash) in &batch.keys {
            touched ^= match self.slot(bucket) {
                Slot::NotOwned | Slot::Local => 0,
                Slot::Filtered { filter, .. } => filter.touch(hash),
                Slot::Layered(table) => {
                    table.layers.first().and_then(|l| l.filter.as_ref()).map_or(0, |f| f.touch(hash))
                }
            };
            batch.local.push(self.known_local(hash));
        }
        std::hint::black_box(touched);
        for (i, (&(bucket, hash), &local)) in batch.keys.iter().zip(&batch.local).enumerate() {
            let start = batch.locations.len();
            self.push_candidates(bucket, hash, &mut batch.locations);
            if batch.locations.len() > start {
                if local {
                    batch.locations.truncate(start);
                } else {
                    batch.named.push((i, start..batch.locations.len()));
                }
            }
        }
    }

    /// Whether a local miss of any key of `bucket` is certainly a new key (no layer left).
    pub fn is_settled(&self, bucket: BucketId) -> bool {
        matches!(self.slot(bucket), Slot::NotOwned | Slot::Local)
    }

    /// Every candidate answered "not here" for the key: its state is here or nowhere. Recorded
    /// only while a layer of the bucket still waits for its filter (which would otherwise send
    /// every lookup of the key there); a filter's false positive gets no entry: the key's state
    /// is created here when its record is processed, and the store answers first from then on.
    pub fn mark_local(&mut self, bucket: BucketId, hash: u64) {
        // Only the general form has a layer waiting for its filter.
        if let Some(Slot::Layered(table)) = self.slots.get_mut(usize::from(bucket))
            && table.layers.iter().any(|l| l.filter.is_none())
        {
            table.keys.insert(hash, 0);
        }
    }

    /// Whether the key is known to be local (see [`Self::note_local`]).
    pub fn known_local(&self, hash: u64) -> bool {
        self.memo.find(hash, |&(h, _)| h == hash).is_some()
    }

    /// The key was found in this task's store, or its state arrived here, or it is new here:
    /// remember it is local (bounded, see [`Self::trim_memo`]) while its bucket has layers.
    pub fn note_local(&mut self, bucket: BucketId, hash: u64) {
        if !self.is_settled(bucket) {
            match self.memo.entry(hash, |&(h, _)| h == hash, |&(h, _)| h) {
                hashbrown::hash_table::Entry::Occupied(mut e) => e.get_mut().1 = bucket,
                hashbrown::hash_table::Entry::Vacant(e) => {
                    e.insert((hash, bucket));
                }
            }
        }
    }

    /// Empties the local memo if it outgrew its bound, and gives back the room an event grew it
    /// to (between two events, never within one: the store does not show what an event's own
    /// actions install until the runtime executes them, so within an event the memo holds every
    /// key noted).
    pub fn trim_memo(&mut self) {
        if self.memo.len() > LOCAL_MEMO_MAX {
            self.memo.clear();
            // An event can fill it far past the bound (every key a fetch brings is noted); the
            // probes of the next events must not walk a table sized for that.
            if self.memo.capacity() > 2 * LOCAL_MEMO_MAX {
                self.memo.shrink_to(LOCAL_MEMO_MAX, |&(h, _)| h);
            }
        }
    }

    /// The key's state is here now (fetched or pulled): an entry naming
    /// another location would send the next owner to the wrong place, so it names this task.
    /// No entry is added: the store answers first.
    pub fn now_local(&mut self, bucket: BucketId, hash: u64) {
        // Only the general form has entries.
        if let Some(Slot::Layered(table)) = self.slots.get_mut(usize::from(bucket))
            && let Some(l) = table.keys.get_mut(&hash)
        {
            *l = 0;
        }
    }

    /// Removes `buckets` from the table and returns their locations for a hand-over in `epoch`,
    /// with this task in front as the newest layer (its filter is built later, on request). The
    /// sender keeps no copy: one ground truth. Buckets not owned are skipped.
    pub fn take(&mut self, buckets: &[BucketId], epoch: Epoch) -> HandOver {
        self.memo.retain(|(_, b)| !buckets.contains(b));
        let mut out = Vec::with_capacity(buckets.len());
        for b in buckets {
            let Some(slot) = self.slots.get_mut(usize::from(*b)) else { continue };
            let table = match std::mem::take(slot) {
                Slot::NotOwned => continue,
                Slot::Local => BucketTable::default(),
                Slot::Filtered { location, since, filter } => BucketTable {
                    layers: vec![TableLayer { location, since, filter: Some(filter) }],
                    keys: ExceptionMap::default(),
                },
                Slot::Layered(table) => *table,
            };
            let mut keys: Vec<(u64, u16)> = table.keys.into_iter().collect();
            keys.sort_unstable();
            let mut layers = vec![Layer { location: 0, since: epoch, filter: None }];
            layers.extend(table.layers.into_iter().map(|l| Layer {
                location: l.location,
                since: l.since,
                filter: l.filter,
            }));
            out.push(BucketLocations { bucket: *b, layers, keys });
        }
        HandOver { locations: self.locations.clone(), buckets: out, timers: Vec::new(), watermark: None }
    }

    /// Installs handed-over buckets and returns the filters still to be asked for; rejects a
    /// bucket already owned or an index out of range, in which case nothing is installed. A layer naming this task is dropped: its keys are in
    /// its own store, which answers first.
    pub fn install(&mut self, hand_over: HandOver) -> Result<Vec<PendingFilter>, ProtocolError> {
        let bad = |reason: String| ProtocolError::InvalidAssignment { reason };
        let n = hand_over.locations.len();
        for bl in &hand_over.buckets {
            if self.owns(bl.bucket) {
                return Err(bad(format!("hand-over of bucket {} already owned", bl.bucket)));
            }
            if bl.layers.iter().any(|l| usize::from(l.location) >= n)
                || bl.keys.iter().any(|&(_, l)| usize::from(l) >= n)
            {
                return Err(bad(format!("hand-over of bucket {} names an unknown location", bl.bucket)));
            }
        }
        let remap: Vec<u16> = hand_over.locations.iter().map(|&t| self.intern(t)).collect();
        let mut pending = Vec::new();
        for bl in hand_over.buckets {
            let mut layers = Vec::with_capacity(bl.layers.len());
            for l in bl.layers {
                let location = remap[usize::from(l.location)];
                if location == 0 || layers.iter().any(|x: &TableLayer| x.location == location) {
                    continue;
                }
                if l.filter.is_none() {
                    pending.push(PendingFilter {
                        location: self.locations[usize::from(location)],
                        bucket: bl.bucket,
                        since: l.since,
                    });
                }
                layers.push(TableLayer { location, since: l.since, filter: l.filter });
            }
            let mut keys = ExceptionMap::default();
            if !layers.is_empty() {
                keys.reserve(bl.keys.len());
                for (h, l) in bl.keys {
                    keys.insert(h, remap[usize::from(l)]);
                }
            }
            let slot = Slot::of(BucketTable { layers, keys });
            if !matches!(slot, Slot::Local) && self.memo.capacity() == 0 {
                self.memo.reserve(LOCAL_MEMO_MAX, |&(h, _)| h);
            }
            self.set(bl.bucket, slot);
        }
        Ok(pending)
    }

    /// The filter of the layer (`location`, `bucket`, `since`) arrived. Installed if that layer
    /// is still here and waiting for it (a late answer for a bucket since handed on, or a layer
    /// since drained, is dropped); once no layer of the bucket waits, its "here or nowhere"
    /// entries go (the filters answer for those keys, up to a false positive's round trip).
    /// Returns whether it was installed.
    pub fn filter_arrived(
        &mut self,
        location: TaskId,
        bucket: BucketId,
        since: Epoch,
        filter: KeyFilter,
    ) -> bool {
        let Some(&idx) = self.index.get(&location) else {
            return false;
        };
        // Only the general form has a layer waiting for its filter.
        let Some(slot) = self.slots.get_mut(usize::from(bucket)) else {
            return false;
        };
        let Slot::Layered(table) = slot else {
            return false;
        };
        let Some(layer) =
            table.layers.iter_mut().find(|l| l.location == idx && l.since == since && l.filter.is_none())
        else {
            return false;
        };
        layer.filter = Some(filter);
        if table.layers.iter().all(|l| l.filter.is_some()) {
            table.keys.retain(|_, &mut l| l != 0);
            if table.keys.is_empty() {
                table.keys = ExceptionMap::default();
            }
        }
        slot.normalize();
        true
    }

    /// Owned buckets some of whose keys may have state at `location` (never `me`).
    pub fn buckets_at(&self, location: TaskId) -> Vec<BucketId> {
        let Some(&idx) = self.index.get(&location) else {
            return Vec::new();
        };
        if idx == 0 {
            return Vec::new();
        }
        self.slots.iter().enumerate().filter(|(_, s)| s.names(idx)).map(|(b, _)| b as BucketId).collect()
    }

    /// Every location some owned bucket's layers name (never `me`).
    pub fn locations_named(&self) -> BTreeSet<TaskId> {
        self.slots
            .iter()
            .flat_map(Slot::layer_locations)
            .filter_map(|l| self.locations.get(usize::from(l)).copied())
            .collect()
    }

    /// Whether any owned key may still have state at `location`.
    pub fn references(&self, location: TaskId) -> bool {
        let Some(&idx) = self.index.get(&location) else {
            return false;
        };
        idx != 0 && self.slots.iter().any(|s| s.names(idx))
    }

    /// `location` reported that it holds no more state of `bucket`: its layer goes, and keys
    /// pointing there are here or nowhere; a bucket without layers is all local.
    pub fn exhausted(&mut self, bucket: BucketId, location: TaskId) {
        let Some(&idx) = self.index.get(&location) else {
            return;
        };
        if idx == 0 {
            return;
        }
        let Some(slot) = self.slots.get_mut(usize::from(bucket)) else {
            return;
        };
        match slot {
            Slot::NotOwned | Slot::Local => {}
            Slot::Filtered { location, .. } => {
                if *location == idx {
                    *slot = Slot::Local;
                }
            }
            Slot::Layered(table) => {
                table.layers.retain(|l| l.location != idx);
                for l in table.keys.values_mut() {
                    if *l == idx {
                        *l = 0;
                    }
                }
                slot.normalize();
            }
        }
    }

    /// Number of explicit entries.
    pub fn entries(&self) -> usize {
        self.slots.iter().map(|s| if let Slot::Layered(t) = s { t.keys.len() } else { 0 }).sum()
    }

    /// Approximate heap bytes: the slots, entry maps and the local memo (slot = entry + control
    /// byte), filters and layers.
    pub fn approx_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(u64, u16)>() + 1;
        let memo = if self.memo.capacity() == 0 { 0 } else { slots(self.memo.capacity()) * slot };
        let array = self.slots.capacity() * std::mem::size_of::<Slot>();
        memo + array
            + self
                .slots
                .iter()
                .map(|s| match s {
                    Slot::NotOwned | Slot::Local => 0,
                    Slot::Filtered { filter, .. } => filter.approx_bytes(),
                    Slot::Layered(t) => {
                        let entries =
                            if t.keys.capacity() == 0 { 0 } else { slots(t.keys.capacity()) * slot };
                        let filters: usize = t
                            .layers
                            .iter()
                            .filter_map(|l| l.filter.as_ref())
                            .map(KeyFilter::approx_bytes)
                            .sum::<usize>();
                        std::mem::size_of::<BucketTable>()
                            + entries
                            + filters
                            + t.layers.capacity() * std::mem::size_of::<TableLayer>()
                    }
                })
                .sum::<usize>()
    }

    fn intern(&mut self, task: TaskId) -> u16 {
        if let Some(&i) = self.index.get(&task) {
            return i;
        }
        // More than 65 535 distinct tasks ever would wrap; the coordinator never gets near that.
        let i = self.locations.len() as u16;
        self.locations.push(task);
        self.index.insert(task, i);
        i
    }
}

/// Slots a std hash map with `capacity` usable entries allocates (7/8 load, power of two).
fn slots(capacity: usize) -> usize {
    if capacity < 8 { (capacity + 1).next_power_of_two() } else { (capacity * 8 / 7).next_power_of_two() }
}
