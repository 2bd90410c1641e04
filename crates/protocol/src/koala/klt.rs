//! The key lookup table (KLT) of a Koala task (paper §3 "Koala ownership metadata", §3.3): for each
//! bucket the task owns, where each key's state physically is.
//!
//! Representation, chosen for size: per owned bucket a *default location* plus a
//! `HashMap<u64 key hash, u16 location index>` of exceptions. A bucket the task has always owned
//! has default = itself and no entries; a bucket handed over keeps the sender's default (usually
//! the sender itself), so a hand-over costs O(exceptions), not O(keys), and the sender never scans
//! its store. An entry is added when a key's state moves here while its bucket's default is
//! elsewhere: fetched, or carried by the hand-over with the key's timers ([`HandOver::carried`],
//! so a timer's key is always local at its owner); entries travel with their bucket. When
//! progressive migration finds a retired location exhausted for a bucket, the bucket collapses
//! back to "default = me, no entries". Locations are `u16` indices into a per-table list of task
//! ids.
//!
//! Size (see the `bytes_per_key_at_ten_million_keys` test): a std `HashMap<u64, u16>` slot is 16
//! bytes (the pair is padded to `u64` alignment) plus one control byte, at most 7/8 full and
//! power-of-two sized; with 10 M keys over 128 buckets (78 125 per bucket) that is 28.5 bytes per
//! key *with an explicit entry*. Keys at their bucket's default location cost nothing, which after a
//! scale-out is every key never touched since. A 48-bit tag with the location packed into the same
//! `u64` would halve this (~15 B/key) but makes a tag collision (≈1e-3 per 10 M keys) silently merge
//! two keys' locations, i.e. lose state; with the full 64-bit hash the risk is ≈2e-8.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use koala_types::{BucketId, TaskId};

use super::error::ProtocolError;
use super::messages::{BucketLocations, HandOver};

/// Stable 64-bit hash of a key's canonical bytes (FNV-1a, then the splitmix64 finaliser).
///
/// It is part of the hand-over wire format and of checkpoints, so it never changes.
///
/// ```
/// use koala_protocol::koala::key_hash;
/// assert_eq!(key_hash(b"k"), key_hash(b"k"));
/// assert_ne!(key_hash(b"k"), key_hash(b"l"));
/// ```
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Keys of the exception maps are already hashes; do not hash them again.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type ExceptionMap = HashMap<u64, u16, BuildHasherDefault<Prehashed>>;

/// Locations of the keys of one owned bucket.
#[derive(Clone, Debug, Default)]
struct BucketTable {
    default: u16,
    keys: ExceptionMap,
}

/// Where the state of every key of this task's owned buckets is.
#[derive(Clone, Debug)]
pub struct KeyLookupTable {
    locations: Vec<TaskId>,
    index: BTreeMap<TaskId, u16>,
    buckets: BTreeMap<BucketId, BucketTable>,
}

impl KeyLookupTable {
    /// A table for task `me` that owns `buckets` with all their state local.
    pub fn new(me: TaskId, buckets: impl IntoIterator<Item = BucketId>) -> Self {
        let mut table =
            Self { locations: vec![me], index: BTreeMap::from([(me, 0)]), buckets: BTreeMap::new() };
        for b in buckets {
            table.buckets.insert(b, BucketTable::default());
        }
        table
    }

    /// Whether the task owns `bucket`.
    pub fn owns(&self, bucket: BucketId) -> bool {
        self.buckets.contains_key(&bucket)
    }

    /// The owned buckets, ascending.
    pub fn owned(&self) -> impl Iterator<Item = BucketId> + '_ {
        self.buckets.keys().copied()
    }

    /// Where the state of the key with hash `hash` in `bucket` is; `None` if the bucket is not owned.
    pub fn location(&self, bucket: BucketId, hash: u64) -> Option<TaskId> {
        let table = self.buckets.get(&bucket)?;
        let idx = table.keys.get(&hash).copied().unwrap_or(table.default);
        self.locations.get(usize::from(idx)).copied()
    }

    /// Records that the key's state is now local (fetched, or created here after a miss).
    pub fn mark_local(&mut self, bucket: BucketId, hash: u64) {
        if let Some(table) = self.buckets.get_mut(&bucket) {
            if table.default == 0 {
                table.keys.remove(&hash);
            } else {
                table.keys.insert(hash, 0);
            }
        }
    }

    /// Removes `buckets` from the table and returns their entries for a hand-over (the sender keeps
    /// no copy: one ground truth). Buckets not owned are skipped.
    pub fn take(&mut self, buckets: &[BucketId]) -> HandOver {
        let mut out = Vec::with_capacity(buckets.len());
        for b in buckets {
            if let Some(table) = self.buckets.remove(b) {
                let mut keys: Vec<(u64, u16)> = table.keys.into_iter().collect();
                keys.sort_unstable();
                out.push(BucketLocations { bucket: *b, default: table.default, keys });
            }
        }
        HandOver {
            locations: self.locations.clone(),
            buckets: out,
            metadata: Vec::new(),
            carried: Vec::new(),
            watermark: None,
        }
    }

    /// Installs handed-over buckets, with the keys whose state came with the hand-over
    /// ([`HandOver::carried`]) local; rejects a bucket already owned, an index out of range or a
    /// carried key of a bucket not handed over, in which case nothing is installed.
    pub fn install(&mut self, hand_over: &HandOver) -> Result<(), ProtocolError> {
        let bad = |reason: String| ProtocolError::InvalidAssignment { reason };
        for bl in &hand_over.buckets {
            if self.owns(bl.bucket) {
                return Err(bad(format!("hand-over of bucket {} already owned", bl.bucket)));
            }
            let n = hand_over.locations.len();
            if usize::from(bl.default) >= n || bl.keys.iter().any(|&(_, l)| usize::from(l) >= n) {
                return Err(bad(format!("hand-over of bucket {} names an unknown location", bl.bucket)));
            }
        }
        let moved: BTreeSet<BucketId> = hand_over.buckets.iter().map(|bl| bl.bucket).collect();
        if let Some(&(b, _)) = hand_over.carried.iter().find(|(b, _)| !moved.contains(b)) {
            return Err(bad(format!(
                "hand-over carries the state of a key of bucket {b}, which it does not move"
            )));
        }
        let remap: Vec<u16> = hand_over.locations.iter().map(|&t| self.intern(t)).collect();
        for bl in &hand_over.buckets {
            let default = remap[usize::from(bl.default)];
            let mut keys = ExceptionMap::default();
            keys.reserve(bl.keys.len());
            for &(h, l) in &bl.keys {
                let l = remap[usize::from(l)];
                if l != default {
                    keys.insert(h, l);
                }
            }
            self.buckets.insert(bl.bucket, BucketTable { default, keys });
        }
        // Their state is here now (the sender deleted it): a later hand-over ships "here", and
        // the key's next record needs no fetch.
        for &(bucket, hash) in &hand_over.carried {
            self.mark_local(bucket, hash);
        }
        Ok(())
    }

    /// Owned buckets some of whose keys may have state at `location` (never `me`).
    pub fn buckets_at(&self, location: TaskId) -> Vec<BucketId> {
        let Some(&idx) = self.index.get(&location) else {
            return Vec::new();
        };
        if idx == 0 {
            return Vec::new();
        }
        self.buckets
            .iter()
            .filter(|(_, t)| t.default == idx || t.keys.values().any(|&l| l == idx))
            .map(|(&b, _)| b)
            .collect()
    }

    /// Whether any owned key may still have state at `location`.
    pub fn references(&self, location: TaskId) -> bool {
        !self.buckets_at(location).is_empty()
    }

    /// `location` reported that it holds no more state of `bucket`: its keys there are gone, so
    /// they are local (absent) now and the bucket collapses if its default was that location.
    pub fn exhausted(&mut self, bucket: BucketId, location: TaskId) {
        let Some(&idx) = self.index.get(&location) else {
            return;
        };
        if idx == 0 {
            return;
        }
        if let Some(table) = self.buckets.get_mut(&bucket) {
            if table.default == idx {
                table.default = 0;
                table.keys.retain(|_, l| *l != 0 && *l != idx);
            } else if table.default == 0 {
                table.keys.retain(|_, l| *l != idx);
            } else {
                for l in table.keys.values_mut() {
                    if *l == idx {
                        *l = 0;
                    }
                }
            }
        }
    }

    /// Number of explicit entries (keys whose state is not at their bucket's default location).
    pub fn entries(&self) -> usize {
        self.buckets.values().map(|t| t.keys.len()).sum()
    }

    /// Approximate heap bytes of the exception maps (slot = entry + control byte).
    pub fn approx_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(u64, u16)>() + 1;
        self.buckets
            .values()
            .map(|t| if t.keys.capacity() == 0 { 0 } else { slots(t.keys.capacity()) * slot })
            .sum()
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

#[cfg(test)]
mod tests {
    use super::*;
    use koala_types::OperatorId;

    fn t(i: u32) -> TaskId {
        TaskId::new(OperatorId(1), i)
    }

    #[test]
    fn hand_over_carries_locations_for_one_hop_fetch() {
        // Fig. 5: d1 owns everything; 2,3 move to d2; d2 fetches 2; then 3 moves d2 -> d3.
        let mut d1 = KeyLookupTable::new(t(1), [0, 1]);
        let mut d2 = KeyLookupTable::new(t(2), []);
        let mut d3 = KeyLookupTable::new(t(3), []);
        d2.install(&d1.take(&[1])).expect("install");
        assert!(!d1.owns(1));
        let (k2, k3) = (key_hash(b"2"), key_hash(b"3"));
        assert_eq!(d2.location(1, k2), Some(t(1)));
        d2.mark_local(1, k2);
        assert_eq!(d2.location(1, k2), Some(t(2)));
        d3.install(&d2.take(&[1])).expect("install");
        assert_eq!(d3.location(1, k3), Some(t(1)), "one hop: still points at d1");
        assert_eq!(d3.location(1, k2), Some(t(2)));
        assert_eq!(d3.buckets_at(t(1)), vec![1]);
        d3.exhausted(1, t(1));
        assert_eq!(d3.location(1, k3), Some(t(3)));
        assert_eq!(d3.location(1, k2), Some(t(2)));
        d3.exhausted(1, t(2));
        assert_eq!(d3.entries(), 0);
        assert!(!d3.references(t(2)));
    }

    /// Keys whose state travels with their timers are local at the receiver whatever the
    /// bucket's entries said, so a later hand-over names the receiver, not a task that no longer
    /// has them (the state would be stranded there).
    #[test]
    fn keys_carried_with_a_hand_over_are_local_at_the_receiver() {
        let mut d1 = KeyLookupTable::new(t(1), [1]);
        let mut d2 = KeyLookupTable::new(t(2), []);
        let mut d3 = KeyLookupTable::new(t(3), []);
        let (timed, plain) = (key_hash(b"timed"), key_hash(b"plain"));
        let mut h = d1.take(&[1]);
        h.carried = vec![(1, timed)];
        d2.install(&h).expect("install");
        assert_eq!(d2.location(1, timed), Some(t(2)), "came with its timers");
        assert_eq!(d2.location(1, plain), Some(t(1)), "one hop: still at the sender");
        assert_eq!(d2.entries(), 1);
        // The key's timers fired at d2 and its state stayed: the next hand-over carries no
        // state but names d2 as its location.
        d3.install(&d2.take(&[1])).expect("install");
        assert_eq!(d3.location(1, timed), Some(t(2)));
        assert_eq!(d3.location(1, plain), Some(t(1)));
        // Back to d1, carrying both keys: d1 is the bucket's default, so no entry is left.
        let mut h = d3.take(&[1]);
        h.carried = vec![(1, plain), (1, timed)];
        d1.install(&h).expect("install");
        assert_eq!((d1.location(1, timed), d1.location(1, plain)), (Some(t(1)), Some(t(1))));
        assert_eq!(d1.entries(), 0);
        assert!(!d1.references(t(2)));
    }

    #[test]
    fn bad_hand_over_is_rejected_whole() {
        let mut a = KeyLookupTable::new(t(1), [3]);
        let mut h = KeyLookupTable::new(t(2), [4]).take(&[4]);
        h.buckets.push(BucketLocations { bucket: 3, default: 0, keys: vec![] });
        assert!(a.install(&h).is_err());
        assert!(!a.owns(4));
        h.buckets = vec![BucketLocations { bucket: 5, default: 7, keys: vec![] }];
        assert!(a.install(&h).is_err());
        // A carried key of a bucket the hand-over does not move.
        let mut h = KeyLookupTable::new(t(2), [4]).take(&[4]);
        h.carried = vec![(4, key_hash(b"k")), (6, key_hash(b"l"))];
        assert!(a.install(&h).is_err());
        assert!(!a.owns(4));
    }

    #[test]
    fn bytes_per_key_at_ten_million_keys() {
        // 10 M keys over 128 buckets, every key with an explicit entry (the worst case).
        let per_bucket = 10_000_000 / 128;
        let mut table = KeyLookupTable::new(t(1), []);
        let mut h = KeyLookupTable::new(t(2), [0]).take(&[0]);
        h.locations.push(t(3));
        h.buckets[0].keys = (0..per_bucket as u64).map(|i| (key_hash(&i.to_le_bytes()), 1)).collect();
        table.install(&h).expect("install");
        let per_key = table.approx_bytes() as f64 / per_bucket as f64;
        println!("KLT: {per_key:.1} bytes per explicit entry at 10 M keys / 128 buckets");
        assert!((17.0..40.0).contains(&per_key), "{per_key} bytes per key");
        assert_eq!(table.entries(), per_bucket);
    }
}
