//! The batch pipeline of a Koala task (docs/protocols.md §6, paper §3.1 Fig. 3c, §3.4): records queue in
//! arrival order; a batch whose keys are all local is processed at once. Local first: a key in the
//! task's own store is local; only a local miss consults the KLT, and a key no location may hold is
//! new. Otherwise the task fetches the remote keys from every location that may hold them in one
//! round (one request per location, in parallel; at most one has a key), installs the answers and
//! then processes the batch in input order; a key every location answered "not here" for is new,
//! and the KLT records that it is local.
//!
//! Progressive migration (§3.4): fetches to retired tasks piggyback up to N extra keys, and the
//! task pulls more on its own, one pull outstanding per location, the next sent as the last one's
//! answer arrives (no timer): the pull size doubles while the task keeps up with its input and
//! halves when records queue up behind a batch waiting for state or wait outside the core; no
//! pull goes out while input waits outside the core (the runtime's queue, told by
//! [`KoalaTask::set_input_backlog`]), so pulls take only the time the task would spend waiting
//! for input. A pull never holds up a batch: a batch's fetch goes out while a pull to the same
//! location is in flight; answers from one location come back in request order (the fetch lane is
//! FIFO), so a key a pull took is installed before a racing fetch's "not here" for it arrives.
//!
//! One batch waits for state at a time; the records queued behind it have their keys' state asked
//! for ahead (the look-ahead, `lookahead.rs`), so the next batch waits only for what is still in
//! flight. A hand-over waits until no fetch or pull is outstanding, so a sender never gives away a
//! bucket whose keys are in flight towards it.
//!
//! Every queued record keeps the operator input it arrived on; a batch goes to the operator as
//! consecutive runs of one input, in arrival order.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hash, Hasher};

use koala_types::{BucketId, Record, TaskId, bucket_of};

use super::limits::MAX_BATCH_RECORDS;
use super::lookahead::{KeysInFlight, Resolved};
use super::timers::ACCESS;
use super::{KoalaTask, LocalKeys, TaskAction};
use crate::common::error::ProtocolError;
use crate::koala::key_hash::{Prehashed, bucket_and_key_hash};
use crate::koala::klt::BatchLookup;
use crate::koala::messages::{ExtraKeys, FetchRequest, FetchResponse};

/// The most keys one background pull asks for (the pull size adapts between N and this).
pub(crate) const MAX_PULL_KEYS: usize = 512;

/// Records queued behind a batch waiting for state above which background pulls shrink.
const PULL_BACKLOG: usize = 1024;

/// A key of a batch, hashed by its [`key_hash`] (equal keys have equal hashes; equality compares
/// the bytes).
#[derive(PartialEq, Eq)]
struct AskedKey<'a> {
    hash: u64,
    key: &'a [u8],
}

impl Hash for AskedKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// A fetch sent and not answered.
#[derive(Clone, Debug)]
struct Outstanding {
    location: TaskId,
    keys: BTreeSet<Vec<u8>>,
    extra_buckets: BTreeSet<BucketId>,
}

impl Outstanding {
    fn pulls(&self) -> bool {
        !self.extra_buckets.is_empty()
    }
}

/// A record with the operator input it arrived on (0, or 1 for the right side of a join), its
/// key's bucket and its key's [`key_hash`], both from one hash of the key where the record
/// arrived (its routing needs the bucket): the batch's lookup and a hand-over's removal of its
/// buckets' records read them instead of hashing the key again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InputRecord {
    pub(crate) input: usize,
    pub(crate) bucket: BucketId,
    pub(crate) hash: u64,
    pub(crate) record: Record,
    /// The intake tag the task had when it took the record ([`KoalaTask::set_intake_tag`]).
    pub(crate) taken: u64,
}

impl InputRecord {
    /// A record that arrived on `input`, its key hashed once.
    pub(crate) fn arrived(input: usize, record: Record, num_buckets: u16) -> Self {
        let (bucket, hash) = bucket_and_key_hash(&record.key, num_buckets);
        Self { input, bucket, hash, record, taken: 0 }
    }

    /// The record, taken with intake tag `tag`.
    pub(crate) fn taken_at(mut self, tag: u64) -> Self {
        self.taken = tag;
        self
    }
}

/// A batch the core handed to the operator ([`KoalaTask::take_batches`]): the runtime measures
/// its latency from when its first record was taken to when its last `Process` action ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchTaken {
    /// The smallest intake tag of the batch's records.
    pub taken: u64,
    /// How many consecutive `Process` actions carry the batch (one per run of one input).
    pub actions: usize,
}

/// Splits records into consecutive runs of one input, keeping their order.
pub(crate) fn runs_by_input(records: impl IntoIterator<Item = InputRecord>) -> Vec<(usize, Vec<Record>)> {
    let mut runs: Vec<(usize, Vec<Record>)> = Vec::new();
    for InputRecord { input, record, .. } in records {
        match runs.last_mut() {
            Some((i, run)) if *i == input => run.push(record),
            _ => runs.push((input, vec![record])),
        }
    }
    runs
}

/// A batch waiting for state.
#[derive(Clone, Debug)]
struct Waiting {
    batch: Vec<InputRecord>,
    /// Requests out for its remote keys (its own or the look-ahead's) not answered yet.
    needs: BTreeSet<u64>,
}

/// Records not yet processed and fetches in flight.
#[derive(Clone, Debug)]
pub(crate) struct Pipeline {
    pub(crate) inbox: VecDeque<InputRecord>,
    waiting: Option<Waiting>,
    /// Batches handed to the operator since the runtime last asked.
    pub(crate) batches: Vec<BatchTaken>,
    outstanding: BTreeMap<u64, Outstanding>,
    next_id: u64,
    /// The tag every request carries: the last checkpoint the task snapshotted (`cut.rs`).
    pub(crate) checkpoint: koala_types::CheckpointId,
    /// Keys the next background pull asks for.
    pull_size: usize,
    /// The background drain sent a round and waits for its `Wake` (rate limit).
    pub(crate) drain_resting: bool,
    /// Data messages waiting for the task outside the core ([`KoalaTask::set_input_backlog`]).
    input_backlog: usize,
    /// A batch's lookup and the inbox positions of its keys' records, kept for their
    /// allocations.
    pub(crate) lookup: BatchLookup,
    pub(crate) positions: Vec<usize>,
    /// Remote keys with a request out, and the requests asking for each (`lookahead.rs`).
    pub(crate) in_flight: KeysInFlight,
    /// Keys of queued records known to be here or nowhere (`lookahead.rs`).
    pub(crate) resolved: Resolved,
    /// Records at the front of the inbox the look-ahead has looked at.
    pub(crate) looked_ahead: usize,
    /// Whether the look-ahead is on ([`KoalaTask::set_look_ahead`]).
    pub(crate) look_ahead_on: bool,
    /// Requests the look-ahead sent ([`KoalaTask::look_ahead_requests`]).
    pub(crate) look_ahead_requests: u64,
}

impl Default for Pipeline {
    fn default() -> Self {
        Self {
            inbox: VecDeque::new(),
            waiting: None,
            batches: Vec::new(),
            outstanding: BTreeMap::new(),
            next_id: 0,
            checkpoint: 0,
            pull_size: 1,
            drain_resting: false,
            input_backlog: 0,
            lookup: BatchLookup::default(),
            positions: Vec::new(),
            in_flight: KeysInFlight::default(),
            resolved: Resolved::default(),
            looked_ahead: 0,
            look_ahead_on: true,
            look_ahead_requests: 0,
        }
    }
}

impl Pipeline {
    /// No batch waits and no fetch is outstanding: the task is between two batches.
    pub(crate) fn is_quiet(&self) -> bool {
        debug_assert!(
            !self.outstanding.is_empty() || self.in_flight.is_empty(),
            "a key in flight, no request out"
        );
        self.waiting.is_none() && self.outstanding.is_empty()
    }

    pub(crate) fn pulling_from(&self, location: TaskId) -> bool {
        self.outstanding.values().any(|o| o.location == location && o.pulls())
    }

    /// The inbox lost or reordered records (a hand-over took its buckets' records): the
    /// look-ahead starts over, and keys resolved for buckets no longer owned are forgotten.
    pub(crate) fn inbox_reshaped(&mut self) {
        self.looked_ahead = 0;
        self.resolved.clear();
    }

    pub(crate) fn request(
        &mut self,
        location: TaskId,
        keys: BTreeSet<Vec<u8>>,
        extra: Option<ExtraKeys>,
    ) -> (u64, FetchRequest) {
        self.next_id += 1;
        let id = self.next_id;
        let extra_buckets = extra.as_ref().map(|e| e.buckets.iter().copied().collect()).unwrap_or_default();
        for key in &keys {
            self.in_flight.asked(key, id);
        }
        let request =
            FetchRequest { id, keys: keys.iter().cloned().collect(), extra, checkpoint: self.checkpoint };
        self.outstanding.insert(id, Outstanding { location, keys, extra_buckets });
        (id, request)
    }
}

impl KoalaTask {
    /// Sets how many data messages wait for the task outside the core (the runtime's input
    /// queue; the simulator's data channels to the task), before an event is fed. While any
    /// waits, the task is behind its input and sends no background pull: pulls use the time
    /// the task would otherwise wait for input (see [`Self::pull`]).
    pub fn set_input_backlog(&mut self, messages: usize) {
        self.pipeline.input_backlog = messages;
    }

    /// Processes or starts fetching the next batch; true if it did anything.
    pub(in crate::koala) fn try_process(
        &mut self,
        out: &mut Vec<TaskAction>,
        local: &mut dyn LocalKeys,
    ) -> bool {
        if self.pipeline.waiting.is_some() || self.pipeline.inbox.is_empty() {
            return false;
        }
        if self.pipeline.look_ahead_on && self.take_looked_ahead(out) {
            return true;
        }
        // Keys some old location may hold, each once, with where to ask: those the store misses.
        // A batch whose buckets all have their state here (no layers) makes no lookup: it counts
        // for the lookup metric with no time.
        let mut timed = false;
        let mut asked: Vec<(&[u8], BucketId, u64, Vec<TaskId>)> = Vec::new();
        // The keys in `asked`, so a key repeated in a big batch (a backlog queued behind a
        // fetch) is found in O(1): a scan of `asked` per record made such a batch quadratic.
        let mut seen: HashSet<AskedKey<'_>, BuildHasherDefault<Prehashed>> = HashSet::default();
        let size = self.pipeline.inbox.len().min(MAX_BATCH_RECORDS);
        // The keys of buckets with layers, looked up together (`KeyLookupTable::lookup_batch`),
        // with their records' positions in the inbox.
        let mut lookup = std::mem::take(&mut self.pipeline.lookup);
        let mut positions = std::mem::take(&mut self.pipeline.positions);
        lookup.clear();
        positions.clear();
        for (i, &InputRecord { bucket, hash, .. }) in self.pipeline.inbox.iter().take(size).enumerate() {
            if self.klt.is_settled(bucket) {
                // Inbox records are owned when queued and a hand-over takes its buckets' records
                // out first, so an unowned one cannot happen; refuse to touch its state if it does.
                if !self.klt.owns(bucket) {
                    debug_assert!(false, "unowned record in the inbox");
                    local.lookup(false, 0);
                    (self.pipeline.lookup, self.pipeline.positions) = (lookup, positions);
                    return false;
                }
                continue;
            }
            if self.pipeline.resolved.contains(hash) {
                // Here or nowhere: found by the look-ahead or brought by a fetch.
                continue;
            }
            if !timed {
                timed = true;
                local.lookup(true, 0);
            }
            lookup.push(bucket, hash);
            positions.push(i);
        }
        self.klt.lookup_batch(&mut lookup);
        for (k, candidates) in lookup.named() {
            let (Some(&(bucket, hash)), Some(InputRecord { record: r, .. })) =
                (lookup.keys().get(k), positions.get(k).and_then(|&i| self.pipeline.inbox.get(i)))
            else {
                continue;
            };
            // A key asked about once per batch (few are: most keys are local or new).
            if seen.insert(AskedKey { hash, key: r.key.as_slice() }) {
                asked.push((r.key.as_slice(), bucket, hash, candidates.to_vec()));
            }
        }
        let keys: Vec<&[u8]> = asked.iter().map(|a| a.0).collect();
        (self.pipeline.lookup, self.pipeline.positions) = (lookup, positions);
        let here = if keys.is_empty() { Vec::new() } else { local.contains_many(&keys) };
        local.lookup(false, keys.len());
        let mut remote: BTreeMap<TaskId, BTreeSet<Vec<u8>>> = BTreeMap::new();
        let mut found = Vec::new();
        // Requests already out for keys of the batch (the look-ahead's): wait for them.
        let mut needs = BTreeSet::new();
        for ((key, bucket, hash, candidates), local) in asked.into_iter().zip(here) {
            if local {
                found.push((bucket, hash));
                continue;
            }
            if let Some(ids) = self.pipeline.in_flight.requests(key) {
                needs.extend(ids.iter().copied());
                continue;
            }
            for loc in candidates {
                remote.entry(loc).or_default().insert(key.to_vec());
            }
        }
        for (bucket, hash) in found {
            self.klt.note_local(bucket, hash);
        }
        let batch: Vec<InputRecord> = self.pipeline.inbox.drain(..size).collect();
        self.pipeline.looked_ahead = self.pipeline.looked_ahead.saturating_sub(size);
        needs.extend(self.send_fetches(remote, out));
        self.wait_or_finish(batch, needs, out);
        true
    }

    /// Processes `batch` now if it needs no request, else lets it wait for `needs`.
    pub(in crate::koala) fn wait_or_finish(
        &mut self,
        batch: Vec<InputRecord>,
        mut needs: BTreeSet<u64>,
        out: &mut Vec<TaskAction>,
    ) {
        debug_assert!(needs.iter().all(|id| self.pipeline.outstanding.contains_key(id)));
        needs.retain(|id| self.pipeline.outstanding.contains_key(id));
        if needs.is_empty() {
            self.finish_batch(batch, out);
        } else {
            self.pipeline.waiting = Some(Waiting { batch, needs });
        }
    }

    fn finish_batch(&mut self, mut batch: Vec<InputRecord>, out: &mut Vec<TaskAction>) {
        for r in &batch {
            self.held.remove(r.record.time);
        }
        // Timer accesses (`super::timers`) only needed their key's state here: it is.
        let records = batch.len();
        batch.retain(|r| r.input != ACCESS);
        self.timers.queued -= records - batch.len();
        let taken = batch.iter().map(|r| r.taken).min().unwrap_or(u64::MAX);
        let runs = runs_by_input(batch);
        if !runs.is_empty() {
            self.pipeline.batches.push(BatchTaken { taken, actions: runs.len() });
        }
        for (input, records) in runs {
            out.push(TaskAction::Process { input, records });
        }
    }

    /// The progressive part of a fetch to `location` (paper §3.4), if it is retired.
    pub(in crate::koala) fn extra_for(&self, location: TaskId, max: usize) -> Option<ExtraKeys> {
        if self.extra_keys == 0 || !self.retired.contains(&location) {
            return None;
        }
        let buckets = self.klt.buckets_at(location);
        (!buckets.is_empty()).then_some(ExtraKeys { buckets, max })
    }

    /// Background pull from every retired location without a pull outstanding, and the drain of
    /// the other old locations (not while a hand-over of this task is pending: that waits for the
    /// pipeline to be quiet). Neither goes out while input waits outside the core
    /// ([`Self::set_input_backlog`]): installing pulled keys takes the task's own time, and a
    /// task taking over a cancelled task's input (a scale-in) has none to spare. Its fetches'
    /// piggybacked keys still drain a retired location meanwhile, and the pulls resume at the
    /// first event that finds no input waiting (at the latest once the inputs ended).
    pub(in crate::koala) fn pull(&mut self, out: &mut Vec<TaskAction>) {
        // Once the inputs ended there is no input to yield to (and a pull held back then could
        // leave an idle task with state still to drain).
        let yield_to_input = self.pipeline.input_backlog > 0 && self.has_inputs();
        if self.transition.as_ref().is_some_and(|t| t.hand_over_pending()) || yield_to_input {
            return;
        }
        if self.extra_keys > 0 {
            let size = self.pipeline.pull_size.clamp(self.extra_keys, MAX_PULL_KEYS.max(self.extra_keys));
            let retired: Vec<TaskId> =
                self.retired.iter().copied().filter(|&l| !self.pipeline.pulling_from(l)).collect();
            for loc in retired {
                if let Some(extra) = self.extra_for(loc, size) {
                    let (_, request) = self.pipeline.request(loc, BTreeSet::new(), Some(extra));
                    out.push(TaskAction::FetchState { from: loc, request });
                }
            }
        }
        self.drain(out);
    }

    /// The background drain (off unless `drain_keys_per_sec` > 0): one pull of `rate / 100` keys
    /// to every old location progressive migration does not cover, then rest for as long as the
    /// rate allows before the next round; only while no batch waits for state (it yields to
    /// record processing). Once every input ended there is nothing to yield to: pulls of the
    /// largest size, no rest — also not the rest of a round sent before the end, whose `Wake`
    /// may come only after the task found itself idle, reported `InputsEnded` and was released
    /// (the simulator's mixed_n0 seed 409: it exited with the woken round's pull unanswered).
    /// So an idle task whose inputs ended has nothing left to drain. Their bytes count as
    /// pulled, not as moved on demand.
    fn drain(&mut self, out: &mut Vec<TaskAction>) {
        let rate = self.drain_keys_per_sec;
        let ended = !self.has_inputs() && self.started;
        if rate == 0 || (self.pipeline.drain_resting && !ended) || self.pipeline.waiting.is_some() {
            return;
        }
        let size = if ended {
            MAX_PULL_KEYS
        } else {
            usize::try_from(rate / 100).unwrap_or(MAX_PULL_KEYS).clamp(1, MAX_PULL_KEYS)
        };
        let progressive = self.extra_keys > 0;
        let mut sent = false;
        for loc in self.klt.locations_named() {
            if (progressive && self.retired.contains(&loc)) || self.pipeline.pulling_from(loc) {
                continue;
            }
            let buckets = self.klt.buckets_at(loc);
            if buckets.is_empty() {
                continue;
            }
            let extra = ExtraKeys { buckets, max: size };
            let (_, request) = self.pipeline.request(loc, BTreeSet::new(), Some(extra));
            out.push(TaskAction::FetchState { from: loc, request });
            sent = true;
        }
        if sent && !ended {
            self.pipeline.drain_resting = true;
            out.push(TaskAction::WakeAfter { ms: (size as u64 * 1000 / rate).max(1) });
        }
    }

    pub(in crate::koala) fn on_fetch_request(
        &mut self,
        from: TaskId,
        request: FetchRequest,
        out: &mut Vec<TaskAction>,
    ) -> Result<(), ProtocolError> {
        let extra_buckets = request.extra.iter().flat_map(|e| e.buckets.iter().copied());
        let key_buckets = request.keys.iter().map(|k| bucket_of(k, self.num_buckets));
        for bucket in key_buckets.chain(extra_buckets) {
            if self.klt.owns(bucket) {
                return Err(ProtocolError::FetchOfOwnedBucket { from, bucket });
            }
        }
        out.push(TaskAction::ServeFetch { to: from, request });
        Ok(())
    }

    pub(in crate::koala) fn on_fetch_response(
        &mut self,
        from: TaskId,
        response: FetchResponse,
        out: &mut Vec<TaskAction>,
    ) -> Result<(), ProtocolError> {
        let unknown = ProtocolError::UnknownFetchResponse { from, request: response.id };
        let Some(o) = self.pipeline.outstanding.get(&response.id) else {
            return Err(unknown);
        };
        let answers_request = o.location == from
            && response.values.iter().all(|(k, _)| o.keys.contains(k))
            && response.extra.iter().all(|(k, _)| o.extra_buckets.contains(&bucket_of(k, self.num_buckets)))
            && response.exhausted.iter().all(|b| o.extra_buckets.contains(b));
        if !answers_request {
            return Err(unknown);
        }
        let Some(o) = self.pipeline.outstanding.remove(&response.id) else {
            return Err(unknown);
        };
        if o.keys.is_empty() {
            // A background pull came back: pull more while the task keeps up with its input, less
            // once records queue up behind a batch waiting for state or input waits outside the
            // core (it is falling behind).
            let size = self.pipeline.pull_size.max(self.extra_keys);
            let behind = self.pipeline.inbox.len() > PULL_BACKLOG || self.pipeline.input_backlog > 0;
            // Capped where it grows, not only where it is used: a task that keeps pulling for a
            // long time (repeated scale-ins) would otherwise overflow it.
            self.pipeline.pull_size =
                if behind { size / 2 } else { (size * 2).min(MAX_PULL_KEYS.max(self.extra_keys)) };
        }
        let mut entries = Vec::new();
        for (key, value) in response.values {
            if let Some(v) = value {
                entries.push((key, v));
            }
        }
        // A key a pull brings is installed here and answered by the store from now on, also
        // if a racing fetch for it finds nothing there afterwards (answers come in order).
        entries.extend(response.extra);
        for (key, _) in &entries {
            self.pipeline.in_flight.arrived(key);
            let (bucket, hash) = bucket_and_key_hash(key, self.num_buckets);
            self.klt.now_local(bucket, hash);
            // Local before the runtime installs it (later in this event's actions).
            self.klt.note_local(bucket, hash);
            self.pipeline.resolved.insert(hash);
        }
        // Every requested key this answer did not bring: once each location asked for it said
        // "not here", it is new, and the KLT records that it is local.
        for key in &o.keys {
            if self.pipeline.in_flight.not_here(key, response.id) {
                let (bucket, hash) = bucket_and_key_hash(key, self.num_buckets);
                self.klt.mark_local(bucket, hash);
                self.klt.note_local(bucket, hash);
                self.pipeline.resolved.insert(hash);
            }
        }
        for b in response.exhausted {
            self.klt.exhausted(b, from);
        }
        if !entries.is_empty() {
            out.push(TaskAction::InstallState { entries });
        }
        let ready = match self.pipeline.waiting.as_mut() {
            Some(w) => {
                w.needs.remove(&response.id);
                w.needs.is_empty()
            }
            None => false,
        };
        if ready && let Some(w) = self.pipeline.waiting.take() {
            self.finish_batch(w.batch, out);
        }
        Ok(())
    }
}
