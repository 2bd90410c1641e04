//! A Koala task's store as a fetch location (paper §3.3, §3.4; docs/protocols.md §6): what other
//! tasks fetch from it, each key's state over all the operator's state ids as one value, deleted
//! as it is answered (one live copy).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use koala_protocol::koala::{Answered, KeyPage, LocalKeys, LocationStore};
use koala_state::{StateBackend, StateKey, StateWrite};
use koala_types::{BucketId, bucket_of, encode};

use crate::RuntimeError;

/// A key's state over all the operator's state ids, as one value for the core.
pub(crate) type Bundle = Vec<(u8, Vec<u8>)>;

/// A key and its state, if it had any here.
pub(super) type Taken = (Vec<u8>, Option<Bundle>);

/// One task's store, seen as the location of its keys.
pub(super) struct StoreLocation<'a> {
    store: &'a dyn StateBackend,
    /// The operator's state ids: a key's state is one entry per id.
    state_ids: &'a [u8],
    num_buckets: u16,
    /// Entries read and deleted so far, for the task's metrics.
    pub(super) reads: u64,
}

impl<'a> StoreLocation<'a> {
    pub(super) fn new(store: &'a dyn StateBackend, state_ids: &'a [u8], num_buckets: u16) -> Self {
        Self { store, state_ids, num_buckets, reads: 0 }
    }

    /// Reads every state id of `keys` and deletes them here (one live copy).
    pub(super) fn take_bundles(&mut self, keys: &[Vec<u8>]) -> Result<Vec<Taken>, RuntimeError> {
        let wanted = state_keys(keys, self.state_ids, self.num_buckets);
        if wanted.is_empty() {
            return Ok(keys.iter().map(|k| (k.clone(), None)).collect());
        }
        let values = self.store.get_many(&wanted)?;
        let mut bundles: HashMap<Vec<u8>, Bundle> = HashMap::new();
        let mut deletes = Vec::new();
        for (k, v) in wanted.into_iter().zip(values) {
            if let Some(v) = v {
                bundles.entry(k.key.clone()).or_default().push((k.state, v));
                deletes.push(StateWrite::Delete(k));
            }
        }
        self.reads += deletes.len() as u64;
        if !deletes.is_empty() {
            self.store.write_many(deletes)?;
        }
        Ok(keys.iter().map(|k| (k.clone(), bundles.remove(k))).collect())
    }
}

impl LocationStore for StoreLocation<'_> {
    type Error = RuntimeError;
    type Position = StateKey;

    fn take(&mut self, keys: &[Vec<u8>]) -> Result<Answered, RuntimeError> {
        let taken = self.take_bundles(keys)?;
        taken
            .into_iter()
            .map(|(key, bundle)| Ok((key, bundle.map(|b| encode(&b)).transpose().map_err(codec)?)))
            .collect()
    }

    fn keys_after(
        &mut self,
        bucket: BucketId,
        after: Option<&StateKey>,
        max: usize,
    ) -> Result<KeyPage<StateKey>, RuntimeError> {
        distinct_keys_after(after, max, |at, want| self.store.bucket_keys_after(bucket, at, want))
    }

    fn filter_keys_after(
        &mut self,
        bucket: BucketId,
        after: Option<&StateKey>,
        max: usize,
    ) -> Result<KeyPage<StateKey>, RuntimeError> {
        distinct_keys_after(after, max, |at, want| self.store.bucket_key_candidates_after(bucket, at, want))
    }
}

/// Up to `max` distinct keys after `after` from a paged scan of stored entries: a key has one
/// entry per state id, so entries are read until `max` distinct keys or the end.
fn distinct_keys_after(
    after: Option<&StateKey>,
    max: usize,
    mut scan: impl FnMut(Option<&StateKey>, usize) -> Result<Vec<StateKey>, koala_state::StateError>,
) -> Result<KeyPage<StateKey>, RuntimeError> {
    let mut keys = Vec::new();
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    let mut last: Option<StateKey> = None;
    loop {
        let want = max - keys.len();
        let page = scan(last.as_ref().or(after), want)?;
        let end = page.len() < want;
        for k in page {
            if seen.insert(k.key.clone()) {
                keys.push(k.key.clone());
            }
            last = Some(k);
        }
        if end || keys.len() >= max {
            return Ok(KeyPage { keys, last, end });
        }
    }
}

/// A task's own store as the core's local-first lookups see it (docs/protocols.md §6): a key is
/// local if any of the operator's state ids holds a value for it. Times the core's lookups.
pub(super) struct StoreKeys<'a> {
    store: &'a dyn StateBackend,
    state_ids: &'a [u8],
    num_buckets: u16,
    started: Option<Instant>,
    spent: Duration,
    batches: u64,
    /// The first store error: the key is then treated as not local (asking its old location is
    /// safe), and the task fails after the event.
    error: Option<RuntimeError>,
}

impl<'a> StoreKeys<'a> {
    pub(super) fn new(store: &'a dyn StateBackend, state_ids: &'a [u8], num_buckets: u16) -> Self {
        Self { store, state_ids, num_buckets, started: None, spent: Duration::ZERO, batches: 0, error: None }
    }

    /// Time spent in lookups, batches looked up, and the first store error.
    pub(super) fn finish(self) -> (Duration, u64, Option<RuntimeError>) {
        (self.spent, self.batches, self.error)
    }
}

impl LocalKeys for StoreKeys<'_> {
    fn contains_many(&mut self, keys: &[&[u8]]) -> Vec<bool> {
        if self.state_ids.is_empty() {
            return vec![false; keys.len()];
        }
        let ids = self.state_ids.len();
        let wanted = state_keys(keys, self.state_ids, self.num_buckets);
        match self.store.get_many(&wanted) {
            Ok(values) => values.chunks(ids).map(|v| v.iter().any(Option::is_some)).collect(),
            Err(e) => {
                self.error.get_or_insert(e.into());
                vec![false; keys.len()]
            }
        }
    }

    fn lookup(&mut self, started: bool, _probed: usize) {
        if started {
            self.started = Some(Instant::now());
        } else {
            // A batch without a lookup (every bucket settled) counts, with no time.
            if let Some(t) = self.started.take() {
                self.spent += t.elapsed();
            }
            self.batches += 1;
        }
    }
}

/// The stored keys of `keys`' state: one per state id, key by key.
fn state_keys<K: AsRef<[u8]>>(keys: &[K], state_ids: &[u8], num_buckets: u16) -> Vec<StateKey> {
    keys.iter()
        .flat_map(|key| {
            let key = key.as_ref();
            let bucket = bucket_of(key, num_buckets);
            state_ids.iter().map(move |&state| StateKey { bucket, state, key: key.to_vec() })
        })
        .collect()
}

/// The writes that put fetched entries (each a key and its encoded [`Bundle`]) into a store:
/// a fetch answer installed by its owner, or retained entries restored from a checkpoint.
pub(crate) fn bundle_writes(
    entries: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    num_buckets: u16,
) -> Result<Vec<StateWrite>, RuntimeError> {
    let mut writes = Vec::new();
    for (key, bundle) in entries {
        let bundle: Bundle = koala_types::decode(&bundle).map_err(codec)?;
        let bucket = bucket_of(&key, num_buckets);
        for (state, value) in bundle {
            writes.push(StateWrite::Put(StateKey { bucket, state, key: key.clone() }, value));
        }
    }
    Ok(writes)
}

/// A bundle that did not encode or decode.
pub(super) fn codec(e: koala_types::CodecError) -> RuntimeError {
    RuntimeError::Codec { what: "a key's state bundle".into(), source: e }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use koala_protocol::koala::{ExtraKeys, FetchRequest, PullCursors, serve_fetch};
    use koala_state::{FjallEnv, MemoryEnv, StateEnv};
    use koala_types::{OperatorId, TaskId};

    use super::*;

    /// A location that adds up the time spent in each of its operations.
    struct Timed<'a> {
        location: StoreLocation<'a>,
        scan: &'a mut Duration,
        take: &'a mut Duration,
    }

    impl LocationStore for Timed<'_> {
        type Error = RuntimeError;
        type Position = StateKey;

        fn take(&mut self, keys: &[Vec<u8>]) -> Result<Answered, RuntimeError> {
            let started = Instant::now();
            let answered = self.location.take(keys);
            *self.take += started.elapsed();
            answered
        }

        fn keys_after(
            &mut self,
            bucket: BucketId,
            after: Option<&StateKey>,
            max: usize,
        ) -> Result<KeyPage<StateKey>, RuntimeError> {
            let started = Instant::now();
            let page = self.location.keys_after(bucket, after, max);
            *self.scan += started.elapsed();
            page
        }
    }

    /// Keys in both state ids, only in the first, only in the second: a pull hands each out
    /// once with all its entries, also a key written behind the cursor, and the bucket is
    /// exhausted only when the store holds nothing of it — the same on both backends.
    fn pulls_hand_out_each_key_once_with_all_its_state(
        env: &dyn StateEnv,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let nb = 4;
        let store = env.open_task(TaskId::new(OperatorId(1), 1))?;
        let keys: Vec<Vec<u8>> = (0u64..)
            .map(|i| encode(&i))
            .filter(|k| k.as_ref().map_or(true, |k| bucket_of(k, nb) == 2))
            .take(9)
            .collect::<Result<_, _>>()?;
        let mut writes = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            for state in [0u8, 1] {
                if i % 3 != usize::from(state) {
                    writes.push(StateWrite::Put(StateKey::new(2, state, k.clone()), vec![state; 2]));
                }
            }
        }
        let (first, rest) = writes.split_at(4);
        store.write_many(rest.to_vec())?;
        let ids = [0u8, 1];
        let mut cursors = PullCursors::new();
        let requester = TaskId::new(OperatorId(1), 0);
        let mut pulled: Vec<(Vec<u8>, Bundle)> = Vec::new();
        let mut exhausted = false;
        for id in 0..100 {
            let request = FetchRequest {
                id,
                keys: Vec::new(),
                extra: Some(ExtraKeys { buckets: vec![2], max: 2 }),
                checkpoint: 0,
            };
            let response = serve_fetch(
                &mut StoreLocation::new(store.as_ref(), &ids, nb),
                &mut cursors,
                requester,
                request,
            )?;
            assert!(response.extra.len() <= 2);
            for (k, v) in response.extra {
                pulled.push((k, koala_types::decode(&v)?));
            }
            if id == 1 {
                // Keys 1 and 2 land behind the cursor (in state 0, which it has passed), the state
                // 1 entries of keys 0 and 2 ahead of it.
                store.write_many(first.to_vec())?;
            }
            if response.exhausted == vec![2] {
                exhausted = true;
                break;
            }
        }
        assert!(exhausted, "100 pulls of 2 did not drain 9 keys");
        pulled.sort();
        let expected: Vec<(Vec<u8>, Bundle)> = {
            let mut e: Vec<(Vec<u8>, Bundle)> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    (
                        k.clone(),
                        [0u8, 1]
                            .iter()
                            .filter(|&&s| i % 3 != usize::from(s))
                            .map(|&s| (s, vec![s; 2]))
                            .collect(),
                    )
                })
                .collect();
            e.sort();
            e
        };
        assert_eq!(pulled, expected);
        assert!(store.bucket_keys_after(2, None, 1)?.is_empty());
        assert!(cursors.is_empty());
        Ok(())
    }

    #[test]
    fn pulls_hand_out_each_key_once_with_all_its_state_memory() -> Result<(), Box<dyn std::error::Error>> {
        pulls_hand_out_each_key_once_with_all_its_state(&MemoryEnv::new())
    }

    #[test]
    fn pulls_hand_out_each_key_once_with_all_its_state_fjall() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        pulls_hand_out_each_key_once_with_all_its_state(&FjallEnv::open(dir.path())?)
    }

    fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    /// A tool, not a test (docs/testing.md §7): a cancelled task's store (fjall, or the memory
    /// backend with `KOALA_DRAIN_BACKEND=memory`) holding
    /// `KOALA_DRAIN_KEYS` keys (default 1 M, 8-byte values) in buckets 64..128 of 128 — the half
    /// a 2 → 1 scale-in moves. They are written in key order, so the LSM holds them in
    /// non-overlapping runs, as a long-lived (compacted) store does; `KOALA_DRAIN_ORDER=random`
    /// writes them in random order (overlapping L0 tables, being compacted while the first window
    /// runs). The store is drained by progressive pulls of `KOALA_DRAIN_N` keys (default 8,
    /// the default `extra_keys`) over every bucket the requester still has there, as its pipeline
    /// asks. Prints pulls/s and keys/s over windows of pulls at 90 %, 70 %, 50 %, 30 % and 10 % of
    /// the keys remaining, then drains the rest and checks nothing is left. `KOALA_DRAIN_SKIP` > N
    /// moves between the windows with bigger pulls (for a slow location; the store ends in the
    /// same state: the same keys in the same order are gone).
    #[test]
    #[ignore = "a measurement tool; run in release with --ignored --nocapture"]
    fn progressive_drain_rate() -> Result<(), Box<dyn std::error::Error>> {
        let total: u64 = env_or("KOALA_DRAIN_KEYS", 1_000_000);
        let n: usize = env_or("KOALA_DRAIN_N", 8);
        let skip: usize = env_or("KOALA_DRAIN_SKIP", n);
        let num_buckets: u16 = 128;
        let dir = tempfile::tempdir()?;
        let task = TaskId::new(OperatorId(2), 1);
        let (_env, store, fjall): (Box<dyn StateEnv>, Box<dyn StateBackend>, _) =
            match std::env::var("KOALA_DRAIN_BACKEND").as_deref() {
                Ok("memory") => {
                    let env = MemoryEnv::new();
                    let store = env.open_task(task)?;
                    (Box::new(env), store, None)
                }
                _ => {
                    let env = FjallEnv::open(dir.path())?;
                    let (store, fjall) = (env.open_task(task)?, env.open_fjall_task(task)?);
                    (Box::new(env), store, Some(fjall))
                }
            };
        let loading = Instant::now();
        let mut keys: Vec<StateKey> = (0u64..)
            .map(|i| encode(&i).map(|key| StateKey::new(bucket_of(&key, num_buckets), 0, key)))
            .filter(|k| k.as_ref().map_or(true, |k| k.bucket >= num_buckets / 2))
            .take(usize::try_from(total)?)
            .collect::<Result<_, _>>()?;
        let in_order = std::env::var("KOALA_DRAIN_ORDER").as_deref() != Ok("random");
        if in_order {
            keys.sort_unstable();
        }
        for chunk in keys.chunks(10_000) {
            let value =
                |k: &StateKey| k.key.iter().map(|&b| u64::from(b)).sum::<u64>().to_le_bytes().to_vec();
            store.write_many(chunk.iter().map(|k| StateWrite::Put(k.clone(), value(k))).collect())?;
        }
        println!(
            "loaded {total} keys in {} order in {:.1} s",
            if in_order { "key" } else { "random" },
            loading.elapsed().as_secs_f64()
        );
        // A cancelled task's store has long been flushed and compacted; a fresh bulk load is
        // not, and its background flushes and compactions would slow the first windows down
        // (1 M keys in fjall: pulls/s at 90 % were 0.6-0.7x those at 10 %, the memory backend
        // flat). `KOALA_DRAIN_SETTLE=0` measures the store as loaded.
        if let Some(fjall) = &fjall
            && std::env::var("KOALA_DRAIN_SETTLE").as_deref() != Ok("0")
        {
            let settling = Instant::now();
            fjall.settle()?;
            println!(
                "settled (memtable flushed, tables merged) in {:.1} s",
                settling.elapsed().as_secs_f64()
            );
        }

        let ids = [0u8];
        let mut buckets: Vec<BucketId> = (num_buckets / 2..num_buckets).collect();
        let mut remaining = total;
        let mut id = 0u64;
        let requester = TaskId::new(OperatorId(2), 0);
        let mut cursors = PullCursors::new();
        let (mut scan, mut take) = (Duration::ZERO, Duration::ZERO);
        let mut pull = |max: usize, buckets: &mut Vec<BucketId>, scan: &mut Duration, take: &mut Duration| {
            id += 1;
            let extra = Some(ExtraKeys { buckets: buckets.clone(), max });
            let request = FetchRequest { id, keys: Vec::new(), extra, checkpoint: 0 };
            let location = StoreLocation::new(store.as_ref(), &ids, num_buckets);
            let response =
                serve_fetch(&mut Timed { location, scan, take }, &mut cursors, requester, request)?;
            buckets.retain(|b| !response.exhausted.contains(b));
            Ok::<_, RuntimeError>(response.extra.len() as u64)
        };
        println!(
            "| keys remaining | pulls/s | keys/s | µs per pull: mean | median | p99 | mean in key scan | mean in take (read + delete) |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        // Each point is a window of 5 % of the keys centred on it, or 2 s, whichever is shorter;
        // the median is robust to the LSM's background flushes and compactions.
        for percent in [90u64, 70, 50, 30, 10] {
            let from = total * (2 * percent + 5) / 200;
            while remaining > from {
                let step = skip.min(usize::try_from(remaining - from)?).max(1);
                remaining -= pull(step, &mut buckets, &mut scan, &mut take)?;
            }
            let until = total * (2 * percent - 5) / 200;
            let started = Instant::now();
            let (mut times, mut keys) = (Vec::new(), 0u64);
            (scan, take) = (Duration::ZERO, Duration::ZERO);
            while remaining > until && started.elapsed() < Duration::from_secs(2) {
                let one = Instant::now();
                let got = pull(n, &mut buckets, &mut scan, &mut take)?;
                times.push(one.elapsed());
                keys += got;
                remaining -= got;
            }
            let secs = started.elapsed().as_secs_f64();
            let pulls = times.len() as f64;
            times.sort_unstable();
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            let at = |q: f64| times.get(((pulls - 1.0) * q) as usize).copied().map_or(0.0, us);
            println!(
                "| {percent} % | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                pulls / secs,
                keys as f64 / secs,
                secs * 1e6 / pulls,
                at(0.5),
                at(0.99),
                us(scan) / pulls,
                us(take) / pulls,
            );
        }
        let started = Instant::now();
        let mut pulls = 0u64;
        while !buckets.is_empty() {
            remaining -= pull(n, &mut buckets, &mut scan, &mut take)?;
            pulls += 1;
        }
        let secs = started.elapsed().as_secs_f64();
        println!("then the rest drained by {pulls} pulls in {secs:.1} s; every bucket exhausted");
        assert_eq!(remaining, 0, "keys left behind");
        assert!(store.bucket_keys_after(num_buckets / 2, None, 1)?.is_empty());
        Ok(())
    }
}
