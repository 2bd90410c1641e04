//! Membership filters of handed-over buckets (docs/protocols.md §6): after a hand-over, the old
//! location builds — in the background, not during the hand-over's pause — an immutable filter of
//! the keys of the bucket it still holds, and the bucket's owner consults it on a local miss. A key
//! outside every filter of its bucket is new: it is created locally, with no round trip and no
//! KLT entry. A filter never has a false negative; a false positive (≈ 0.4 %) costs one "not here".
//!
//! A filter built at any time after the hand-over is valid for as long as the location does not own
//! the bucket again: until then the location's keys of the bucket only leave (fetched, pulled),
//! never arrive, so a filter of a later content is a subset of the true content at the hand-over
//! and a superset of everything the location still holds.
//!
//! The filter is consulted for most keys of most batches after a hand-over, so it is laid out for
//! that: a split block Bloom filter (the layout of Apache Parquet's, with 64-bit words), whose
//! blocks are one cache line each. A key's hash picks one block and one bit in each of its eight
//! words: a lookup reads one cache line. At 12 bits per key it has the false-positive rate of an
//! 8-bit binary fuse filter (≈ 0.4 %) for 1.5 bytes per key instead of 1.13, where the fuse filter
//! reads three lines per lookup.
//!
//! ```
//! use koala_protocol::koala::{KeyFilter, key_hash};
//! let hashes: Vec<u64> = (0..1000u32).map(|i| key_hash(&i.to_le_bytes())).collect();
//! let filter = KeyFilter::build(hashes.clone());
//! assert!(hashes.iter().all(|&h| filter.contains(h)), "no false negative");
//! let strangers = (1000..101_000u32).filter(|i| filter.contains(key_hash(&i.to_le_bytes()))).count();
//! assert!(strangers < 1000, "about 0.4 % false positives, got {strangers} of 100 000");
//! assert!(filter.approx_bytes() < 1600, "about 1.5 bytes per key");
//! ```

use serde::{Deserialize, Serialize};

use super::key_hash::key_hash;
use super::serve::LocationStore;
use koala_types::BucketId;
use koala_types::bloom::{BloomBlock as Block, block_of};

/// Filter bits per distinct key. With 512-bit blocks and eight bits set per key this gives
/// ≈ 0.40 % false positives (0.19 % at 14, 0.09 % at 16).
const BITS_PER_KEY: usize = 12;

/// An immutable set of key hashes ([`key_hash`]) with no false negatives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyFilter {
    keys: u64,
    repr: Repr,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Repr {
    /// The empty set.
    Empty,
    /// A split block Bloom filter of at least one block (on the wire: its words' bytes,
    /// little-endian).
    Blocked(#[serde(with = "block_bytes")] Box<[Block]>),
}

impl KeyFilter {
    /// A filter of these key hashes (duplicates allowed).
    pub fn build(mut hashes: Vec<u64>) -> Self {
        hashes.sort_unstable();
        hashes.dedup();
        let keys = hashes.len() as u64;
        if hashes.is_empty() {
            return Self { keys, repr: Repr::Empty };
        }
        let n = (hashes.len() * BITS_PER_KEY).div_ceil(512);
        let mut blocks = vec![Block::default(); n].into_boxed_slice();
        for h in hashes {
            if let Some(block) = blocks.get_mut(block_of(h, n)) {
                block.insert(h);
            }
        }
        Self { keys, repr: Repr::Blocked(blocks) }
    }

    /// Whether the key with this hash may be in the set (always true if it is).
    #[inline]
    pub fn contains(&self, hash: u64) -> bool {
        match &self.repr {
            Repr::Empty => false,
            // Never out of range (`block_of` < n); a missing block would answer "may be".
            Repr::Blocked(blocks) => {
                blocks.get(block_of(hash, blocks.len())).is_none_or(|b| b.contains(hash))
            }
        }
    }

    /// Reads the first word of the cache line [`Self::contains`] reads for `hash` (0 if the
    /// filter is empty): a batch touches every key's line first, in a loop of loads alone, so
    /// their cache misses overlap (see
    /// [`KeyLookupTable::lookup_batch`](super::KeyLookupTable::lookup_batch)).
    #[inline]
    pub fn touch(&self, hash: u64) -> u64 {
        match &self.repr {
            Repr::Empty => 0,
            Repr::Blocked(blocks) => blocks.get(block_of(hash, blocks.len())).map_or(0, |b| b.0[0]),
        }
    }

    /// Distinct keys the filter was built from.
    pub fn keys(&self) -> u64 {
        self.keys
    }

    /// Heap bytes held.
    pub fn approx_bytes(&self) -> usize {
        match &self.repr {
            Repr::Empty => 0,
            Repr::Blocked(blocks) => std::mem::size_of_val::<[Block]>(blocks),
        }
    }
}

/// A filter's blocks on the wire: a byte sequence, 64 bytes per block, words little-endian.
mod block_bytes {
    use serde::de::Error;
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Block;

    pub(super) fn serialize<S: Serializer>(blocks: &[Block], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(std::mem::size_of_val(blocks)))?;
        for word in blocks.iter().flat_map(|b| b.0) {
            for byte in word.to_le_bytes() {
                seq.serialize_element(&byte)?;
            }
        }
        seq.end()
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Box<[Block]>, D::Error> {
        let bytes = Vec::<u8>::deserialize(d)?;
        if bytes.is_empty() || bytes.len() % 64 != 0 {
            return Err(D::Error::invalid_length(bytes.len(), &"a positive multiple of 64 bytes"));
        }
        Ok(bytes
            .chunks_exact(64)
            .map(|line| {
                let mut block = Block::default();
                for (word, b) in block.0.iter_mut().zip(line.chunks_exact(8)) {
                    *word = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
                }
                block
            })
            .collect())
    }
}

/// Builds the filter of one bucket at a location in steps of a bounded number of keys, so the
/// location keeps processing records in between (the runtime interleaves steps with its input;
/// the simulator runs one to the end). Key-only reads: no value is touched.
#[derive(Clone, Debug)]
pub struct FilterBuild<P> {
    bucket: BucketId,
    after: Option<P>,
    hashes: Vec<u64>,
}

impl<P: Clone> FilterBuild<P> {
    /// A build of `bucket`'s filter from its start.
    pub fn new(bucket: BucketId) -> Self {
        Self { bucket, after: None, hashes: Vec::new() }
    }

    /// Reads up to `max` more keys; returns the filter once the bucket's end is reached.
    pub fn step<S: LocationStore<Position = P>>(
        &mut self,
        store: &mut S,
        max: usize,
    ) -> Result<Option<KeyFilter>, S::Error> {
        let page = store.filter_keys_after(self.bucket, self.after.as_ref(), max.max(1))?;
        self.hashes.extend(page.keys.iter().map(|k| key_hash(k)));
        if let Some(last) = page.last {
            self.after = Some(last);
        }
        if page.end {
            return Ok(Some(KeyFilter::build(std::mem::take(&mut self.hashes))));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_round_trips_and_keeps_every_member() {
        assert_eq!(std::mem::align_of::<Block>(), 64, "a block is one cache line");
        for n in [0u64, 1, 2, 3, 10, 1000, 100_000] {
            let hashes: Vec<u64> = (0..n).map(|i| key_hash(&i.to_le_bytes())).collect();
            let filter = KeyFilter::build(hashes.iter().chain(hashes.iter()).copied().collect());
            assert_eq!(filter.keys(), n);
            let bytes = koala_types::encode(&filter).expect("encode");
            let back: KeyFilter = koala_types::decode(&bytes).expect("decode");
            assert_eq!(back, filter);
            assert!(hashes.iter().all(|&h| back.contains(h)), "n = {n}: a member is missing");
            if n >= 1000 {
                let per_key = filter.approx_bytes() as f64 / n as f64;
                assert!(per_key < 1.57, "n = {n}: {per_key} bytes per key");
                assert!(
                    bytes.len() < filter.approx_bytes() + 16,
                    "n = {n}: {} bytes on the wire",
                    bytes.len()
                );
            }
        }
        assert!(!KeyFilter::build(vec![]).contains(key_hash(b"k")));
    }

    #[test]
    fn false_positives_are_about_four_in_a_thousand() {
        let filter = KeyFilter::build((0..100_000u64).map(|i| key_hash(&i.to_le_bytes())).collect());
        let strangers = 1_000_000u64;
        let positives = (1u64 << 40..(1 << 40) + strangers)
            .filter(|i| filter.contains(key_hash(&i.to_le_bytes())))
            .count();
        let rate = positives as f64 / strangers as f64;
        assert!((0.002..0.006).contains(&rate), "false-positive rate {rate}");
    }

    #[test]
    fn a_filter_of_no_whole_block_is_refused() {
        let filter = KeyFilter::build(vec![key_hash(b"k")]);
        let mut bytes = koala_types::encode(&filter).expect("encode");
        // Postcard: `keys` (1) and the variant (1) are one byte each, then the length (64).
        assert_eq!(bytes.get(2), Some(&64));
        bytes[2] = 63;
        assert!(koala_types::decode::<KeyFilter>(&bytes).is_err(), "63 bytes");
        let empty = [1u8, 1, 0];
        assert!(koala_types::decode::<KeyFilter>(&empty).is_err(), "no block");
    }
}
