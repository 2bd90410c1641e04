//! Frozen views of a store ([`StateBackend::freeze`]): what an asynchronous checkpoint writes out
//! in the background while its task goes on writing (docs/architecture.md §10).
//!
//! - fjall: an MVCC read snapshot of the task's keyspace (a sequence number; nothing is copied);
//! - the write-back cache: its dirty entries copied into one flat buffer (an overlay, sorted by
//!   the background thread) over the frozen view of the store below — nothing is written back,
//!   so a checkpoint costs the task a copy of its dirty bytes, not a write into the LSM;
//! - any other store (memory, remote): every entry copied out ([`CopiedView`]).
//!
//! A view that copies covers only the buckets it was frozen with (with checkpoints that write
//! only what changed, those the writer will read: [`crate::ChangeTracking`]); asked for another
//! it fails ([`StateError::NotFrozen`]), never reads as empty.

use koala_types::{BucketId, TaskId};

use crate::{StateBackend, StateError, StoredBatch, encode_state_key};

/// The receiver of a frozen bucket: called with each stored key and value, in stored key order.
pub type FrozenSink<'a> = &'a mut dyn FnMut(&[u8], &[u8]) -> Result<(), StateError>;

/// A read-only view of a task's store as of the instant it was frozen; later writes to the store
/// are not in it. Sent to another thread to be written out.
pub trait FrozenView: Send {
    /// Every entry of `bucket` as of the freeze, in stored key order (`encode_state_key`).
    fn scan_bucket(&self, bucket: BucketId, sink: FrozenSink<'_>) -> Result<(), StateError>;

    /// What changed in each bucket group since the store's previous freeze, if its store logs
    /// changes ([`crate::ChangeTracking`]); `None`: unknown, every group may have changed.
    fn changes(&self) -> Option<&crate::changes::Changes> {
        None
    }

    /// Bytes the freeze copied on the task's thread (keys and values; 0: a snapshot, no copy).
    fn copied_bytes(&self) -> u64 {
        0
    }
}

/// The buckets a copying view was frozen with.
#[derive(Clone, Debug)]
pub(crate) struct FrozenBuckets {
    task: TaskId,
    sorted: Vec<BucketId>,
}

impl FrozenBuckets {
    pub(crate) fn new(task: TaskId, buckets: &[BucketId]) -> Self {
        let mut sorted = buckets.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        Self { task, sorted }
    }

    pub(crate) fn contains(&self, bucket: BucketId) -> bool {
        self.sorted.binary_search(&bucket).is_ok()
    }

    /// `bucket` is covered, or the view must not be read for it.
    pub(crate) fn check(&self, bucket: BucketId) -> Result<(), StateError> {
        if self.contains(bucket) { Ok(()) } else { Err(StateError::NotFrozen { task: self.task, bucket }) }
    }
}

/// Whether stored key `key` lies in `bucket`'s range.
fn in_bucket(key: &[u8], bucket: BucketId) -> bool {
    key.len() >= 2 && u16::from_be_bytes([key[0], key[1]]) == bucket
}

/// A view that owns a copy of every entry of the buckets it was frozen with, sorted by stored key.
pub struct CopiedView {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    frozen: FrozenBuckets,
}

impl CopiedView {
    /// Copies every entry of `buckets` of `store` (through its scan).
    pub fn copy<S: StateBackend + ?Sized>(store: &S, buckets: &[BucketId]) -> Result<Self, StateError> {
        let task = store.task();
        let mut entries = Vec::new();
        store.scan_buckets(buckets, 1 << 20, &mut |chunk| {
            for (key, value) in chunk {
                let key = encode_state_key(&key).map_err(|source| StateError::Layout {
                    task,
                    op: "freeze",
                    source,
                })?;
                entries.push((key, value));
            }
            Ok(())
        })?;
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(Self { entries, frozen: FrozenBuckets::new(task, buckets) })
    }
}

impl FrozenView for CopiedView {
    fn scan_bucket(&self, bucket: BucketId, sink: FrozenSink<'_>) -> Result<(), StateError> {
        self.frozen.check(bucket)?;
        let start = self.entries.partition_point(|(k, _)| k.as_slice() < &bucket.to_be_bytes()[..]);
        for (key, value) in self.entries[start..].iter().take_while(|(k, _)| in_bucket(k, bucket)) {
            sink(key, value)?;
        }
        Ok(())
    }

    fn copied_bytes(&self) -> u64 {
        self.entries.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
    }
}

/// One write of an overlay: its stored key's and value's ranges in the buffer (`None`: a delete).
type Span = (std::ops::Range<usize>, Option<std::ops::Range<usize>>);

/// A cache's dirty entries (puts and deletes) of the buckets it was frozen with, over the frozen
/// store below.
pub(crate) struct OverlayView {
    below: Box<dyn FrozenView>,
    overlay: StoredBatch,
    frozen: FrozenBuckets,
    /// The overlay's writes in stored key order; sorted on first use (off the task's thread).
    order: std::sync::OnceLock<Vec<Span>>,
}

impl OverlayView {
    /// `overlay`: the dirty entries of the buckets of `frozen`, no others.
    pub(crate) fn new(below: Box<dyn FrozenView>, overlay: StoredBatch, frozen: FrozenBuckets) -> Self {
        Self { below, overlay, frozen, order: std::sync::OnceLock::new() }
    }

    fn order(&self) -> &[Span] {
        self.order.get_or_init(|| {
            let bytes = self.overlay.bytes();
            let bucket = |span: &Span| u16::from_be_bytes([bytes[span.0.start], bytes[span.0.start + 1]]);
            // By bucket first (a counting sort on the 2-byte prefix), then each bucket's keys:
            // many small sorts, not one of every dirty key.
            let mut counts = vec![0usize; usize::from(u16::MAX) + 2];
            for span in self.overlay.spans() {
                counts[usize::from(bucket(&span)) + 1] += 1;
            }
            for i in 1..counts.len() {
                counts[i] += counts[i - 1];
            }
            let starts = counts.clone();
            let mut order: Vec<Span> = vec![(0..0, None); self.overlay.len()];
            for span in self.overlay.spans() {
                let at = &mut counts[usize::from(bucket(&span))];
                order[*at] = span;
                *at += 1;
            }
            for w in starts.windows(2).filter(|w| w[1] - w[0] > 1) {
                // A key is in the overlay once (the cache holds one entry per key).
                order[w[0]..w[1]].sort_unstable_by(|a, b| bytes[a.0.clone()].cmp(&bytes[b.0.clone()]));
            }
            order
        })
    }
}

/// Hands write `span` of `bytes` to `sink` (a delete hands nothing).
fn emit(bytes: &[u8], span: &Span, sink: FrozenSink<'_>) -> Result<(), StateError> {
    match &span.1 {
        Some(value) => sink(&bytes[span.0.clone()], &bytes[value.clone()]),
        None => Ok(()),
    }
}

impl FrozenView for OverlayView {
    fn scan_bucket(&self, bucket: BucketId, sink: FrozenSink<'_>) -> Result<(), StateError> {
        // The overlay holds no other bucket's dirty entries: the store below alone is stale.
        self.frozen.check(bucket)?;
        let bytes = self.overlay.bytes();
        let order = self.order();
        let prefix = bucket.to_be_bytes();
        let first = order.partition_point(|s| bytes[s.0.clone()] < prefix[..]);
        let len = order[first..].iter().take_while(|s| in_bucket(&bytes[s.0.clone()], bucket)).count();
        let mut ours = order[first..first + len].iter().peekable();
        self.below.scan_bucket(bucket, &mut |below_key, value| {
            while let Some(span) = ours.next_if(|s| &bytes[s.0.clone()] < below_key) {
                emit(bytes, span, &mut *sink)?;
            }
            // The overlay's write of the same key replaces the value below.
            if let Some(span) = ours.next_if(|s| &bytes[s.0.clone()] == below_key) {
                return emit(bytes, span, &mut *sink);
            }
            sink(below_key, value)
        })?;
        for span in ours {
            emit(bytes, span, &mut *sink)?;
        }
        Ok(())
    }

    fn copied_bytes(&self) -> u64 {
        self.overlay.bytes().len() as u64
    }
}

/// Only some buckets of a view: the others read as empty. A task over a store shared by every
/// task of its operator (the Remote backend) snapshots only the buckets it owns, so each bucket
/// is in exactly one task's part of a checkpoint.
pub struct OwnedView {
    inner: Box<dyn FrozenView>,
    buckets: std::collections::BTreeSet<BucketId>,
}

impl OwnedView {
    /// `inner` restricted to `buckets`.
    pub fn new(inner: Box<dyn FrozenView>, buckets: impl IntoIterator<Item = BucketId>) -> Self {
        Self { inner, buckets: buckets.into_iter().collect() }
    }
}

impl FrozenView for OwnedView {
    fn scan_bucket(&self, bucket: BucketId, sink: FrozenSink<'_>) -> Result<(), StateError> {
        if self.buckets.contains(&bucket) { self.inner.scan_bucket(bucket, sink) } else { Ok(()) }
    }
}
