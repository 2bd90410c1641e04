//! Serving a fetch at a location (paper §3.3, §3.4; docs/protocols.md §3): the requested keys'
//! state, deleted as it is answered (one live copy), plus — for progressive migration — up to N
//! other keys of the requester's buckets, and which of those buckets hold nothing here any more.
//! The runtime (over the task's LSM store) and the simulator (over a map) both answer through
//! [`serve_fetch`]; only [`LocationStore`] differs.
//!
//! ```
//! use std::collections::BTreeMap;
//! use koala_protocol::koala::{Answered, ExtraKeys, FetchRequest, LocationStore, Sample, serve_fetch};
//!
//! /// Keys are one byte; the bucket is the key modulo 4.
//! struct Map(BTreeMap<Vec<u8>, Vec<u8>>);
//! impl LocationStore for Map {
//!     type Error = std::convert::Infallible;
//!     fn take(&mut self, keys: &[Vec<u8>]) -> Result<Answered, Self::Error> {
//!         Ok(keys.iter().map(|k| (k.clone(), self.0.remove(k))).collect())
//!     }
//!     fn sample(&mut self, buckets: &[u16], max: usize) -> Result<Sample, Self::Error> {
//!         let mut keys: Vec<Vec<u8>> = self.0.keys().filter(|k| buckets.contains(&u16::from(k[0] % 4))).cloned().collect();
//!         let more = keys.split_off(max.min(keys.len()));
//!         Ok((keys, more.iter().map(|k| u16::from(k[0] % 4)).collect()))
//!     }
//! }
//! let mut here = Map(BTreeMap::from([(vec![1], vec![10]), (vec![5], vec![50]), (vec![9], vec![90])]));
//! let request = FetchRequest { id: 7, keys: vec![vec![1], vec![2]], extra: Some(ExtraKeys { buckets: vec![1], max: 1 }) };
//! let response = serve_fetch(&mut here, request).unwrap();
//! assert_eq!(response.values, vec![(vec![1], Some(vec![10])), (vec![2], None)]);
//! assert_eq!(response.extra, vec![(vec![5], vec![50])]);
//! assert!(response.exhausted.is_empty(), "key 9 of bucket 1 is still here");
//! assert_eq!(here.0.len(), 1, "what was answered is gone");
//! ```

use std::collections::BTreeSet;

use koala_types::BucketId;

use super::messages::{FetchRequest, FetchResponse};

/// Keys with their state (`None`: none at the location), in request order.
pub type Answered = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Up to N keys of some buckets, and the buckets that hold more than those.
pub type Sample = (Vec<Vec<u8>>, Vec<BucketId>);

/// The state a location holds, as a fetch needs it.
pub trait LocationStore {
    /// Why the store failed.
    type Error;
    /// Removes the keys' state and returns it (`None` where a key has none here), in order.
    fn take(&mut self, keys: &[Vec<u8>]) -> Result<Answered, Self::Error>;
    /// Up to `max` distinct keys held in `buckets`, in key order, and the buckets that hold keys
    /// beyond those (nothing is removed).
    fn sample(&mut self, buckets: &[BucketId], max: usize) -> Result<Sample, Self::Error>;
}

/// Answers `request` from `store`: everything answered is deleted there (one live copy).
pub fn serve_fetch<S: LocationStore>(
    store: &mut S,
    request: FetchRequest,
) -> Result<FetchResponse, S::Error> {
    let values = store.take(&request.keys)?;
    let mut extra = Vec::new();
    let mut exhausted = Vec::new();
    if let Some(x) = request.extra.filter(|x| x.max > 0 && !x.buckets.is_empty()) {
        // The requested keys are gone already, so the sample never repeats them.
        let (keys, more) = store.sample(&x.buckets, x.max)?;
        extra = store.take(&keys)?.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
        let more: BTreeSet<BucketId> = more.into_iter().collect();
        exhausted = x.buckets.iter().copied().filter(|b| !more.contains(b)).collect();
    }
    Ok(FetchResponse { id: request.id, values, extra, exhausted })
}
