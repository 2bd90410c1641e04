//! Serving a fetch at a location (paper §3.3, §3.4; docs/protocols.md §6): the requested keys'
//! state, deleted as it is answered (one live copy), plus — for progressive migration — up to N
//! other keys of the requester's buckets, and which of those buckets hold nothing here any more.
//! The runtime (over the task's LSM store) and the simulator (over a map) both answer through
//! [`serve_fetch`]; only [`LocationStore`] differs.
//!
//! Progressive pulls walk each bucket with a key-only cursor, kept per (requester, bucket) in
//! [`PullCursors`]: a pull continues after the last key the previous one handed out, so it reads
//! O(N) keys, not everything the bucket still holds, and (until it wraps around, below) not the
//! keys it already handed out, whose tombstones an LSM would otherwise walk on every pull. The cursor is only a hint of where to resume: keys may be written behind it, or
//! fetched on demand ahead of it. A bucket is reported exhausted only when one pull has read it
//! from its start to its end and hands out everything it found, so a key not yet pulled is never
//! written off (it stays fetchable on demand, since the requester's KLT still points here). When a
//! cursor reaches the end of its bucket, the same pull wraps around to the bucket's start; on an
//! LSM that walks the tombstones of the pass once, O(1) per key amortised.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::ops::Bound;
//! use koala_protocol::koala::{
//!     Answered, ExtraKeys, FetchRequest, KeyPage, LocationStore, PullCursors, serve_fetch,
//! };
//! use koala_types::{OperatorId, TaskId};
//!
//! /// Keys are one byte; the bucket is the key modulo 4.
//! struct Map(BTreeMap<Vec<u8>, Vec<u8>>);
//! impl LocationStore for Map {
//!     type Error = std::convert::Infallible;
//!     type Position = Vec<u8>;
//!     fn take(&mut self, keys: &[Vec<u8>]) -> Result<Answered, Self::Error> {
//!         Ok(keys.iter().map(|k| (k.clone(), self.0.remove(k))).collect())
//!     }
//!     fn keys_after(&mut self, bucket: u16, after: Option<&Vec<u8>>, max: usize)
//!         -> Result<KeyPage<Vec<u8>>, Self::Error> {
//!         let from = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.clone()));
//!         let keys: Vec<Vec<u8>> = self.0.range((from, Bound::Unbounded))
//!             .map(|(k, _)| k.clone())
//!             .filter(|k| u16::from(k[0] % 4) == bucket)
//!             .take(max)
//!             .collect();
//!         Ok(KeyPage { end: keys.len() < max, last: keys.last().cloned(), keys })
//!     }
//! }
//! let mut here = Map(BTreeMap::from([(vec![1], vec![10]), (vec![5], vec![50]), (vec![9], vec![90])]));
//! let mut cursors = PullCursors::new();
//! let owner = TaskId::new(OperatorId(1), 0);
//! let pull = |id| FetchRequest { id, keys: vec![], extra: Some(ExtraKeys { buckets: vec![1], max: 1 }), checkpoint: 0 };
//! let request = FetchRequest { id: 7, keys: vec![vec![1], vec![2]], ..pull(7) };
//! let response = serve_fetch(&mut here, &mut cursors, owner, request).unwrap();
//! assert_eq!(response.values, vec![(vec![1], Some(vec![10])), (vec![2], None)]);
//! assert_eq!(response.extra, vec![(vec![5], vec![50])]);
//! assert!(response.exhausted.is_empty(), "key 9 of bucket 1 is still here");
//! assert_eq!(here.0.len(), 1, "what was answered is gone");
//! let response = serve_fetch(&mut here, &mut cursors, owner, pull(8)).unwrap();
//! assert_eq!(response.extra, vec![(vec![9], vec![90])], "the next pull continues after key 5");
//! let response = serve_fetch(&mut here, &mut cursors, owner, pull(9)).unwrap();
//! assert_eq!(response.exhausted, vec![1], "read from start to end: nothing left");
//! ```

use std::collections::{BTreeMap, HashSet};

use koala_types::{BucketId, TaskId};

use super::messages::{FetchRequest, FetchResponse};

/// Keys with their state (`None`: none at the location), in request order.
pub type Answered = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// One step of a key-only scan of a bucket ([`LocationStore::keys_after`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPage<P> {
    /// Distinct keys, in key order.
    pub keys: Vec<Vec<u8>>,
    /// Where the scan stopped, for the next one to continue after (`None`: it read nothing).
    pub last: Option<P>,
    /// The scan reached the end of the bucket: nothing is stored after `last`.
    pub end: bool,
}

/// The state a location holds, as a fetch needs it.
pub trait LocationStore {
    /// Why the store failed.
    type Error;
    /// A place in a bucket's key order (the runtime's is a stored key, with its state id).
    type Position: Clone;
    /// Removes the keys' state and returns it (`None` where a key has none here), in order.
    fn take(&mut self, keys: &[Vec<u8>]) -> Result<Answered, Self::Error>;
    /// Up to `max` (> 0) distinct keys of `bucket` stored after `after` (from the bucket's start
    /// if `None`), in key order, without reading their state; nothing is removed. It must cost
    /// O(keys read), not O(what the bucket holds before `after`).
    fn keys_after(
        &mut self,
        bucket: BucketId,
        after: Option<&Self::Position>,
        max: usize,
    ) -> Result<KeyPage<Self::Position>, Self::Error>;
    /// [`Self::keys_after`] for a membership filter: it may also list keys that hold nothing here
    /// any more (never fewer), where ruling them out would cost a read per key. By default, the
    /// exact scan.
    fn filter_keys_after(
        &mut self,
        bucket: BucketId,
        after: Option<&Self::Position>,
        max: usize,
    ) -> Result<KeyPage<Self::Position>, Self::Error> {
        self.keys_after(bucket, after, max)
    }
}

/// Where progressive migration stopped in each bucket, per requester: the location's memory of
/// its pulls (see the module docs).
#[derive(Clone, Debug)]
pub struct PullCursors<P> {
    at: BTreeMap<(TaskId, BucketId), P>,
}

impl<P> Default for PullCursors<P> {
    fn default() -> Self {
        Self { at: BTreeMap::new() }
    }
}

impl<P: Clone> PullCursors<P> {
    /// No pulls yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Buckets a pull stopped in the middle of (a cursor is dropped when its bucket is exhausted).
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Whether no pull stopped in the middle of a bucket.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Up to `room` (> 0) keys of `bucket` for `requester`, continuing after its last pull there;
    /// `true` if they are all the bucket holds (read from its start to its end in this call).
    fn pull<S: LocationStore<Position = P>>(
        &mut self,
        store: &mut S,
        requester: TaskId,
        bucket: BucketId,
        room: usize,
    ) -> Result<(Vec<Vec<u8>>, bool), S::Error> {
        let at = (requester, bucket);
        let cursor = self.at.remove(&at);
        let page = store.keys_after(bucket, cursor.as_ref(), room)?;
        if !page.end {
            if let Some(last) = page.last.or(cursor) {
                self.at.insert(at, last);
            }
            return Ok((page.keys, false));
        }
        let mut keys = page.keys;
        if cursor.is_none() {
            // Read from the bucket's start to its end: these keys are all it holds.
            return Ok((keys, true));
        }
        // The scan started mid-bucket: keys behind the cursor (written after it passed there) are
        // found only from the start. With no room left, the next pull starts there.
        let room = room - keys.len().min(room);
        if room == 0 {
            return Ok((keys, false));
        }
        let wrap = store.keys_after(bucket, None, room)?;
        // Past the cursor, the wrapped scan meets this pull's keys again (they are not taken yet).
        let seen: HashSet<Vec<u8>> = keys.iter().cloned().collect();
        keys.extend(wrap.keys.into_iter().filter(|k| !seen.contains(k)));
        if wrap.end {
            return Ok((keys, true));
        }
        if let Some(last) = wrap.last {
            self.at.insert(at, last);
        }
        Ok((keys, false))
    }
}

/// Answers `request` of `requester` from `store`: everything answered is deleted there (one live
/// copy). Extra keys come from the requested buckets in ascending order, each continuing after
/// `requester`'s last pull there (`cursors`); a bucket is reported exhausted only once a pull
/// read it from its start to its end and took everything in it.
pub fn serve_fetch<S: LocationStore>(
    store: &mut S,
    cursors: &mut PullCursors<S::Position>,
    requester: TaskId,
    request: FetchRequest,
) -> Result<FetchResponse, S::Error> {
    let values = store.take(&request.keys)?;
    let mut extra = Vec::new();
    let mut exhausted = Vec::new();
    if let Some(x) = request.extra.filter(|x| x.max > 0) {
        // The requested keys are gone already, so a pull never repeats them.
        let mut buckets = x.buckets;
        buckets.sort_unstable();
        buckets.dedup();
        let mut keys = Vec::new();
        for bucket in buckets {
            let room = x.max.saturating_sub(keys.len());
            if room == 0 {
                break;
            }
            let (found, all) = cursors.pull(store, requester, bucket, room)?;
            keys.extend(found);
            if all {
                exhausted.push(bucket);
            }
        }
        extra = store.take(&keys)?.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
    }
    Ok(FetchResponse { id: request.id, values, extra, exhausted })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::ops::Bound;

    use koala_types::OperatorId;
    use proptest::prelude::*;

    use super::*;
    use crate::koala::ExtraKeys;

    /// A location whose keys are `(bucket, key)`, so a bucket is one range, as in the real
    /// store; counts the keys its scans read.
    #[derive(Default)]
    struct Buckets {
        keys: BTreeSet<(BucketId, Vec<u8>)>,
        read: usize,
    }

    impl LocationStore for Buckets {
        type Error = std::convert::Infallible;
        type Position = Vec<u8>;

        fn take(&mut self, keys: &[Vec<u8>]) -> Result<Answered, Self::Error> {
            Ok(keys
                .iter()
                .map(|k| {
                    let held = self.keys.iter().find(|(_, key)| key == k).cloned();
                    let value = held.and_then(|h| self.keys.remove(&h).then(|| k.clone()));
                    (k.clone(), value)
                })
                .collect())
        }

        fn keys_after(
            &mut self,
            bucket: BucketId,
            after: Option<&Vec<u8>>,
            max: usize,
        ) -> Result<KeyPage<Vec<u8>>, Self::Error> {
            let from =
                after.map_or(Bound::Included((bucket, Vec::new())), |a| Bound::Excluded((bucket, a.clone())));
            let keys: Vec<Vec<u8>> = self
                .keys
                .range((from, Bound::Unbounded))
                .take_while(|(b, _)| *b == bucket)
                .take(max)
                .map(|(_, k)| k.clone())
                .collect();
            self.read += keys.len();
            Ok(KeyPage { end: keys.len() < max, last: keys.last().cloned(), keys })
        }
    }

    fn task(i: u32) -> TaskId {
        TaskId::new(OperatorId(1), i)
    }

    fn key(bucket: BucketId, i: u32) -> Vec<u8> {
        format!("{bucket}/{i:06}").into_bytes()
    }

    fn pull(buckets: &[BucketId], max: usize) -> FetchRequest {
        FetchRequest {
            id: 0,
            keys: Vec::new(),
            extra: Some(ExtraKeys { buckets: buckets.to_vec(), max }),
            checkpoint: 0,
        }
    }

    #[test]
    fn a_drain_reads_each_key_about_once_and_ends_exhausted() {
        let mut store = Buckets::default();
        for b in [3, 4] {
            store.keys.extend((0..1000).map(|i| (b, key(b, i))));
        }
        let mut cursors = PullCursors::new();
        let (mut pulled, mut pulls, mut buckets) = (Vec::new(), 0, vec![4, 3]);
        while !buckets.is_empty() {
            let before = store.read;
            let response = serve_fetch(&mut store, &mut cursors, task(1), pull(&buckets, 8)).unwrap();
            assert!(store.read - before <= 16, "a pull reads O(N) keys, not what remains");
            assert!(response.extra.len() == 8 || !response.exhausted.is_empty());
            pulled.extend(response.extra.into_iter().map(|(k, _)| k));
            buckets.retain(|b| !response.exhausted.contains(b));
            pulls += 1;
        }
        assert_eq!(pulled.len(), 2000);
        assert_eq!(pulled.iter().collect::<BTreeSet<_>>().len(), 2000, "each key once");
        assert!(pulls <= 2000 / 8 + 2, "{pulls} pulls");
        assert!(store.read <= 2000 + 2 * 8, "{} keys read", store.read);
        assert!(store.keys.is_empty() && cursors.is_empty());
    }

    #[test]
    fn a_key_written_behind_the_cursor_is_pulled_before_the_bucket_is_exhausted() {
        let mut store = Buckets::default();
        store.keys.extend((10..20).map(|i| (5, key(5, i))));
        let mut cursors = PullCursors::new();
        let first = serve_fetch(&mut store, &mut cursors, task(1), pull(&[5], 4)).unwrap();
        assert_eq!(first.extra.len(), 4);
        store.keys.insert((5, key(5, 1)));
        let mut pulled = Vec::new();
        loop {
            let response = serve_fetch(&mut store, &mut cursors, task(1), pull(&[5], 4)).unwrap();
            pulled.extend(response.extra.into_iter().map(|(k, _)| k));
            if response.exhausted == vec![5] {
                break;
            }
        }
        assert!(pulled.contains(&key(5, 1)), "{pulled:?}");
        assert_eq!(pulled.len(), 7);
        assert!(store.keys.is_empty());
    }

    #[test]
    fn an_empty_bucket_is_exhausted_at_once_and_a_requested_key_is_never_an_extra() {
        let mut store = Buckets::default();
        store.keys.extend([(1, key(1, 0)), (2, key(2, 0)), (2, key(2, 1))]);
        let mut cursors = PullCursors::new();
        let request = FetchRequest { id: 3, keys: vec![key(2, 0)], ..pull(&[2, 0, 1, 2], 8) };
        let response = serve_fetch(&mut store, &mut cursors, task(1), request).unwrap();
        assert_eq!(response.values, vec![(key(2, 0), Some(key(2, 0)))]);
        assert_eq!(response.extra, vec![(key(1, 0), key(1, 0)), (key(2, 1), key(2, 1))]);
        assert_eq!(response.exhausted, vec![0, 1, 2]);
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// A pull by requester `.0` of buckets `.1` (a subset of 0..3), at most `.2` keys.
        Pull(u32, Vec<BucketId>, usize),
        /// An on-demand fetch of key `.1` of bucket `.0`.
        Fetch(BucketId, u32),
        /// The location stores key `.1` of bucket `.0` (behind or ahead of any cursor).
        Write(BucketId, u32),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u32..2, proptest::collection::vec(0u16..3, 1..3), 1usize..5)
                .prop_map(|(r, b, n)| Step::Pull(r, b, n)),
            1 => (0u16..3, 0u32..20).prop_map(|(b, i)| Step::Fetch(b, i)),
            2 => (0u16..3, 0u32..20).prop_map(|(b, i)| Step::Write(b, i)),
        ]
    }

    proptest! {
        /// Whatever the interleaving of pulls by two requesters (stale cursors: a bucket pulled by
        /// one, then by the other, then by the first again), fetches and writes: a bucket reported
        /// exhausted is empty, and with no more writes, pulls drain every bucket.
        #[test]
        fn exhausted_means_empty_and_pulls_drain_everything(
            initial in proptest::collection::btree_set((0u16..3, 0u32..20), 0..40),
            steps in proptest::collection::vec(step(), 0..60),
        ) {
            let mut store = Buckets::default();
            store.keys.extend(initial.iter().map(|&(b, i)| (b, key(b, i))));
            let mut cursors = PullCursors::new();
            for s in steps {
                match s {
                    Step::Pull(r, buckets, max) => {
                        let response = serve_fetch(&mut store, &mut cursors, task(r), pull(&buckets, max)).unwrap();
                        prop_assert!(response.extra.len() <= max);
                        for b in response.exhausted {
                            prop_assert!(store.keys.iter().all(|(kb, _)| *kb != b), "bucket {} exhausted but not empty", b);
                        }
                    }
                    Step::Fetch(b, i) => {
                        store.take(&[key(b, i)]).unwrap();
                    }
                    Step::Write(b, i) => {
                        store.keys.insert((b, key(b, i)));
                    }
                }
            }
            let held = store.keys.len();
            let mut buckets = vec![0, 1, 2];
            let mut pulled = 0;
            for _ in 0..(held + 4 * 3) {
                if buckets.is_empty() {
                    break;
                }
                let response = serve_fetch(&mut store, &mut cursors, task(0), pull(&buckets, 1)).unwrap();
                pulled += response.extra.len();
                buckets.retain(|b| !response.exhausted.contains(b));
            }
            prop_assert!(buckets.is_empty(), "not drained: {:?} left of {:?}", store.keys, buckets);
            prop_assert_eq!(pulled, held);
        }
    }
}
