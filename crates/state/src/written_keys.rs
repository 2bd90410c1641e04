//! Which keys a task's store below the cache may hold (docs/architecture.md §5, "Cache"): per
//! bucket, a Bloom filter of every key the cache wrote below since the store was empty. A cache
//! miss on a key outside it is absent without a read of the LSM — the case of every new key
//! (a sliding window of keys, a bucket a task just received and asks about before its state
//! arrives), where an LSM read searches the memtables and each segment's filter for nothing.
//! RocksDB's `memtable_whole_key_filtering` answers the same question for its memtable only.
//!
//! Each bucket's filter grows by adding a layer four times larger than the last, so a lookup
//! reads one 64-byte block per layer (a handful at millions of keys per bucket); each layer is a
//! split block Bloom filter at 12 bits per key: a key sets one bit in each of its block's eight
//! 64-bit words (about 0.4 % false positives per full layer, each costing the LSM read it would
//! have cost anyway; 1.8 % over five layers). At 8 bits per key and 6 bits anywhere in the
//! block, five layers answered "maybe" for 9 % of new keys, and those LSM reads were ~4 % of
//! the sliding window's CPU. Keys are never removed: a deleted key stays
//! "maybe" until its whole bucket is deleted, which empties the bucket's filter.

use std::collections::HashMap;

use koala_types::BucketId;
use koala_types::bloom::{BloomBlock, block_of};

/// Keys the first layer of a bucket holds; each later layer holds four times the one before.
const FIRST_LAYER_KEYS: usize = 1024;
/// Filter bits per key.
const BITS_PER_KEY: usize = 12;

/// One split block Bloom filter (`koala_types::bloom`) of a fixed number of keys.
#[derive(Debug)]
struct Layer {
    blocks: Vec<BloomBlock>,
    capacity: usize,
    len: usize,
}

impl Layer {
    fn new(capacity: usize) -> Self {
        let blocks = (capacity * BITS_PER_KEY).div_ceil(512).max(1);
        Self { blocks: vec![BloomBlock::default(); blocks], capacity, len: 0 }
    }

    fn insert(&mut self, hash: u64) {
        let n = self.blocks.len();
        self.blocks[block_of(hash, n)].insert(hash);
        self.len += 1;
    }

    fn may_hold(&self, hash: u64) -> bool {
        self.blocks[block_of(hash, self.blocks.len())].contains(hash)
    }

    fn bytes(&self) -> usize {
        self.blocks.len() * 64
    }
}

/// The keys written below, per bucket (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct WrittenKeys {
    buckets: HashMap<BucketId, Vec<Layer>, koala_types::KeyHashBuilder>,
    bytes: usize,
}

impl WrittenKeys {
    /// Remembers that the key with this hash (of its stored bytes) was written below.
    pub(crate) fn insert(&mut self, bucket: BucketId, hash: u64) {
        let layers = self.buckets.entry(bucket).or_default();
        if layers.last().is_none_or(|l| l.len >= l.capacity) {
            let capacity = layers.last().map_or(FIRST_LAYER_KEYS, |l| l.capacity * 4);
            let layer = Layer::new(capacity);
            self.bytes += layer.bytes();
            layers.push(layer);
        }
        if let Some(layer) = layers.last_mut() {
            layer.insert(hash);
        }
    }

    /// Whether the key may have been written below (false: it certainly was not).
    pub(crate) fn may_hold(&self, bucket: BucketId, hash: u64) -> bool {
        self.buckets.get(&bucket).is_some_and(|layers| layers.iter().rev().any(|l| l.may_hold(hash)))
    }

    /// Reads the filter blocks [`Self::may_hold`] reads for the key and returns a byte of them,
    /// so that a batch's lookups can wait for memory together (see the cache's `touch`).
    pub(crate) fn touch(&self, bucket: BucketId, hash: u64) -> u8 {
        self.buckets.get(&bucket).map_or(0, |layers| {
            layers.iter().fold(0u8, |acc, l| acc ^ l.blocks[block_of(hash, l.blocks.len())].0[0] as u8)
        })
    }

    /// The bucket's entries below were deleted: nothing of it is there any more.
    pub(crate) fn clear_bucket(&mut self, bucket: BucketId) {
        if let Some(layers) = self.buckets.remove(&bucket) {
            self.bytes -= layers.iter().map(Layer::bytes).sum::<usize>();
        }
    }

    /// Memory held by the filters.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(i: u64) -> u64 {
        let mut h = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^ (h >> 31)
    }

    #[test]
    fn holds_every_written_key_and_few_others_as_it_grows() {
        let mut keys = WrittenKeys::default();
        let n = 100_000;
        for i in 0..n {
            keys.insert(3, hash(i));
        }
        assert!((0..n).all(|i| keys.may_hold(3, hash(i))), "a written key was lost");
        let strangers = (n..n + 100_000).filter(|&i| keys.may_hold(3, hash(i))).count();
        // Five layers, each ≈ 0.4 % false positives when full (the last is not): 1 804 here;
        // at 8 bits per key and 6 bits anywhere in the block it was 8 953.
        assert!(strangers < 2_500, "{strangers} false positives in 100 000");
        assert!(!keys.may_hold(4, hash(0)), "another bucket holds nothing");
        // 1 024 + 4 096 + 16 384 + 65 536 + 262 144 keys of room, 12 bits each.
        assert_eq!(keys.bytes(), (1024 + 4096 + 16_384 + 65_536 + 262_144) * BITS_PER_KEY / 8);
        keys.clear_bucket(3);
        assert!(!keys.may_hold(3, hash(0)));
        assert_eq!(keys.bytes(), 0);
    }
}
