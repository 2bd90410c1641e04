//! The physical key layout of a task's state store (docs/architecture.md §5).
//!
//! A stored key is `bucket (u16 big-endian) | state id (u8) | user key bytes`. Because the bucket
//! comes first and is big-endian, byte order of stored keys equals the order of
//! `(bucket, state, key)` and every bucket is one contiguous, disjoint key range: moving or
//! dropping a bucket (stop-and-restart, progressive migration) is a range scan or range delete.
//!
//! The operator is not part of the key: every task has its own store (a fjall keyspace named
//! after the `TaskId`), so the operator and task index are implied by the store the key lives in.

use std::ops::Bound;

use koala_types::BucketId;

/// Identifies one piece of state of an operator (an operator may keep several, e.g. the two
/// sides of a join); numbered by the operator.
pub type StateId = u8;

/// Bytes in front of the user key: bucket (2) + state id (1).
pub const KEY_HEADER_LEN: usize = 3;

/// Longest user key a store accepts (the LSM limits whole keys to `u16::MAX` bytes).
pub const MAX_USER_KEY_LEN: usize = u16::MAX as usize - KEY_HEADER_LEN;

/// Longest value a store accepts (the LSM limits values to `u32::MAX` bytes).
pub const MAX_VALUE_LEN: usize = u32::MAX as usize;

/// The logical key of one state entry in a task's store.
///
/// The derived order (bucket, then state, then key bytes) is the order of the encoded keys,
/// hence the order in which scans return entries.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct StateKey {
    /// The bucket of the record key (`koala_types::bucket_of` of the user key's bytes).
    pub bucket: BucketId,
    /// Which state of the operator this entry belongs to.
    pub state: StateId,
    /// The user key bytes (canonical encoding of the record key, plus e.g. a window start).
    pub key: Vec<u8>,
}

impl StateKey {
    /// The key `key` of state `state` in `bucket`.
    pub fn new(bucket: BucketId, state: StateId, key: impl Into<Vec<u8>>) -> Self {
        Self { bucket, state, key: key.into() }
    }

    /// Length of the stored (encoded) key in bytes.
    pub fn encoded_len(&self) -> usize {
        KEY_HEADER_LEN + self.key.len()
    }
}

/// A key or value that does not fit the stored layout.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The user key is longer than [`MAX_USER_KEY_LEN`].
    #[error("user key of {len} bytes exceeds the limit of {MAX_USER_KEY_LEN} bytes")]
    KeyTooLong {
        /// Length of the rejected user key.
        len: usize,
    },
    /// The value is longer than [`MAX_VALUE_LEN`].
    #[error("value of {len} bytes exceeds the limit of {MAX_VALUE_LEN} bytes")]
    ValueTooLong {
        /// Length of the rejected value.
        len: usize,
    },
    /// A stored key is shorter than the header; the store is corrupt or not ours.
    #[error("stored key of {len} bytes is shorter than the {KEY_HEADER_LEN}-byte header")]
    Truncated {
        /// Length of the malformed stored key.
        len: usize,
    },
}

/// Encodes `key` as `bucket (u16 BE) | state | user key`.
///
/// # Errors
/// [`LayoutError::KeyTooLong`] if the user key exceeds [`MAX_USER_KEY_LEN`].
pub fn encode_state_key(key: &StateKey) -> Result<Vec<u8>, LayoutError> {
    if key.key.len() > MAX_USER_KEY_LEN {
        return Err(LayoutError::KeyTooLong { len: key.key.len() });
    }
    let mut bytes = Vec::with_capacity(key.encoded_len());
    bytes.extend_from_slice(&key.bucket.to_be_bytes());
    bytes.push(key.state);
    bytes.extend_from_slice(&key.key);
    Ok(bytes)
}

/// Decodes a stored key written by [`encode_state_key`].
///
/// # Errors
/// [`LayoutError::Truncated`] if `bytes` is shorter than the header.
pub fn decode_state_key(bytes: &[u8]) -> Result<StateKey, LayoutError> {
    match bytes {
        [b0, b1, state, key @ ..] => {
            Ok(StateKey { bucket: BucketId::from_be_bytes([*b0, *b1]), state: *state, key: key.to_vec() })
        }
        _ => Err(LayoutError::Truncated { len: bytes.len() }),
    }
}

/// The range of stored keys that belong to `bucket`: `[bucket, bucket + 1)` on the 2-byte prefix.
pub fn bucket_bounds(bucket: BucketId) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let start = Bound::Included(bucket.to_be_bytes().to_vec());
    let end = match bucket.checked_add(1) {
        Some(next) => Bound::Excluded(next.to_be_bytes().to_vec()),
        None => Bound::Unbounded,
    };
    (start, end)
}

/// Rejects values the LSM cannot store, before any write of a batch is applied.
pub(crate) fn check_value(value: &[u8]) -> Result<(), LayoutError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(LayoutError::ValueTooLong { len: value.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::ops::RangeBounds;

    use proptest::prelude::*;

    use super::*;

    fn state_key() -> impl Strategy<Value = StateKey> {
        (
            prop_oneof![Just(0u16), Just(u16::MAX), Just(255), Just(256), any::<u16>()],
            any::<u8>(),
            proptest::collection::vec(any::<u8>(), 0..12),
        )
            .prop_map(|(bucket, state, key)| StateKey { bucket, state, key })
    }

    proptest! {
        #[test]
        fn round_trip(key in state_key()) {
            let bytes = encode_state_key(&key).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(bytes.len(), key.encoded_len());
            prop_assert_eq!(decode_state_key(&bytes), Ok(key));
        }

        /// Byte order of encodings equals the logical order, so each bucket (and each
        /// (bucket, state)) is a contiguous run of stored keys.
        #[test]
        fn encoding_preserves_order(a in state_key(), b in state_key()) {
            let ea = encode_state_key(&a).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let eb = encode_state_key(&b).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(ea.cmp(&eb), a.cmp(&b));
        }

        /// A key lies in its own bucket's range and in no other bucket's range.
        #[test]
        fn bucket_ranges_are_disjoint(key in state_key(), other in any::<u16>()) {
            let bytes = encode_state_key(&key).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(bucket_bounds(key.bucket).contains(&bytes));
            if other != key.bucket {
                prop_assert!(!bucket_bounds(other).contains(&bytes));
            }
        }

        /// Consecutive bucket ranges touch: the end of bucket b is the start of bucket b + 1.
        #[test]
        fn bucket_ranges_are_contiguous(bucket in 0..u16::MAX) {
            let (_, end) = bucket_bounds(bucket);
            let (start, _) = bucket_bounds(bucket + 1);
            match (end, start) {
                (Bound::Excluded(end), Bound::Included(start)) => prop_assert_eq!(end, start),
                other => prop_assert!(false, "unexpected bounds {:?}", other),
            }
        }
    }

    #[test]
    fn last_bucket_is_unbounded_above() {
        assert_eq!(bucket_bounds(u16::MAX).1, Bound::Unbounded);
    }

    #[test]
    fn rejects_oversized_and_truncated_keys() {
        let long = StateKey::new(1, 0, vec![0; MAX_USER_KEY_LEN + 1]);
        assert_eq!(encode_state_key(&long), Err(LayoutError::KeyTooLong { len: MAX_USER_KEY_LEN + 1 }));
        assert!(encode_state_key(&StateKey::new(1, 0, vec![0; MAX_USER_KEY_LEN])).is_ok());
        assert_eq!(decode_state_key(&[0, 1]), Err(LayoutError::Truncated { len: 2 }));
    }
}
