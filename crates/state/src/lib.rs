//! Keyed state stores of the tasks of stateful operators (docs/architecture.md §5).
//!
//! In the Koala protocol the *location* of a key's state is a task: every task of a stateful
//! operator has its own store, a [`StateBackend`]. All tasks of one worker process share one
//! [`StateEnv`], e.g. one fjall database directory with one keyspace per task ([`FjallEnv`], the
//! default, normally behind a bounded write-back cache per task, [`CachedEnv`]) or an in-memory
//! map per task ([`MemoryEnv`]), or — for the Remote baseline — state servers shared by every
//! task of an operator ([`RemoteEnv`], [`StateServer`]; docs/architecture.md §5, "Remote state").
//!
//! After a failure a task's store may be a [`lazy::LazyBackend`]: its buckets are loaded from the
//! checkpoint on first access while a background thread loads the rest.
//!
//! Inside a store, keys are laid out as `bucket | state id | user key` (see [`encode_state_key`]),
//! so a bucket is one contiguous key range that can be scanned in chunks (to migrate it) and
//! deleted (once its new owner has it).
//!
//! ```
//! use koala_state::{MemoryEnv, StateEnv, StateKey, StateWrite};
//! use koala_types::{OperatorId, TaskId};
//!
//! # fn main() -> Result<(), koala_state::StateError> {
//! let env = MemoryEnv::new();
//! let store = env.open_task(TaskId::new(OperatorId(1), 0))?;
//! let counter = StateKey::new(7, 0, b"user-42".to_vec());
//! store.write_many(vec![StateWrite::Put(counter.clone(), b"3".to_vec())])?;
//! assert_eq!(store.get_many(&[counter])?, vec![Some(b"3".to_vec())]);
//!
//! // Migrate bucket 7: stream it out in chunks, then drop it here.
//! let mut moved = Vec::new();
//! let bytes = store.scan_buckets(&[7], 64 * 1024, &mut |chunk| {
//!     moved.extend(chunk);
//!     Ok(())
//! })?;
//! store.delete_buckets(&[7])?;
//! assert_eq!((moved.len(), bytes), (1, 3 + 7 + 1));
//! # Ok(())
//! # }
//! ```

mod cache;
pub mod changes;
mod compact;
mod discard;
mod error;
mod fjall_env;
mod frozen;
mod key;
pub mod lazy;
mod memory;
pub mod remote;
mod scan;
pub mod snapshot;
mod written_keys;

use std::ops::Bound;

use koala_types::{BucketId, TaskId};

pub use cache::{CachedBackend, CachedEnv, ENTRY_OVERHEAD_BYTES, MIN_BUDGET_BYTES};
pub use changes::ChangeTracking;
pub use discard::DiscardEnv;
pub use error::{BackendError, StateError};
pub use fjall_env::{FjallBackend, FjallConfig, FjallEnv};
pub use frozen::{CopiedView, FrozenSink, FrozenView, OwnedView};
pub use key::{
    KEY_HEADER_LEN, LayoutError, MAX_USER_KEY_LEN, MAX_VALUE_LEN, StateId, StateKey, bucket_bounds,
    decode_state_key, encode_state_key,
};
pub use memory::{MemoryBackend, MemoryEnv};
pub use remote::{RemoteEnv, StateServer};

/// One change of a write batch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StateWrite {
    /// Sets the value of a key (inserting or overwriting).
    Put(StateKey, Vec<u8>),
    /// Removes a key; removing a missing key is not an error.
    Delete(StateKey),
}

impl StateWrite {
    /// The key this write changes.
    pub fn key(&self) -> &StateKey {
        match self {
            Self::Put(key, _) | Self::Delete(key) => key,
        }
    }
}

/// Writes in stored form (`bucket | state | user key`, see [`encode_state_key`]) in one flat
/// buffer: what the write-back cache hands its store, so a write-back allocates nothing per entry.
#[derive(Debug, Default)]
pub struct StoredBatch {
    bytes: Vec<u8>,
    /// Per write: its stored key's end in `bytes`, and its value's end (`None`: a delete).
    /// Each key starts where the previous write ends.
    ends: Vec<(usize, Option<usize>)>,
}

impl StoredBatch {
    /// Appends a put of `value` (`Some`) or a delete (`None`) of the stored key `key`, written
    /// by `put_key` into the buffer it is given.
    pub fn push(&mut self, put_key: impl FnOnce(&mut Vec<u8>), value: Option<&[u8]>) {
        put_key(&mut self.bytes);
        let key_end = self.bytes.len();
        let value_end = value.map(|value| {
            self.bytes.extend_from_slice(value);
            self.bytes.len()
        });
        self.ends.push((key_end, value_end));
    }

    /// The writes in the order pushed: stored key and value (`None`: delete).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        let mut start = 0;
        self.ends.iter().map(move |&(key_end, value_end)| {
            let key = &self.bytes[start..key_end];
            start = value_end.unwrap_or(key_end);
            (key, value_end.map(|end| &self.bytes[key_end..end]))
        })
    }

    /// Number of writes.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are no writes.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Key and value bytes (as scans count them).
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// The buffer the writes are in.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Each write's stored key and value (`None`: delete) as ranges of [`Self::bytes`].
    pub(crate) fn spans(
        &self,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, Option<std::ops::Range<usize>>)> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&(key_end, value_end)| {
            let key = start..key_end;
            start = value_end.unwrap_or(key_end);
            (key, value_end.map(|end| key_end..end))
        })
    }
}

/// The receiver of a bucket scan: called once per chunk; an error stops the scan.
pub type ScanSink<'a> = &'a mut dyn FnMut(Vec<(StateKey, Vec<u8>)>) -> Result<(), StateError>;

/// The keyed state store of one task.
///
/// Handles are `Sync` so a task may share its store with a background write-buffer flusher.
pub trait StateBackend: Send + Sync {
    /// The task this store belongs to.
    fn task(&self) -> TaskId;

    /// Reads `keys`; the result has one entry per key, in the same order (`None` = missing).
    fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError>;

    /// Applies `writes` as one atomic batch: all or none become visible. When a key appears more
    /// than once, the last write wins. Not fsynced; durability comes from [`StateEnv::persist`].
    fn write_many(&self, writes: Vec<StateWrite>) -> Result<(), StateError>;

    /// [`write_many`](Self::write_many) of writes in stored form, in their order (last write
    /// of a key wins). The default decodes them; fjall writes the bytes as they are.
    fn write_stored(&self, writes: &StoredBatch) -> Result<(), StateError> {
        let task = self.task();
        let decoded = writes
            .iter()
            .map(|(key, value)| {
                let key = decode_state_key(key).map_err(|source| StateError::Layout {
                    task,
                    op: "write_stored",
                    source,
                })?;
                Ok(match value {
                    Some(value) => StateWrite::Put(key, value.to_vec()),
                    None => StateWrite::Delete(key),
                })
            })
            .collect::<Result<Vec<_>, StateError>>()?;
        self.write_many(decoded)
    }

    /// Streams every entry of `buckets` to `sink` in key order (ascending bucket, then state id,
    /// then user key), in chunks of at most `chunk_bytes` (an entry counts
    /// `key.encoded_len() + value.len()` bytes; an entry larger than `chunk_bytes` is sent alone;
    /// chunks may span buckets; empty chunks are not sent). Returns the total bytes streamed.
    /// Repeated buckets are scanned once. Each bucket is read from a consistent snapshot.
    fn scan_buckets(
        &self,
        buckets: &[BucketId],
        chunk_bytes: usize,
        sink: ScanSink<'_>,
    ) -> Result<u64, StateError>;

    /// Up to `limit` keys of `bucket` that sort after `after` (from the bucket's start if `None`),
    /// in key order, without reading values: a resumable key-only scan. A caller that removes the
    /// keys it was given and continues after the last one never walks them (or their tombstones)
    /// again, so draining a bucket costs O(its keys), not O(keys × pulls). `after` need not be
    /// stored; one of an earlier bucket starts at the bucket's start, one of a later bucket
    /// yields nothing. Fewer than `limit` keys means the scan reached the end of the bucket.
    fn bucket_keys_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError>;

    /// [`Self::bucket_keys_after`], except that it may also list keys that hold nothing any more
    /// (never fewer): what a membership filter is built from, where a key listed in vain costs
    /// one fetch answered "not here", and ruling it out may cost a random memory read per key
    /// (the cache's dirty lists: one lookup each in a table of gigabytes). Paging and the
    /// meaning of a short page are the same. By default, the exact scan.
    fn bucket_key_candidates_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        self.bucket_keys_after(bucket, after, limit)
    }

    /// Removes every entry of `buckets`. Idempotent, but not atomic: a failure may leave a bucket
    /// partly deleted (recovery from a checkpoint discards the store anyway).
    fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError>;

    /// A cheap estimate of the number of entries, for metrics. Exact for [`MemoryEnv`]; for
    /// [`FjallEnv`] it counts stored versions, so it over-counts overwritten and deleted keys
    /// until compaction removes the old versions.
    fn approximate_len(&self) -> Result<u64, StateError>;

    /// Whether this store's key space is shared by every task of the operator (the remote
    /// backend, [`RemoteEnv`]): a key written by one task is read by whichever task owns its
    /// bucket later, so a reconfiguration moves ownership, not state. `false` for stores that
    /// belong to one task (fjall, memory), whose state must be moved.
    fn is_shared(&self) -> bool {
        false
    }

    /// The task gives up `buckets` while their state stays in the shared store (the `remote`
    /// protocol, docs/protocols.md §7.1): writes back everything it buffered for them and forgets
    /// its local copies, so the next owner reads every write and a bucket that comes back later
    /// is never read stale. Returns the bytes written back. Only shared stores
    /// ([`is_shared`](Self::is_shared)) support it; the others refuse with
    /// [`StateError::Unsupported`] and change nothing (their state must be moved instead).
    fn release_buckets(&self, buckets: &[BucketId]) -> Result<u64, StateError> {
        let _ = buckets;
        Err(StateError::Unsupported { task: self.task(), op: "release_buckets" })
    }

    /// A view of `buckets` of the store as of now that later writes do not change, to be
    /// written out on another thread (an asynchronous checkpoint, docs/architecture.md §10). By
    /// default every entry of those buckets is copied ([`CopiedView`]); fjall takes an MVCC read
    /// snapshot (of every bucket: the view is read per bucket), and the write-back cache copies
    /// only the dirty entries of `buckets` over the view of the store below. A copying view read
    /// for another bucket fails ([`StateError::NotFrozen`]); fjall's may show every bucket, and a
    /// reader that must not see other buckets filters (`OwnedView`).
    fn freeze(&self, buckets: &[BucketId]) -> Result<Box<dyn FrozenView>, StateError> {
        Ok(Box::new(CopiedView::copy(self, buckets)?))
    }

    /// Lookups a cache in front of this store answered and did not, since the store was opened
    /// (`None`: no cache). The runtime reports them per second (`cache_hits`, `cache_misses`).
    fn cache_counts(&self) -> Option<CacheCounts> {
        None
    }

    /// Bytes the task holds outside the store that its memory share also covers (a Koala task's
    /// key lookup table): a cache charges them against its budget, up to half of it, and evicts
    /// to make room. Without a cache, nothing.
    fn charge_outside(&self, bytes: usize) {
        let _ = bytes;
    }
}

/// Cumulative lookups of a task's cache ([`StateBackend::cache_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Keys found in the cache (cached or on their way below): no read below.
    pub hits: u64,
    /// Keys not in the cache: read below, or known absent by its written-keys filter.
    pub misses: u64,
}

/// The set of task stores of one worker process.
pub trait StateEnv: Send + Sync {
    /// Opens (creating if needed) the store of `task`. Opening a task twice yields two handles on
    /// the same data.
    fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError>;

    /// Deletes the store of a released task. Handles still open on it fail with
    /// [`StateError::Dropped`]; opening the task again yields an empty store. Dropping a task
    /// that has no store is not an error.
    fn drop_task(&self, task: TaskId) -> Result<(), StateError>;

    /// Makes every write acknowledged so far durable on disk (fsync); checkpoints call this.
    fn persist(&self) -> Result<(), StateError>;

    /// Gives `task`'s cache a budget of `bytes` (the task's share of its worker's memory budget,
    /// docs/architecture.md §5): a cache opened later starts with it, an open one is resized
    /// now — a shrink evicts at once, its dirty victims written back like any eviction, never
    /// dropped. Returns whether a cache took it (false: this env has no cache).
    fn set_cache_budget(&self, task: TaskId, bytes: usize) -> Result<bool, StateError> {
        let _ = (task, bytes);
        Ok(false)
    }
}

/// Encodes a write, rejecting keys and values the layout cannot hold.
pub(crate) fn encode_write(write: StateWrite) -> Result<(Vec<u8>, Option<Vec<u8>>), LayoutError> {
    match write {
        StateWrite::Put(key, value) => {
            key::check_value(&value)?;
            Ok((encode_state_key(&key)?, Some(value)))
        }
        StateWrite::Delete(key) => Ok((encode_state_key(&key)?, None)),
    }
}

/// A range of stored (encoded) keys.
pub(crate) type StoredRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// The stored-key range of the keys of `bucket` after `after` ([`StateBackend::bucket_keys_after`]),
/// or `None` if there are none (`after` lies in a later bucket).
pub(crate) fn keys_after_bounds(
    bucket: BucketId,
    after: Option<&StateKey>,
) -> Result<Option<StoredRange>, LayoutError> {
    let (start, end) = bucket_bounds(bucket);
    match after {
        Some(after) if after.bucket == bucket => Ok(Some((Bound::Excluded(encode_state_key(after)?), end))),
        Some(after) if after.bucket > bucket => Ok(None),
        _ => Ok(Some((start, end))),
    }
}
