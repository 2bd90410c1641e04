//! The look-ahead of a Koala task's batch pipeline (docs/protocols.md §6): the records queued
//! behind the batch being processed or waiting for state name the keys the next batches will
//! need, so the task asks for their state before their batch is taken. A batch then finds its
//! remote keys installed or already on their way, and waits only for what is still in flight,
//! instead of every batch after a hand-over sending its own round and waiting for it in turn.
//!
//! A look-ahead request is an ordinary fetch ([`FetchRequest`](crate::koala::FetchRequest)) decided by
//! the same rules as a batch's (local first, then the KLT's candidates, every candidate of a key
//! in one round, progressive extra keys when no pull to the location is out), so the location
//! serves it as any fetch, deleting what it sends (one live copy). The pipeline tracks every
//! remote key with a request out, with the requests that ask for it ([`KeysInFlight`]): a key is
//! asked for once however many queued records want it, a batch waits on the requests already
//! out for its keys instead of asking again, and a key every asked location answered "not here"
//! for is new. Requests carry at most [`LOOK_AHEAD_REQUEST_KEYS`] keys, in the order of the
//! records that want them; several may be in flight per location, and their answers come back
//! in order (the fetch lane is FIFO). A batch is cut so that it waits for its first waiting
//! record's request only ([`KoalaTask::take_looked_ahead`]).
//!
//! No look-ahead request goes out while a hand-over of this task is pending (it waits until no
//! fetch is outstanding). A checkpoint's snapshot waits for the answers of those out (rule 1 of
//! the cut, `cut.rs`): the runtime takes no input meanwhile, so the inbox drains and no new
//! ones go out.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::BuildHasherDefault;

use koala_types::{BucketId, TaskId};

use super::limits::MAX_BATCH_RECORDS;
use super::pipeline::InputRecord;
use super::{KoalaTask, LocalKeys, TaskAction};
use crate::koala::key_hash::Prehashed;

/// Keys of queued records found local, fetched or new that [`Resolved`] remembers at most before
/// it starts over (about 1 MiB; a batch whose key was forgotten looks it up again).
const RESOLVED_MAX: usize = 1 << 17;

/// The most keys one look-ahead request asks for: its answer travels as one frame, and the
/// records that want its first keys wait for the whole of it (32 values of 2.5 KiB: 12 ms on a
/// 6.7 MB/s link, against 45 ms for 128).
pub(crate) const LOOK_AHEAD_REQUEST_KEYS: usize = 32;

/// Remote keys with a request out, each with the ids of the requests that ask for it (one per
/// candidate location).
#[derive(Clone, Debug, Default)]
pub(crate) struct KeysInFlight {
    keys: HashMap<Vec<u8>, Vec<u64>>,
}

impl KeysInFlight {
    /// The requests out for `key`, if any.
    pub(crate) fn requests(&self, key: &[u8]) -> Option<&[u64]> {
        self.keys.get(key).map(Vec::as_slice)
    }

    /// Request `id` asks for `key`.
    pub(crate) fn asked(&mut self, key: &[u8], id: u64) {
        match self.keys.get_mut(key) {
            Some(ids) => ids.push(id),
            None => {
                self.keys.insert(key.to_vec(), vec![id]);
            }
        }
    }

    /// The key's state arrived: later answers for it ("not here") mean nothing.
    pub(crate) fn arrived(&mut self, key: &[u8]) {
        self.keys.remove(key);
    }

    /// Request `id` answered without `key`'s state; true if it was the last request out for the
    /// key, which is then new (no location holds it).
    pub(crate) fn not_here(&mut self, key: &[u8], id: u64) -> bool {
        let Some(ids) = self.keys.get_mut(key) else { return false };
        ids.retain(|&i| i != id);
        if ids.is_empty() {
            self.keys.remove(key);
            return true;
        }
        false
    }

    /// Whether no key waits for an answer.
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Hashes of keys whose state is known to be here or nowhere, found by a look-ahead or a fetch:
/// the batch that takes their records asks nobody. The KLT's own memo is bounded at a thousand
/// keys and emptied between events, far fewer than the records a look-ahead covers. A key stays
/// resolved while its bucket is owned, so a hand-over empties it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Resolved {
    hashes: HashSet<u64, BuildHasherDefault<Prehashed>>,
}

impl Resolved {
    pub(crate) fn insert(&mut self, hash: u64) {
        if self.hashes.len() >= RESOLVED_MAX {
            self.hashes.clear();
        }
        self.hashes.insert(hash);
    }

    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.hashes.contains(&hash)
    }

    pub(crate) fn clear(&mut self) {
        self.hashes.clear();
    }
}

impl KoalaTask {
    /// Turns the look-ahead on or off (on by default; off: a batch asks for its keys only when
    /// it is taken, as before the look-ahead existed — for comparisons and tests).
    pub fn set_look_ahead(&mut self, on: bool) {
        self.pipeline.look_ahead_on = on;
    }

    /// Fetch requests the look-ahead sent so far (the simulator proves with it that the
    /// look-ahead ran).
    pub fn look_ahead_requests(&self) -> u64 {
        self.pipeline.look_ahead_requests
    }

    /// Asks for the state of the remote keys of queued records not looked at yet (see the
    /// module docs). Records already looked at are not looked at again.
    pub(in crate::koala) fn look_ahead(&mut self, out: &mut Vec<TaskAction>, local: &mut dyn LocalKeys) {
        let len = self.pipeline.inbox.len();
        if !self.pipeline.look_ahead_on
            || self.pipeline.looked_ahead >= len
            || self.transition.as_ref().is_some_and(|t| t.hand_over_pending())
        {
            self.pipeline.looked_ahead = self.pipeline.looked_ahead.min(len);
            return;
        }
        let start = self.pipeline.looked_ahead;
        self.pipeline.looked_ahead = len;
        let mut lookup = std::mem::take(&mut self.pipeline.lookup);
        let mut positions = std::mem::take(&mut self.pipeline.positions);
        lookup.clear();
        positions.clear();
        for (i, &InputRecord { bucket, hash, .. }) in self.pipeline.inbox.iter().enumerate().skip(start) {
            // Inbox records are owned; a settled bucket's local miss is a new key.
            if self.klt.is_settled(bucket) || self.pipeline.resolved.contains(hash) {
                continue;
            }
            lookup.push(bucket, hash);
            positions.push(i);
        }
        if lookup.keys().is_empty() {
            (self.pipeline.lookup, self.pipeline.positions) = (lookup, positions);
            return;
        }
        local.lookup(true, 0);
        self.klt.lookup_batch(&mut lookup);
        // Keys no location may hold (or known local) are here or nowhere.
        {
            let mut named = lookup.named().map(|(k, _)| k).peekable();
            for (k, &(_, hash)) in lookup.keys().iter().enumerate() {
                if named.next_if_eq(&k).is_none() {
                    self.pipeline.resolved.insert(hash);
                }
            }
        }
        // Each named key once, with its candidates, unless a request for it is out already.
        let mut asked: Vec<(Vec<u8>, BucketId, u64, Vec<TaskId>)> = Vec::new();
        let mut seen: HashSet<u64, BuildHasherDefault<Prehashed>> = HashSet::default();
        for (k, candidates) in lookup.named() {
            let (Some(&(bucket, hash)), Some(r)) =
                (lookup.keys().get(k), positions.get(k).and_then(|&i| self.pipeline.inbox.get(i)))
            else {
                continue;
            };
            let key = r.record.key.as_slice();
            if self.pipeline.in_flight.requests(key).is_some() || !seen.insert(hash) {
                continue;
            }
            asked.push((key.to_vec(), bucket, hash, candidates.to_vec()));
        }
        (self.pipeline.lookup, self.pipeline.positions) = (lookup, positions);
        let keys: Vec<&[u8]> = asked.iter().map(|a| a.0.as_slice()).collect();
        let here = if keys.is_empty() { Vec::new() } else { local.contains_many(&keys) };
        local.lookup(false, keys.len());
        // Requests of at most `LOOK_AHEAD_REQUEST_KEYS` keys, in the order of the records that
        // want them: an answer comes as one frame, so the first records' keys come with the
        // first (small) answer instead of with the whole look-ahead's.
        let mut chunks: BTreeMap<TaskId, BTreeSet<Vec<u8>>> = BTreeMap::new();
        let mut sent = 0;
        for ((key, bucket, hash, candidates), local) in asked.into_iter().zip(here) {
            if local {
                self.klt.note_local(bucket, hash);
                self.pipeline.resolved.insert(hash);
                continue;
            }
            for loc in candidates {
                let chunk = chunks.entry(loc).or_default();
                chunk.insert(key.clone());
                if chunk.len() >= LOOK_AHEAD_REQUEST_KEYS {
                    let keys = std::mem::take(chunk);
                    self.send_fetch(loc, keys, out);
                    sent += 1;
                }
            }
        }
        for (loc, keys) in chunks {
            if !keys.is_empty() {
                self.send_fetch(loc, keys, out);
                sent += 1;
            }
        }
        self.pipeline.look_ahead_requests += sent;
    }

    /// Takes the next batch from records the look-ahead has resolved or asked for, so that a
    /// batch waits only for the requests out for its first waiting record: the records in front
    /// of that one (their keys are here or nowhere) go alone, at once; a waiting batch ends before
    /// the first record whose key was asked for later than its first waiting record's (its
    /// answer comes later) or that the look-ahead has not seen. Batches stay prefixes of the
    /// inbox, so per-key order holds. False if the first record is not resolved nor asked for
    /// (the batch then asks for its keys itself, `try_process`).
    pub(in crate::koala) fn take_looked_ahead(&mut self, out: &mut Vec<TaskAction>) -> bool {
        let size = self.pipeline.inbox.len().min(MAX_BATCH_RECORDS);
        let mut limit: Option<u64> = None;
        let mut needs = BTreeSet::new();
        let mut cut = 0;
        for r in self.pipeline.inbox.iter().take(size) {
            if !self.klt.owns(r.bucket) {
                break;
            }
            if self.klt.is_settled(r.bucket) || self.pipeline.resolved.contains(r.hash) {
                cut += 1;
                continue;
            }
            let Some(ids) = self.pipeline.in_flight.requests(&r.record.key) else { break };
            let last = ids.iter().copied().max().unwrap_or(0);
            match limit {
                // Records that need nothing go first, alone.
                None if cut > 0 => break,
                None => limit = Some(last),
                Some(l) if last > l => break,
                Some(_) => {}
            }
            needs.extend(ids.iter().copied());
            cut += 1;
        }
        if cut == 0 {
            return false;
        }
        let batch: Vec<InputRecord> = self.pipeline.inbox.drain(..cut).collect();
        self.pipeline.looked_ahead = self.pipeline.looked_ahead.saturating_sub(cut);
        self.wait_or_finish(batch, needs, out);
        true
    }

    /// One request per location for `remote` (location → keys), each with the progressive
    /// part when no pull to the location is out; returns their ids.
    pub(in crate::koala) fn send_fetches(
        &mut self,
        remote: BTreeMap<TaskId, BTreeSet<Vec<u8>>>,
        out: &mut Vec<TaskAction>,
    ) -> Vec<u64> {
        remote.into_iter().map(|(loc, keys)| self.send_fetch(loc, keys, out)).collect()
    }

    /// A request to `loc` for `keys`, with the progressive part when no pull to it is out;
    /// returns its id.
    fn send_fetch(&mut self, loc: TaskId, keys: BTreeSet<Vec<u8>>, out: &mut Vec<TaskAction>) -> u64 {
        let extra = if self.pipeline.pulling_from(loc) { None } else { self.extra_for(loc, self.extra_keys) };
        let (id, request) = self.pipeline.request(loc, keys, extra);
        out.push(TaskAction::FetchState { from: loc, request });
        id
    }
}
