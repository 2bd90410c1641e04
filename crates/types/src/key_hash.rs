//! A fast hasher for the per-batch and per-task maps keyed by record keys (the record path hashes
//! every key of every record several times; SipHash, the std default, showed up in `perf`).
//!
//! Not DoS-resistant: keys are chosen by the job's data, and a key set crafted to collide would
//! only slow that job down, as skew does.
//!
//! ```
//! let mut counts: koala_types::KeyHashMap<Vec<u8>, u32> = Default::default();
//! *counts.entry(b"k".to_vec()).or_default() += 1;
//! assert_eq!(counts.get(b"k".as_slice()), Some(&1));
//! ```

use std::hash::{BuildHasherDefault, Hasher};

/// xxh3-64 over the written bytes, chained through the seed; integers are mixed in cheaply.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0);
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // One multiply of a 64-bit mixing constant: enough, as the bytes that follow go through xxh3.
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Builds [`KeyHasher`]s.
pub type KeyHashBuilder = BuildHasherDefault<KeyHasher>;

/// A `HashMap` with [`KeyHasher`].
pub type KeyHashMap<K, V> = std::collections::HashMap<K, V, KeyHashBuilder>;
