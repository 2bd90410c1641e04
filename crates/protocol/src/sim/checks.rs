//! How the simulated runtime executes task actions, and the invariants it checks on every step
//! (paper Appendix A.1; docs/testing.md §2):
//! - single owner: a bucket is claimed by at most one task, ownership moves only by a hand-over
//!   that reached its receiver, a task's own view of its buckets equals its claims, and a task only
//!   processes keys of buckets it claims;
//! - one live copy: at most one store holds a key; state in flight is in no store;
//! - one-hop fetch: a fetch goes to the store that holds the key, or the key exists nowhere
//!   (never to the requester itself);
//! - exactly once and order per (key, input): record `#s` of a key on an input follows `#s-1` of
//!   that input, and is processed as the input it came on;
//! - state and deletes: the stored count equals the records processed since the key's state was
//!   last deleted, per the harness's ledger (a loss, duplicate, stale read, lost state or a
//!   deleted value coming back from another location breaks it);
//! - watermarks: each task's emitted watermarks strictly increase and no record at or below an
//!   emitted watermark is processed by that task afterwards;
//! - timers: a timer that travels with its bucket is later than every watermark its receiver
//!   emitted when it arrives (else it would fire behind it), under Koala a timer fires where its
//!   key's state is, on all of it (lazy windows: the state did not travel with the timer), and no
//!   timer is left unfired at the end;
//! - at the end (`end_checks.rs`): every record processed, every epoch done, every live key's
//!   count at its location, every deleted key in no store, no store holding a key outside its
//!   location, and with progressive migration every cancelled task released empty, and every
//!   owner's event time at the end of time (no watermark stuck behind a channel that never closed).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use koala_types::{PROCESSING_TIME, TaskId, TimeDomain, Timestamp, bucket_of};

use super::Fault;
use super::world::Core;
use super::world::{Kind, Msg, Node, SimTask, World};
use crate::control::Protocol;
use crate::koala::{
    Answered, FilterBuild, FilterRequest, FilterResponse, HandOver, KeyFilter, KeyPage, LocationStore,
    PeerMessage, TaskAction, key_hash, serve_fetch,
};

/// What the operator has done to one key, as the harness saw it (never read from a store).
#[derive(Clone, Debug, Default)]
pub(crate) struct KeyLedger {
    /// Records of the key processed, over all inputs.
    pub(crate) processed: u64,
    /// `processed` when the key's state was last deleted (0: never).
    pub(crate) cleared_at: u64,
    /// How many times its state was deleted.
    pub(crate) clears: u64,
    /// The last sequence number processed per input.
    last_seq: [u64; 2],
}

/// Key `i` of the workload. Keys with `i % 4 < 2` are *window keys* (`w…`): each record sets a
/// timer at its own time and the state is deleted when the key's last pending timer fires, as a
/// window operator purges a key whose windows all closed. The others are plain counters (`c…`)
/// without timers, whose state stays where it is until fetched. With
/// [`SimConfig::state_outlives_timers`](super::SimConfig::state_outlives_timers) every key sets
/// timers and none deletes state.
pub(crate) fn key_name(i: usize) -> Vec<u8> {
    let kind = if i % 4 < 2 { 'w' } else { 'c' };
    format!("{kind}{i}").into_bytes()
}

/// How many steps of the world's clock after its record a counter key's processing-time timer is
/// due ([`SimConfig::processing_timers`](super::SimConfig::processing_timers)).
const PROCESSING_TIMER_STEPS: u64 = 20;

fn is_window_key(key: &[u8]) -> bool {
    key.first() == Some(&b'w')
}

/// A record's value: its sequence number within its (key, input) lane, then its input.
pub(crate) fn record_value(seq: u64, input: usize) -> Vec<u8> {
    let mut value = seq.to_le_bytes().to_vec();
    value.push(input as u8);
    value
}

fn parse_value(value: &[u8]) -> Result<(u64, usize), String> {
    match value {
        [seq @ .., input] => {
            let seq: [u8; 8] = seq.try_into().map_err(|_| "record value is not a sequence number")?;
            Ok((u64::from_le_bytes(seq), usize::from(*input)))
        }
        [] => Err("empty record value".into()),
    }
}

impl World {
    pub(crate) fn exec_task(&mut self, me: TaskId, action: TaskAction) -> Result<(), String> {
        match action {
            TaskAction::Process { input, records } => {
                for r in &records {
                    self.process(me, input, r)?;
                }
            }
            TaskAction::FetchState { from, request } => {
                // One hop: the fetch goes to the key's holder, or the holder is among the
                // locations the owner's KLT names for it (asked in the same round), or the key
                // is stored nowhere. Never to itself, and never for a key its own store holds
                // (local first).
                let Some(SimTask { core: Core::Koala(core), store, .. }) = self.tasks.get(&me) else {
                    return Err(format!("fetch by unknown task {me}"));
                };
                let mut candidates = Vec::new();
                for key in &request.keys {
                    if from == me || store.contains_key(key) {
                        return Err(format!("local first: {me} fetches {} it holds itself", show(key)));
                    }
                    let Some(&at) = self.holder.get(key).filter(|&&at| at != from) else { continue };
                    core.klt().candidates(
                        bucket_of(key, self.cfg.num_buckets),
                        key_hash(key),
                        &mut candidates,
                    );
                    if !candidates.contains(&at) {
                        return Err(format!(
                            "one hop: {me} fetches {} from {from} but it lives at {at}, which its KLT does not name",
                            show(key)
                        ));
                    }
                }
                self.stats.fetches += 1;
                self.stats.fetched_keys += request.keys.len() as u64;
                if request.keys.is_empty() {
                    self.pulls_in_flight.insert((me, from, request.id));
                } else if self.pulls_in_flight.range((me, from, 0)..=(me, from, u64::MAX)).next().is_some() {
                    self.stats.fetches_racing_pulls += 1;
                }
                self.channels
                    .push((Node::Task(me), Node::Task(from), Kind::State), Msg::FetchRequest(request));
            }
            TaskAction::WakeAfter { .. } => {
                self.channels.push((Node::Task(me), Node::Task(me), Kind::Control), Msg::Wake);
            }
            TaskAction::RequestFilter { from, request } => {
                self.channels
                    .push((Node::Task(me), Node::Task(from), Kind::State), Msg::FilterRequest(request));
            }
            TaskAction::BuildFilter { to, request } => {
                // Built later, as the runtime builds it (`World::build_and_send_filter`).
                self.channels
                    .push((Node::Task(me), Node::Task(me), Kind::State), Msg::BuildFilter { to, request });
            }
            TaskAction::ServeFetch { to, request } => {
                let task = self.tasks.get_mut(&me).ok_or("serve by unknown task")?;
                let mut location = SimLocation {
                    store: &mut task.store,
                    holder: &mut self.holder,
                    buckets: self.cfg.num_buckets,
                    keep_answered: self.cfg.fault == Some(Fault::ServeWithoutDelete),
                };
                let Ok(response) = serve_fetch(&mut location, &mut task.pull_cursors, to, request);
                self.stats.extra_keys += response.extra.len() as u64;
                self.stats.not_here += response.values.iter().filter(|(_, v)| v.is_none()).count() as u64;
                self.channels
                    .push((Node::Task(me), Node::Task(to), Kind::State), Msg::FetchResponse(response));
            }
            TaskAction::InstallState { entries } => {
                for (key, value) in entries {
                    let bytes: [u8; 8] =
                        value.as_slice().try_into().map_err(|_| "state is not a u64 counter")?;
                    self.install(me, key, u64::from_le_bytes(bytes))?;
                }
            }
            TaskAction::FireTimers { buckets, up_to } => {
                if self.cfg.fault != Some(Fault::NoTimerFiringAtHandOver) {
                    let nb = self.cfg.num_buckets;
                    self.fire_timers(me, |(t, k)| *t <= up_to && buckets.contains(&bucket_of(k, nb)))?;
                }
            }
            TaskAction::SendToPeer { to, mut message } => {
                if let PeerMessage::HandOver { hand_over, .. } = &mut message {
                    for b in &hand_over.buckets {
                        let slot = self.claims.get_mut(usize::from(b.bucket)).ok_or("bucket out of range")?;
                        if *slot != Some(me) {
                            return Err(format!(
                                "single owner: {me} hands over bucket {} claimed by {slot:?}",
                                b.bucket
                            ));
                        }
                        *slot = None;
                    }
                    self.take_timers(me, hand_over)?;
                }
                self.channels.push((Node::Task(me), Node::Task(to), Kind::Peer), Msg::Peer(message));
            }
            TaskAction::InstallTimers { from, timers } => {
                // Lazy windows: note the keys whose state is not here yet, to count which comes
                // first for each, a record of it or its timer.
                for (_, key) in &timers {
                    if self.holder.get(key) != Some(&me) {
                        self.handed.insert((me, key.clone()));
                    }
                }
                self.install_timers(from, me, timers)?;
            }
            TaskAction::FireProcessingTimers { up_to } => {
                self.fire_timers(me, |(time, _)| match TimeDomain::of(*time) {
                    (TimeDomain::ProcessingTime, t) => t <= up_to,
                    (TimeDomain::EventTime, _) => false,
                })?;
                self.tick_clock(me);
            }
            TaskAction::EmitWatermark(t) => {
                let task = self.tasks.get_mut(&me).ok_or("watermark of unknown task")?;
                if task.last_watermark.is_some_and(|w| t <= w) {
                    return Err(format!(
                        "watermark of {me} not monotone: {:?} then {t}",
                        task.last_watermark
                    ));
                }
                task.last_watermark = Some(t);
                self.fire_timers(me, |(time, _)| *time <= t)?;
            }
            TaskAction::Ack { epoch, ack } => {
                self.channels.push((Node::Task(me), Node::Coordinator, Kind::Control), Msg::Ack(epoch, ack))
            }
            TaskAction::Error(e) => return Err(format!("protocol error at {me}: {e}")),
        }
        Ok(())
    }

    /// The operator processes record `r` of input `input` at `me`.
    pub(crate) fn process(
        &mut self,
        me: TaskId,
        input: usize,
        r: &koala_types::Record,
    ) -> Result<(), String> {
        let (key, time) = (r.key.as_slice(), r.time);
        let bucket = bucket_of(key, self.cfg.num_buckets);
        let claim = self.claims.get(usize::from(bucket)).copied().flatten();
        if claim != Some(me) {
            return Err(format!(
                "single owner: {me} processes {} of bucket {bucket} claimed by {claim:?}",
                show(key)
            ));
        }
        if let Some(&at) = self.holder.get(key).filter(|&&at| at != me) {
            return Err(format!("one live copy: {me} processes {} whose state lives at {at}", show(key)));
        }
        let task = self.tasks.get_mut(&me).ok_or("process at unknown task")?;
        if let Some(w) = task.last_watermark.filter(|&w| time <= w) {
            return Err(format!(
                "watermark: {me} processes {}@{time} after emitting watermark {w}",
                show(key)
            ));
        }
        let (seq, sent_on) = parse_value(&r.value)?;
        if sent_on != input {
            return Err(format!(
                "inputs: {me} processes {} #{seq} of input {sent_on} as input {input}",
                show(key)
            ));
        }
        let ledger = self.ledger.entry(key.to_vec()).or_default();
        let last = ledger.last_seq.get_mut(input).ok_or("input out of range")?;
        if seq != *last + 1 {
            return Err(format!(
                "exactly once / per-key order: {me} processes {} #{seq} of input {input} after #{last}",
                show(key)
            ));
        }
        // Remote: what the task has not buffered comes from the shared store.
        let below = if self.cfg.protocol == Protocol::Remote { self.shared.get(key).copied() } else { None };
        let count = task.store.get(key).copied().or(below).unwrap_or(0);
        let expected = ledger.processed - ledger.cleared_at;
        if count != expected {
            if ledger.clears > 0 && count > expected {
                return Err(format!(
                    "deletes: {me} reads count {count} for {} #{seq}, but its state was deleted after record {} and only {expected} were processed since: a deleted value came back",
                    show(key),
                    ledger.cleared_at
                ));
            }
            return Err(format!(
                "exactly once / per-key order: {me} processes {} #{seq} of input {input} but its count is {count}, expected {expected}",
                show(key)
            ));
        }
        *last = seq;
        ledger.processed += 1;
        task.store.insert(key.to_vec(), count + 1);
        if self.handed.remove(&(me, key.to_vec())) {
            self.stats.handed_timers_record_first += 1;
        }
        if self.cfg.state_outlives_timers || is_window_key(key) {
            task.timers.insert((time, key.to_vec()));
        }
        if self.cfg.processing_timers && !is_window_key(key) {
            // A counter key's flush, due a few steps of the clock from now.
            let due = TimeDomain::ProcessingTime.queue_time(self.step + PROCESSING_TIMER_STEPS);
            task.timers.insert((due, key.to_vec()));
            self.tick_clock(me);
        }
        self.holder.insert(key.to_vec(), me);
        self.processed_total += 1;
        self.stats.by_input[input] += 1;
        self.output(me, key)
    }

    /// State that moved (fetched, handed over with timers, transferred) arrives at `me`: it must
    /// be in no store now (one live copy).
    pub(crate) fn install(&mut self, me: TaskId, key: Vec<u8>, count: u64) -> Result<(), String> {
        if let Some(at) = self.holder.get(&key) {
            return Err(format!("one live copy: {me} installs {} still held by {at}", show(&key)));
        }
        self.holder.insert(key.clone(), me);
        self.tasks.get_mut(&me).ok_or("install at unknown task")?.store.insert(key, count);
        self.stats.moved_keys += 1;
        Ok(())
    }

    /// Fires `me`'s timers that are `due`; a window key whose last pending timer fired has its
    /// state deleted here, and the ledger notes the clear. Under Koala a timer fires on its key's
    /// whole state, here (lazy windows: a hand-over brought the timer without the state, and the
    /// core holds the watermark until the key was accessed).
    fn fire_timers(&mut self, me: TaskId, due: impl Fn(&(Timestamp, Vec<u8>)) -> bool) -> Result<(), String> {
        let task = self.tasks.get_mut(&me).ok_or("timers of unknown task")?;
        let (fired, kept): (BTreeSet<_>, BTreeSet<_>) =
            std::mem::take(&mut task.timers).into_iter().partition(due);
        task.timers = kept;
        for (_, key) in &fired {
            self.output(me, key)?;
        }
        let task = self.tasks.get_mut(&me).ok_or("timers of unknown task")?;
        for (time, key) in &fired {
            let handed = self.handed.remove(&(me, key.clone()));
            if handed {
                self.stats.handed_timers_fired_first += 1;
            }
            if TimeDomain::of(*time).0 == TimeDomain::ProcessingTime && *time != Timestamp::MAX {
                self.stats.processing_timers_fired += 1;
                self.stats.handed_processing_timers_fired += u64::from(handed);
            }
            if self.cfg.protocol != Protocol::Koala {
                continue;
            }
            if let Some(&at) = self.holder.get(key).filter(|&&at| at != me) {
                return Err(format!(
                    "lazy timers: {me} fires {}@{time} while its state lives at {at}",
                    show(key)
                ));
            }
            let ledger = self.ledger.get(key).cloned().unwrap_or_default();
            let (here, live) =
                (task.store.get(key).copied().unwrap_or(0), ledger.processed - ledger.cleared_at);
            if here != live {
                return Err(format!(
                    "lazy timers: {me} fires {}@{time} on count {here}, but {live} records were processed since its last delete",
                    show(key)
                ));
            }
        }
        if self.cfg.state_outlives_timers {
            // The key's state stays here, at its KLT location, with no timer left to carry it
            // along at the next hand-over of its bucket.
            return Ok(());
        }
        let closed: BTreeSet<Vec<u8>> = fired
            .into_iter()
            .map(|(_, k)| k)
            .filter(|k| is_window_key(k) && !task.timers.iter().any(|(_, open)| open == k))
            .collect();
        for key in closed {
            // As a window operator does: delete what this task's store holds. If the state is
            // elsewhere (it did not travel with its timers), that copy survives: the bug the
            // ledger catches when the copy is read again or still exists at the end.
            task.store.remove(&key);
            if self.cfg.protocol == Protocol::Remote {
                self.shared.remove(&key);
            }
            if self.holder.get(&key) == Some(&me) {
                self.holder.remove(&key);
            }
            let ledger = self.ledger.entry(key).or_default();
            ledger.cleared_at = ledger.processed;
            ledger.clears += 1;
            self.stats.cleared += 1;
        }
        Ok(())
    }

    /// A hand-over's timers, as the runtime takes them: the moved buckets' timers, gone from the
    /// sender; their keys' state stays here until the receiver fetches it.
    fn take_timers(&mut self, me: TaskId, hand_over: &mut HandOver) -> Result<(), String> {
        let nb = self.cfg.num_buckets;
        let buckets: BTreeSet<u16> = hand_over.buckets.iter().map(|b| b.bucket).collect();
        let task = self.tasks.get_mut(&me).ok_or("hand-over from unknown task")?;
        let (moved, kept): (BTreeSet<_>, BTreeSet<_>) = std::mem::take(&mut task.timers)
            .into_iter()
            .partition(|(_, k)| buckets.contains(&bucket_of(k, nb)));
        task.timers = kept;
        for (_, key) in &moved {
            self.handed.remove(&(me, key.clone()));
        }
        hand_over.timers = moved.into_iter().collect();
        Ok(())
    }

    /// Timers that travelled with their bucket arrive at `me`.
    pub(crate) fn install_timers(
        &mut self,
        from: TaskId,
        me: TaskId,
        timers: Vec<(Timestamp, Vec<u8>)>,
    ) -> Result<(), String> {
        let task = self.tasks.get_mut(&me).ok_or("timers at unknown task")?;
        if let (Some(w), Some((t, k))) = (task.last_watermark, timers.iter().min())
            && *t <= w
        {
            return Err(format!(
                "timers: {from} hands {}@{t} to {me}, which already emitted watermark {w}: it would fire late",
                show(k)
            ));
        }
        task.timers.extend(timers);
        self.tick_clock(me);
        Ok(())
    }

    /// Under Koala, a task with processing-time timers gets its clock (the world's step) at a
    /// random later step, again until none is left; one clock message in flight per task.
    pub(crate) fn tick_clock(&mut self, me: TaskId) {
        if self.cfg.protocol != Protocol::Koala || self.clock_queued.contains(&me) {
            return;
        }
        let Some(task) = self.tasks.get(&me) else { return };
        if task.timers.range((PROCESSING_TIME, Vec::new())..).next().is_some() {
            self.clock_queued.insert(me);
            self.channels.push((Node::Task(me), Node::Task(me), Kind::Control), Msg::Clock);
        }
    }

    /// The membership filter of `bucket` at `me`, built in pages of two keys as the runtime builds
    /// it between batches. Every workload key outside the store goes in with probability 1/4 as a
    /// forced false positive (a real filter has ≈ 0.4 %), so owners ask for keys that are not
    /// there and must still settle them; the broken variant leaves out a key that is there.
    /// A location's deferred filter build comes due: it builds the filter of the bucket from
    /// its store as it is now and sends it to the owner that asked.
    pub(crate) fn build_and_send_filter(
        &mut self,
        me: TaskId,
        to: TaskId,
        request: FilterRequest,
    ) -> Result<(), String> {
        let filter = self.build_filter(me, request.bucket)?;
        self.stats.filters_built += 1;
        let response = FilterResponse { bucket: request.bucket, since: request.since, filter };
        self.channels.push((Node::Task(me), Node::Task(to), Kind::State), Msg::Filter(response));
        Ok(())
    }

    fn build_filter(&mut self, me: TaskId, bucket: u16) -> Result<KeyFilter, String> {
        let nb = self.cfg.num_buckets;
        let task = self.tasks.get_mut(&me).ok_or("filter of unknown task")?;
        let mut location = SimLocation {
            store: &mut task.store,
            holder: &mut self.holder,
            buckets: nb,
            keep_answered: false,
        };
        let mut build = FilterBuild::new(bucket);
        let filter = loop {
            let Ok(step) = build.step(&mut location, 2);
            if let Some(f) = step {
                break f;
            }
        };
        let members: Vec<Vec<u8>> =
            task.store.keys().filter(|k| bucket_of(k, nb) == bucket).cloned().collect();
        if let Some(k) = members.iter().find(|k| !filter.contains(key_hash(k))) {
            return Err(format!("filter of bucket {bucket} at {me} misses {}", show(k)));
        }
        let mut hashes: Vec<u64> = members.iter().map(|k| key_hash(k)).collect();
        if self.cfg.fault == Some(Fault::FilterMissesKey) && !hashes.is_empty() {
            hashes.remove(self.rng.below(hashes.len()));
        }
        for i in 0..self.cfg.keys {
            let key = key_name(i);
            if bucket_of(&key, nb) == bucket && !members.contains(&key) && self.rng.chance(1, 4) {
                hashes.push(key_hash(&key));
            }
        }
        Ok(KeyFilter::build(hashes))
    }

    /// After every event at `id`: the task's own view of its buckets equals its claims.
    pub(crate) fn check_claims(&self, id: TaskId) -> Result<(), String> {
        let task = self.tasks.get(&id).ok_or("claims of unknown task")?;
        let own = match &task.core {
            super::world::Core::Koala(core) => core.owned_buckets(),
            super::world::Core::Drrs(core) => core.owned_buckets(),
            super::world::Core::StopAndRestart(..) => return Ok(()),
        };
        let claimed: Vec<u16> =
            self.claims.iter().enumerate().filter(|(_, c)| **c == Some(id)).map(|(b, _)| b as u16).collect();
        if own != claimed {
            return Err(format!("single owner: {id} believes it owns {own:?} but holds claims {claimed:?}"));
        }
        Ok(())
    }
}

/// A simulated task's store as a fetch location: a counter per key.
struct SimLocation<'a> {
    store: &'a mut BTreeMap<Vec<u8>, u64>,
    holder: &'a mut BTreeMap<Vec<u8>, TaskId>,
    buckets: u16,
    /// Broken variant: answer without deleting (the store keeps a second copy).
    keep_answered: bool,
}

impl LocationStore for SimLocation<'_> {
    type Error = std::convert::Infallible;
    type Position = Vec<u8>;

    fn take(&mut self, keys: &[Vec<u8>]) -> Result<Answered, Self::Error> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let value =
                if self.keep_answered { self.store.get(key).copied() } else { self.store.remove(key) };
            if value.is_some() && !self.keep_answered {
                self.holder.remove(key);
            }
            out.push((key.clone(), value.map(|v| v.to_le_bytes().to_vec())));
        }
        Ok(out)
    }

    fn keys_after(
        &mut self,
        bucket: u16,
        after: Option<&Vec<u8>>,
        max: usize,
    ) -> Result<KeyPage<Vec<u8>>, Self::Error> {
        // The map is not ordered by bucket (unlike the runtime's store): filter the whole range.
        let from = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.clone()));
        let keys: Vec<Vec<u8>> = self
            .store
            .range((from, Bound::Unbounded))
            .map(|(k, _)| k)
            .filter(|k| bucket_of(k, self.buckets) == bucket)
            .take(max)
            .cloned()
            .collect();
        Ok(KeyPage { end: keys.len() < max, last: keys.last().cloned(), keys })
    }
}

pub(crate) fn show(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}
