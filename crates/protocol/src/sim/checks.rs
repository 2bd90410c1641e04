//! How the simulated runtime executes task actions, and the invariants it checks on every step
//! (paper Appendix A.1; docs/testing.md §2):
//! - single owner: a bucket is claimed by at most one task, ownership moves only by a hand-over
//!   that reached its receiver, a task's own view of its buckets equals its claims, and a task only
//!   processes keys of buckets it claims;
//! - one live copy: at most one store holds a key; state in flight is in no store;
//! - one-hop fetch: a fetch goes to the store that holds the key (or the key exists nowhere);
//! - exactly once and per-key order: the per-key counter must equal the record's per-key sequence
//!   number when the record is processed (a loss, duplicate, reordering or stale read breaks it);
//! - watermarks: each task's emitted watermarks strictly increase and no record at or below an
//!   emitted watermark is processed by that task afterwards;
//! - timers: a timer that travels with a hand-over is later than every watermark its receiver
//!   emitted (else it would fire behind it), and no timer is left unfired at the end;
//! - at the end: every record processed, every epoch done, every key's count at its location, and
//!   with progressive migration every cancelled task released empty, and every owner's event time
//!   at the end of time (no watermark stuck behind a channel that never closed).

use std::collections::BTreeSet;

use koala_types::{TaskId, bucket_of};

use super::world::{Kind, Msg, Node, World};
use crate::koala::{Answered, LocationStore, Sample, TaskAction, serve_fetch};

impl World {
    pub(crate) fn exec_task(&mut self, me: TaskId, action: TaskAction) -> Result<(), String> {
        match action {
            TaskAction::Process { records, .. } => {
                for r in records {
                    self.process(me, &r.key, &r.value, r.time)?;
                }
            }
            TaskAction::FetchState { from, request } => {
                for key in &request.keys {
                    if let Some(&at) = self.holder.get(key).filter(|&&at| at != from) {
                        return Err(format!(
                            "one hop: {me} fetches {} from {from} but it lives at {at}",
                            show(key)
                        ));
                    }
                }
                self.stats.fetches += 1;
                self.stats.fetched_keys += request.keys.len() as u64;
                self.channels
                    .push((Node::Task(me), Node::Task(from), Kind::State), Msg::FetchRequest(request));
            }
            TaskAction::ServeFetch { to, request } => {
                let task = self.tasks.get_mut(&me).ok_or("serve by unknown task")?;
                let mut location = SimLocation {
                    store: &mut task.store,
                    holder: &mut self.holder,
                    buckets: self.cfg.num_buckets,
                };
                let Ok(response) = serve_fetch(&mut location, request);
                self.stats.extra_keys += response.extra.len() as u64;
                self.channels
                    .push((Node::Task(me), Node::Task(to), Kind::State), Msg::FetchResponse(response));
            }
            TaskAction::InstallState { entries } => {
                for (key, value) in entries {
                    if let Some(at) = self.holder.get(&key) {
                        return Err(format!(
                            "one live copy: {me} installs {} still held by {at}",
                            show(&key)
                        ));
                    }
                    let bytes: [u8; 8] =
                        value.as_slice().try_into().map_err(|_| "state is not a u64 counter")?;
                    self.holder.insert(key.clone(), me);
                    self.tasks
                        .get_mut(&me)
                        .ok_or("install at unknown task")?
                        .store
                        .insert(key, u64::from_le_bytes(bytes));
                    self.stats.moved_keys += 1;
                }
            }
            TaskAction::FireTimers { buckets, up_to } => {
                if self.cfg.fault != Some(super::Fault::NoTimerFiringAtHandOver) {
                    let nb = self.cfg.num_buckets;
                    let task = self.tasks.get_mut(&me).ok_or("timers of unknown task")?;
                    task.timers.retain(|(t, k)| *t > up_to || !buckets.contains(&bucket_of(k, nb)));
                }
            }
            TaskAction::SendToPeer { to, message } => {
                if let crate::koala::PeerMessage::HandOver { hand_over, .. } = &message {
                    self.move_timers(me, to, hand_over.buckets.iter().map(|b| b.bucket).collect())?;
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
                }
                self.channels.push((Node::Task(me), Node::Task(to), Kind::Peer), Msg::Peer(message));
            }
            TaskAction::InstallMetadata { .. } => {}
            TaskAction::EmitWatermark(t) => {
                let task = self.tasks.get_mut(&me).ok_or("watermark of unknown task")?;
                if task.last_watermark.is_some_and(|w| t <= w) {
                    return Err(format!(
                        "watermark of {me} not monotone: {:?} then {t}",
                        task.last_watermark
                    ));
                }
                task.last_watermark = Some(t);
                task.timers.retain(|(time, _)| *time > t);
            }
            TaskAction::Ack { epoch, ack } => {
                self.channels.push((Node::Task(me), Node::Coordinator, Kind::Control), Msg::Ack(epoch, ack))
            }
            TaskAction::Error(e) => return Err(format!("protocol error at {me}: {e}")),
        }
        Ok(())
    }

    pub(crate) fn process(&mut self, me: TaskId, key: &[u8], value: &[u8], time: u64) -> Result<(), String> {
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
        let seq = u64::from_le_bytes(value.try_into().map_err(|_| "record value is not a sequence number")?);
        let count = task.store.get(key).copied().unwrap_or(0);
        if seq != count + 1 {
            return Err(format!(
                "exactly once / per-key order: {me} processes {} #{seq} but its count is {count}",
                show(key)
            ));
        }
        task.store.insert(key.to_vec(), seq);
        task.timers.insert((time, key.to_vec()));
        self.holder.insert(key.to_vec(), me);
        self.processed_total += 1;
        Ok(())
    }

    /// A hand-over moves the timers of its buckets; none may be due at a watermark the receiver
    /// already emitted.
    fn move_timers(&mut self, from: TaskId, to: TaskId, buckets: BTreeSet<u16>) -> Result<(), String> {
        let nb = self.cfg.num_buckets;
        let sender = self.tasks.get_mut(&from).ok_or("hand-over from unknown task")?;
        let (moved, kept): (BTreeSet<_>, BTreeSet<_>) = std::mem::take(&mut sender.timers)
            .into_iter()
            .partition(|(_, k)| buckets.contains(&bucket_of(k, nb)));
        sender.timers = kept;
        let receiver = self.tasks.get_mut(&to).ok_or("hand-over to unknown task")?;
        if let (Some((t, k)), Some(w)) = (moved.first(), receiver.last_watermark)
            && *t <= w
        {
            return Err(format!(
                "timers: {from} hands {}@{t} to {to}, which already emitted watermark {w}: it would fire late",
                show(k)
            ));
        }
        receiver.timers.extend(moved);
        Ok(())
    }

    /// After every event at `id`: the task's own view of its buckets equals its claims.
    pub(crate) fn check_claims(&self, id: TaskId) -> Result<(), String> {
        let task = self.tasks.get(&id).ok_or("claims of unknown task")?;
        let super::world::Core::Koala(core) = &task.core else { return Ok(()) };
        let own = core.owned_buckets();
        let claimed: Vec<u16> =
            self.claims.iter().enumerate().filter(|(_, c)| **c == Some(id)).map(|(b, _)| b as u16).collect();
        if own != claimed {
            return Err(format!("single owner: {id} believes it owns {own:?} but holds claims {claimed:?}"));
        }
        Ok(())
    }

    pub(crate) fn check_end(&mut self) -> Result<(), String> {
        if self.processed_total != self.emitted_total {
            return Err(format!(
                "exactly once: {} of {} records processed",
                self.processed_total, self.emitted_total
            ));
        }
        if self.engine.running().is_some() || self.stats.epochs == 0 {
            let stuck: Vec<String> =
                self.tasks.iter().filter(|(_, t)| t.core.busy()).map(|(id, _)| format!("{id}")).collect();
            return Err(format!(
                "reconfiguration did not complete ({} epochs done, waiting for {:?}); busy tasks {stuck:?}",
                self.stats.epochs,
                self.engine.waiting_for()
            ));
        }
        for (id, t) in &self.tasks {
            if t.core.busy() {
                return Err(format!("{id} still in transition or holding records at the end"));
            }
            // Every upstream ended, so event time must have reached the end of time at each owner.
            let owns = self.claims.contains(&Some(*id));
            if owns && t.last_watermark != Some(u64::MAX) {
                return Err(format!(
                    "event time of {id} stuck at {:?} after end of stream",
                    t.last_watermark
                ));
            }
        }
        if let Some((id, t)) = self.tasks.iter().find(|(_, t)| !t.timers.is_empty()) {
            return Err(format!("timers: {id} ends with {} unfired timers", t.timers.len()));
        }
        for (key, &n) in &self.emitted {
            let at = self.holder.get(key).ok_or_else(|| format!("state of {} lost", show(key)))?;
            let count = self.tasks.get(at).and_then(|t| t.store.get(key)).copied();
            if count != Some(n) {
                return Err(format!("final count of {} at {at} is {count:?}, expected {n}", show(key)));
            }
        }
        let retired = self.engine.retired(super::scenario::TARGET);
        if self.stats.progressive && !retired.is_empty() {
            return Err(format!("progressive migration did not release {retired:?}"));
        }
        Ok(())
    }
}

/// A simulated task's store as a fetch location: a counter per key.
struct SimLocation<'a> {
    store: &'a mut std::collections::BTreeMap<Vec<u8>, u64>,
    holder: &'a mut std::collections::BTreeMap<Vec<u8>, TaskId>,
    buckets: u16,
}

impl LocationStore for SimLocation<'_> {
    type Error = std::convert::Infallible;

    fn take(&mut self, keys: &[Vec<u8>]) -> Result<Answered, Self::Error> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let value = self.store.remove(key);
            if value.is_some() {
                self.holder.remove(key);
            }
            out.push((key.clone(), value.map(|v| v.to_le_bytes().to_vec())));
        }
        Ok(out)
    }

    fn sample(&mut self, buckets: &[u16], max: usize) -> Result<Sample, Self::Error> {
        let mut keys: Vec<Vec<u8>> =
            self.store.keys().filter(|k| buckets.contains(&bucket_of(k, self.buckets))).cloned().collect();
        let more = keys.split_off(max.min(keys.len()));
        Ok((keys, more.iter().map(|k| bucket_of(k, self.buckets)).collect()))
    }
}

fn show(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}
