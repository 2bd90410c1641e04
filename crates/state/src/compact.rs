//! Keys and values as the in-memory stores hold them — the write-back cache (`cache.rs`) and the
//! memory backend (`memory.rs`): short keys and values inline, so a hash-table lookup is one probe
//! with no pointer to chase and a write allocates nothing.

use koala_types::BucketId;

use crate::{LayoutError, MAX_USER_KEY_LEN, StateKey};

/// A key held in memory: `bucket | state | user key` like the stored key, inline (no heap allocation,
/// no pointer to chase on lookup) when the user key is short, which it is for most operators.
#[derive(Clone, Debug, Eq, PartialOrd, Ord)]
pub(crate) enum CompactKey {
    /// `[bucket (BE, 2), state, user key length, user key …]`, zero padded.
    Inline([u8; INLINE_KEY + 4]),
    /// The encoded key, for user keys longer than [`INLINE_KEY`].
    Heap(Box<[u8]>),
}

/// Longest user key kept inline in a [`CompactKey`].
const INLINE_KEY: usize = 26;

/// The empty key (no bucket, state or user key: never stored), a placeholder to take a key out.
impl Default for CompactKey {
    fn default() -> Self {
        Self::Inline([0; INLINE_KEY + 4])
    }
}

impl CompactKey {
    pub(crate) fn new(key: &StateKey) -> Self {
        if key.key.len() <= INLINE_KEY {
            let mut bytes = [0u8; INLINE_KEY + 4];
            bytes[..2].copy_from_slice(&key.bucket.to_be_bytes());
            bytes[2] = key.state;
            bytes[3] = key.key.len() as u8;
            bytes[4..4 + key.key.len()].copy_from_slice(&key.key);
            Self::Inline(bytes)
        } else {
            let mut bytes = Vec::with_capacity(key.encoded_len());
            bytes.extend_from_slice(&key.bucket.to_be_bytes());
            bytes.push(key.state);
            bytes.extend_from_slice(&key.key);
            Self::Heap(bytes.into_boxed_slice())
        }
    }

    /// The hashed and compared bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Self::Inline(b) => &b[..4 + usize::from(b[3])],
            Self::Heap(b) => b,
        }
    }

    pub(crate) fn bucket(&self) -> BucketId {
        let b = self.bytes();
        BucketId::from_be_bytes([b[0], b[1]])
    }

    pub(crate) fn to_state_key(&self) -> StateKey {
        let b = self.bytes();
        let user = match self {
            Self::Inline(_) => &b[4..],
            Self::Heap(_) => &b[3..],
        };
        StateKey { bucket: self.bucket(), state: b[2], key: user.to_vec() }
    }

    /// Heap bytes beyond the inline size.
    pub(crate) fn heap_len(&self) -> usize {
        match self {
            Self::Inline(_) => 0,
            Self::Heap(b) => b.len(),
        }
    }

    /// The key's hash ([`KeyHash`]), as the cache's and the memory backend's tables and the
    /// cache's written-keys filters use it: computed once per key and passed along.
    pub(crate) fn hash_value(&self) -> u64 {
        use std::hash::BuildHasher;
        KeyHash::default().hash_one(self)
    }

    /// Appends the stored key (`encode_state_key`'s bytes) to `out`.
    pub(crate) fn put_stored(&self, out: &mut Vec<u8>) {
        let b = self.bytes();
        match self {
            Self::Inline(_) => {
                out.extend_from_slice(&b[..3]);
                out.extend_from_slice(&b[4..]);
            }
            Self::Heap(_) => out.extend_from_slice(b),
        }
    }
}

/// Byte-wise equality, as derived, but an inline key compares as two overlapping 16-byte words:
/// the derived `[u8; 30]` comparison called `memcmp`, the top symbol of the cached
/// sliding-window bench's aggregate task (every hash-table probe compares keys).
impl PartialEq for CompactKey {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Inline(a), Self::Inline(b)) => inline_words(a) == inline_words(b),
            (Self::Heap(a), Self::Heap(b)) => a == b,
            _ => false,
        }
    }
}

/// The inline bytes as two words, bytes 0..16 and 14..30.
#[inline]
fn inline_words(bytes: &[u8; INLINE_KEY + 4]) -> (u128, u128) {
    const { assert!(INLINE_KEY + 4 <= 32 && INLINE_KEY + 4 >= 16) };
    let (mut low, mut high) = ([0u8; 16], [0u8; 16]);
    low.copy_from_slice(&bytes[..16]);
    high.copy_from_slice(&bytes[INLINE_KEY + 4 - 16..]);
    (u128::from_ne_bytes(low), u128::from_ne_bytes(high))
}

impl std::hash::Hash for CompactKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.bytes());
    }
}

/// The hasher of compact keys (the runtime's key hash: fast, not DoS-resistant; keys are ours).
pub(crate) type KeyHash = koala_types::KeyHashBuilder;

/// A value held in memory, inline when short (a counter, an accumulator).
#[derive(Debug)]
pub(crate) enum CompactValue {
    /// Known to be absent (read as missing, or deleted).
    Absent,
    /// Length and bytes.
    Inline(u8, [u8; INLINE_VALUE]),
    /// A boxed slice, not a `Vec`: 16 bytes, so a value takes 24 and a cache entry one cache
    /// line (`cache.rs`, `Line`).
    Heap(Box<[u8]>),
}

/// Longest value kept inline in a [`CompactValue`].
const INLINE_VALUE: usize = 22;

impl CompactValue {
    pub(crate) fn new(value: Option<Vec<u8>>) -> Self {
        match value {
            None => Self::Absent,
            Some(v) if v.len() <= INLINE_VALUE => {
                let mut bytes = [0u8; INLINE_VALUE];
                bytes[..v.len()].copy_from_slice(&v);
                Self::Inline(v.len() as u8, bytes)
            }
            Some(v) => Self::Heap(v.into_boxed_slice()),
        }
    }

    pub(crate) fn get(&self) -> Option<Vec<u8>> {
        match self {
            Self::Absent => None,
            Self::Inline(len, bytes) => Some(bytes[..usize::from(*len)].to_vec()),
            Self::Heap(v) => Some(v.to_vec()),
        }
    }

    /// The value's bytes, `None` if absent.
    pub(crate) fn as_slice(&self) -> Option<&[u8]> {
        match self {
            Self::Absent => None,
            Self::Inline(len, bytes) => Some(&bytes[..usize::from(*len)]),
            Self::Heap(v) => Some(v),
        }
    }

    pub(crate) fn is_present(&self) -> bool {
        !matches!(self, Self::Absent)
    }

    pub(crate) fn heap_len(&self) -> usize {
        match self {
            Self::Heap(v) => v.len(),
            _ => 0,
        }
    }
}

impl CompactKey {
    /// The state id and user key: the stored order within a bucket (`bucket | state | user key`).
    pub(crate) fn stored_order(&self) -> (u8, &[u8]) {
        let b = self.bytes();
        match self {
            Self::Inline(_) => (b[2], &b[4..]),
            Self::Heap(_) => (b[2], &b[3..]),
        }
    }
}

/// Rejects a user key the stored layout cannot hold (the same limit as the LSM's).
pub(crate) fn check_key(key: &StateKey) -> Result<(), LayoutError> {
    if key.key.len() > MAX_USER_KEY_LEN {
        return Err(LayoutError::KeyTooLong { len: key.key.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inline keys differing in any one byte differ, whichever of the two compared words holds it.
    #[test]
    fn keys_are_equal_only_byte_for_byte() {
        let base = StateKey::new(3, 1, (0..INLINE_KEY as u8).collect::<Vec<u8>>());
        let a = CompactKey::new(&base);
        assert_eq!(a, CompactKey::new(&base.clone()));
        for at in 0..INLINE_KEY {
            let mut other = base.clone();
            other.key[at] ^= 1;
            assert_ne!(a, CompactKey::new(&other), "user key byte {at}");
        }
        assert_ne!(a, CompactKey::new(&StateKey::new(4, 1, base.key.clone())), "bucket");
        assert_ne!(a, CompactKey::new(&StateKey::new(3, 2, base.key.clone())), "state");
        let shorter = StateKey::new(3, 1, base.key[..INLINE_KEY - 1].to_vec());
        assert_ne!(a, CompactKey::new(&shorter), "length");
        let long = StateKey::new(3, 1, vec![7; INLINE_KEY + 1]);
        assert_eq!(CompactKey::new(&long), CompactKey::new(&long.clone()));
        assert_ne!(CompactKey::new(&long), a);
    }
}
