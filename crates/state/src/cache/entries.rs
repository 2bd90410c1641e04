//! The cache's entries: one hash table per shard of the key hash, walked by a CLOCK hand, and the
//! per-bucket lists of dirty keys (docs/architecture.md §5, "Cache").

use hashbrown::HashTable;

use crate::compact::{CompactKey, CompactValue};

/// One cached entry.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) value: CompactValue,
    /// Differs from the inner store; must be written before it is dropped.
    pub(super) dirty: bool,
    /// Read or written since the CLOCK hand last passed.
    pub(super) referenced: bool,
}

/// A cached key and its entry in one cache line: aligned and 64 bytes, so reading an entry
/// after its control byte touches one line (at 72 bytes, unaligned, every entry spanned two).
#[derive(Debug)]
#[repr(align(64))]
pub(super) struct Line {
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
pub(super) struct Entries {
    shards: Box<[HashTable<Line>]>,
    /// Entries in all tables.
    pub(super) len: usize,
    /// The CLOCK hand: the table and the slot it looks at next.
    hand: (usize, usize),
}

/// Tables of [`Entries`].
pub(super) const SHARDS: usize = 1024;

impl Default for Entries {
    fn default() -> Self {
        Self { shards: (0..SHARDS).map(|_| HashTable::new()).collect(), len: 0, hand: (0, 0) }
    }
}

impl Entries {
    /// The key's hash and its table. The table is picked by middle bits: hashbrown places by the
    /// low bits and tags by the top seven.
    pub(super) fn locate(&self, key: &CompactKey) -> (u64, usize) {
        let hash = key.hash_value();
        (hash, (hash >> 32) as usize % SHARDS)
    }

    pub(super) fn get(&self, key: &CompactKey) -> Option<&Slot> {
        let (hash, shard) = self.locate(key);
        self.get_hashed(key, hash, shard)
    }

    /// [`Self::get`] of a key [`Self::locate`]d already.
    pub(super) fn get_hashed(&self, key: &CompactKey, hash: u64, shard: usize) -> Option<&Slot> {
        self.shards[shard].find(hash, |line| line.key == *key).map(|line| &line.slot)
    }

    pub(super) fn get_mut(&mut self, key: &CompactKey) -> Option<&mut Slot> {
        let (hash, shard) = self.locate(key);
        self.get_located(key, hash, shard)
    }

    /// [`Self::get_mut`] of a key [`Self::locate`]d already.
    pub(super) fn get_located(&mut self, key: &CompactKey, hash: u64, shard: usize) -> Option<&mut Slot> {
        self.shards[shard].find_mut(hash, |line| line.key == *key).map(|line| &mut line.slot)
    }

    /// Reads the lines a lookup of `hash` reads (its control bytes and the first entry whose tag
    /// matches, almost always the key's) and returns a byte of them. A batch touches all its keys
    /// first: the loads are independent, so the keys wait for memory together instead of one
    /// after another (two dependent misses each on a table bigger than the CPU caches).
    pub(super) fn touch(&self, hash: u64, shard: usize) -> u8 {
        self.shards[shard].iter_hash(hash).next().map_or(0, |line| line.key.bytes()[0])
    }

    /// Adds a key that is not in the table (the callers looked it up first), [`Self::locate`]d
    /// already.
    pub(super) fn insert_new(&mut self, key: CompactKey, hash: u64, shard: usize, slot: Slot) {
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

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&CompactKey, &mut Slot) -> bool) {
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
    pub(super) fn evict_next(&mut self) -> Option<(CompactKey, Slot)> {
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

    pub(super) fn iter(&self) -> impl Iterator<Item = (&CompactKey, &Slot)> {
        self.shards.iter().flat_map(|shard| shard.iter().map(|line| (&line.key, &line.slot)))
    }
}

/// Keys of one bucket that turned dirty, maybe with stale repeats (checked when read or written
/// back).
#[derive(Debug, Default)]
pub(super) struct DirtyList {
    pub(super) keys: Vec<CompactKey>,
    /// `keys[..sorted]` is in stored order without repeats (what a key scan merges with the
    /// store below); later keys turned dirty since.
    pub(super) sorted: usize,
    /// Entries of the bucket that are dirty now.
    pub(super) live: usize,
}

impl DirtyList {
    /// Sorts the keys that turned dirty since the last call and merges them into the sorted
    /// part: O(keys) when some did, nothing otherwise.
    pub(super) fn sort(&mut self) {
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

/// A dirty list's entries, looked up a chunk at a time as a scan walks the list: a chunk's keys
/// are touched first, so their misses overlap (in a table of gigabytes almost every key misses
/// the CPU caches; one at a time, a key scan waited for memory twice per key).
#[derive(Default)]
pub(super) struct ListLookups {
    at: usize,
    /// Per key from `at`: whether it is dirty, and whether it holds a value (not deleted).
    found: Vec<(bool, bool)>,
}

impl ListLookups {
    const CHUNK: usize = 64;

    /// Key `i` of `keys`: (dirty, holds a value); `(false, false)` if not cached. The entries
    /// must not change while one `ListLookups` is used.
    pub(super) fn get(&mut self, entries: &Entries, keys: &[CompactKey], i: usize) -> (bool, bool) {
        if i < self.at || i >= self.at + self.found.len() {
            let chunk = &keys[i..(i + Self::CHUNK).min(keys.len())];
            let located: Vec<(u64, usize)> = chunk.iter().map(|key| entries.locate(key)).collect();
            let touched = located.iter().fold(0u8, |acc, &(hash, shard)| acc ^ entries.touch(hash, shard));
            std::hint::black_box(touched);
            self.found = chunk
                .iter()
                .zip(located)
                .map(|(key, (hash, shard))| {
                    entries
                        .get_hashed(key, hash, shard)
                        .map_or((false, false), |s| (s.dirty, s.value.is_present()))
                })
                .collect();
            self.at = i;
        }
        self.found[i - self.at]
    }
}

/// Drops stale keys (no longer dirty, or repeated) from a bucket's dirty list. The lines of all
/// its keys are touched first, so their misses overlap; the sorted part stays sorted, and only
/// the keys listed since the last sort are sorted and merged into it (`DirtyList::sort`): a
/// whole sort of the list was most of the cost in the cached sliding-window bench.
pub(super) fn compact(list: &mut DirtyList, entries: &Entries) {
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
