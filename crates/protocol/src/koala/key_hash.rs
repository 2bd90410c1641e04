//! The key hashes the lookup table, its filters and hand-overs are keyed by, and the hasher
//! that takes them as they are.

use std::hash::Hasher;

use koala_types::{BucketId, bucket_of_hash, placement_hash};

/// Stable 64-bit hash of a key's canonical bytes: the splitmix64 finaliser of its
/// [`placement_hash`] (xxh3-64, of which its bucket is the remainder), so the hashes of one
/// bucket's keys do not share their low bits.
///
/// It is part of the hand-over wire format and of checkpoints, so it never changes. A record
/// entering a task is hashed once: its bucket and this hash both come from
/// the one placement hash ([`bucket_and_key_hash`]).
///
/// ```
/// use koala_protocol::koala::{key_hash, key_hash_of};
/// assert_eq!(key_hash(b"k"), key_hash(b"k"));
/// assert_ne!(key_hash(b"k"), key_hash(b"l"));
/// assert_eq!(key_hash(b"k"), key_hash_of(koala_types::placement_hash(b"k")));
/// ```
pub fn key_hash(key: &[u8]) -> u64 {
    key_hash_of(placement_hash(key))
}

/// The bucket of `key` ([`koala_types::bucket_of`]) and its [`key_hash`], from one hash of it.
#[inline]
pub fn bucket_and_key_hash(key: &[u8], num_buckets: u16) -> (BucketId, u64) {
    let placement = placement_hash(key);
    (bucket_of_hash(placement, num_buckets), key_hash_of(placement))
}

/// [`key_hash`] of the key whose [`placement_hash`] is `placement`.
#[inline]
pub fn key_hash_of(placement: u64) -> u64 {
    let mut h = placement;
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Keys of the exception maps are already hashes; do not hash them again.
#[derive(Default)]
pub(crate) struct Prehashed(u64);

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
