//! Membership filters of handed-over buckets (docs/protocols.md §6): after a hand-over, the old
//! location builds — in the background, not during the hand-over's pause — an immutable filter of
//! the keys of the bucket it still holds, and the bucket's owner consults it on a local miss. A key
//! outside every filter of its bucket is new: it is created locally, with no round trip and no
//! KLT entry. A filter never has a false negative; a false positive (≈ 2⁻⁸) costs one "not here".
//!
//! A filter built at any time after the hand-over is valid for as long as the location does not own
//! the bucket again: until then the location's keys of the bucket only leave (fetched, pulled),
//! never arrive, so a filter of a later content is a subset of the true content at the hand-over
//! and a superset of everything the location still holds.
//!
//! ```
//! use koala_protocol::koala::{KeyFilter, key_hash};
//! let hashes: Vec<u64> = (0..1000u32).map(|i| key_hash(&i.to_le_bytes())).collect();
//! let filter = KeyFilter::build(hashes.clone());
//! assert!(hashes.iter().all(|&h| filter.contains(h)), "no false negative");
//! let strangers = (1000..101_000u32).filter(|i| filter.contains(key_hash(&i.to_le_bytes()))).count();
//! assert!(strangers < 1000, "about 0.4 % false positives, got {strangers} of 100 000");
//! assert!(filter.approx_bytes() < 1500, "about 1.1 bytes per key");
//! ```

use serde::{Deserialize, Serialize};
use xorf::{BinaryFuse8, BinaryFuse8Ref, DmaSerializable, Filter, FilterRef};

use super::klt::key_hash;
use super::serve::LocationStore;
use koala_types::BucketId;

/// An immutable set of key hashes ([`key_hash`]) with no false negatives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyFilter {
    keys: u64,
    repr: Repr,
}

/// The length of a binary fuse filter's descriptor (seed and segment geometry) in bytes.
const DESCRIPTOR_LEN: usize = <BinaryFuse8 as DmaSerializable>::DESCRIPTOR_LEN;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Repr {
    /// The empty set.
    Empty,
    /// A binary fuse filter with 8-bit fingerprints (≈ 9 bits per key, false positives ≈ 2⁻⁸):
    /// its descriptor and fingerprints as the `xorf` crate lays them out. The descriptor is held
    /// inline, so a lookup reads the three fingerprints and nothing else behind a pointer (on the
    /// wire it is a byte sequence, as before).
    Fuse8 {
        #[serde(with = "descriptor_bytes")]
        descriptor: [u8; DESCRIPTOR_LEN],
        fingerprints: Box<[u8]>,
    },
    /// The sorted hashes themselves (8 bytes per key, exact), if the fuse construction failed.
    Exact(Vec<u64>),
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
        let repr = match BinaryFuse8::try_from(&hashes) {
            Ok(f) => {
                let mut descriptor = [0; DESCRIPTOR_LEN];
                f.dma_copy_descriptor_to(&mut descriptor);
                Repr::Fuse8 { descriptor, fingerprints: f.fingerprints }
            }
            // Construction fails only with bad luck on distinct keys; exact is larger, still right.
            Err(_) => Repr::Exact(hashes),
        };
        Self { keys, repr }
    }

    /// Whether the key with this hash may be in the set (always true if it is).
    #[inline]
    pub fn contains(&self, hash: u64) -> bool {
        match &self.repr {
            Repr::Empty => false,
            Repr::Fuse8 { descriptor, fingerprints } => {
                BinaryFuse8Ref::from_dma(descriptor, fingerprints).contains(&hash)
            }
            Repr::Exact(hashes) => hashes.binary_search(&hash).is_ok(),
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
            Repr::Fuse8 { fingerprints, .. } => fingerprints.len(),
            Repr::Exact(hashes) => hashes.len() * 8,
        }
    }
}

/// A descriptor on the wire: a byte sequence (as a `Vec<u8>` is), held as an array.
mod descriptor_bytes {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::DESCRIPTOR_LEN;

    pub(super) fn serialize<S: Serializer>(d: &[u8; DESCRIPTOR_LEN], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(d)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; DESCRIPTOR_LEN], D::Error> {
        let bytes = Vec::<u8>::deserialize(d)?;
        let len = bytes.len();
        bytes.try_into().map_err(|_| D::Error::invalid_length(len, &"a binary fuse filter descriptor"))
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
        let page = store.keys_after(self.bucket, self.after.as_ref(), max.max(1))?;
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
                let bound = if n >= 100_000 { 1.3 } else { 1.6 };
                assert!(per_key < bound, "n = {n}: {per_key} bytes per key");
                assert!(matches!(filter.repr, Repr::Fuse8 { .. }));
            }
        }
        assert!(!KeyFilter::build(vec![]).contains(key_hash(b"k")));
    }

    /// The descriptor is held inline but encoded as the byte sequence it was before.
    #[test]
    fn the_wire_format_keeps_the_descriptor_a_byte_sequence() {
        #[derive(Serialize)]
        #[serde(rename = "KeyFilter")]
        struct Before {
            keys: u64,
            repr: BeforeRepr,
        }
        #[derive(Serialize)]
        #[serde(rename = "Repr")]
        enum BeforeRepr {
            #[allow(dead_code)]
            Empty,
            Fuse8 {
                descriptor: Vec<u8>,
                fingerprints: Vec<u8>,
            },
        }
        let filter = KeyFilter::build((0..100u32).map(|i| key_hash(&i.to_le_bytes())).collect());
        let Repr::Fuse8 { descriptor, fingerprints } = &filter.repr else { panic!("a fuse filter") };
        let before = Before {
            keys: filter.keys,
            repr: BeforeRepr::Fuse8 { descriptor: descriptor.to_vec(), fingerprints: fingerprints.to_vec() },
        };
        assert_eq!(koala_types::encode(&filter).ok(), koala_types::encode(&before).ok());
        let mut short = koala_types::encode(&before).expect("encode");
        // Postcard: `keys` (100) and the variant (1) are one varint byte each, then the
        // descriptor's length.
        assert_eq!(short.get(2), Some(&(DESCRIPTOR_LEN as u8)));
        short[2] = 19;
        assert!(koala_types::decode::<KeyFilter>(&short).is_err(), "a descriptor of 19 bytes");
    }
}
