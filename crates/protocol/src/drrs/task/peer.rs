//! A DRRS task's side of a subscale (docs/protocols.md §11): its start, the messages on its peer
//! channels, pushed and arrived buckets, and the release of the records that waited for them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use koala_types::{BucketId, Epoch, InputChannel, Record, TaskId, bucket_of};

use super::transition::{Out, Outbound};
use super::{DrrsTask, In, TaskAction, Transition, Waiting, process, room};
use crate::common::error::ProtocolError;
use crate::common::input::InputSource;
use crate::drrs::{DrrsPeer, Subscale};

impl DrrsTask {
    pub(super) fn on_start(
        &mut self,
        sub: Arc<Subscale>,
        out: &mut Vec<TaskAction>,
    ) -> Result<(), ProtocolError> {
        // Subscales start in epoch order; several may run at once (they move disjoint buckets).
        if sub.epoch <= self.epoch {
            return Err(ProtocolError::StaleEpoch { got: sub.epoch, current: self.epoch });
        }
        let invalid = |reason: String| ProtocolError::InvalidReconfiguration { epoch: sub.epoch, reason };
        let mut outbound = BTreeMap::new();
        let mut inbound = BTreeMap::new();
        let mut incoming = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for (&(from, to), buckets) in &sub.moves {
            if from == to || from.operator != sub.operator || to.operator != sub.operator {
                return Err(invalid(format!(
                    "move {from}->{to} is not between two tasks of {}",
                    sub.operator
                )));
            }
            for &b in buckets {
                if b >= self.num_buckets || !seen.insert(b) {
                    return Err(invalid(format!("bucket {b} is out of range or moves twice")));
                }
            }
            if from == self.id {
                if let Some(b) = buckets.iter().find(|b| !self.owned.contains(b)) {
                    return Err(invalid(format!(
                        "{} moves bucket {b} to {to} but does not hold it",
                        self.id
                    )));
                }
                let unpushed = buckets.iter().copied().collect();
                let o = Outbound {
                    buckets: buckets.clone(),
                    state: Out::AwaitOpen,
                    unpushed,
                    pushing: None,
                    credit: 0,
                };
                outbound.insert(to, o);
            }
            if to == self.id {
                if let Some(b) = buckets.iter().find(|b| self.owned.contains(b)) {
                    return Err(invalid(format!("{} receives bucket {b} from {from} but holds it", self.id)));
                }
                incoming.extend(buckets.iter().map(|&b| (b, from)));
                inbound.insert(from, (buckets.clone(), In::Awaiting));
            }
        }
        if !self.started {
            // A task a reconfiguration created learned its channels when it was deployed; an
            // upstream that finished since then is not among the subscale's running upstreams and
            // never opens its channel here (it never switched to a table naming this task): the
            // coordinator tells nobody, so expect nothing from it (no marker, no end of stream).
            let gone: Vec<InputChannel> =
                self.inputs.iter().filter(|c| !sub.upstreams.contains(&c.from)).copied().collect();
            for channel in gone {
                self.on_end_of_stream(channel)?;
            }
        }
        self.epoch = sub.epoch;
        self.started = true;
        let window = crate::drrs::peer_window(sub.wait_records, inbound.len());
        let mut lent = BTreeMap::new();
        for &from in inbound.keys() {
            self.watermarks.add(InputSource::Peer(from));
            let credit = if self.fault_unbounded_credit.on() { usize::MAX / 4 } else { window };
            lent.insert(from, room::Lent { window, outstanding: credit, freed: 0 });
            let message = DrrsPeer::Open { epoch: sub.epoch, watermark: self.emitted, credit };
            out.push(TaskAction::SendToPeer { to: from, message });
        }
        self.subs.insert(
            sub.epoch,
            Transition {
                markers_pending: self.inputs.clone(),
                markers_seen: BTreeSet::new(),
                outbound,
                forward: BTreeMap::new(),
                inbound,
                incoming,
                waiting: BTreeMap::new(),
                asked: BTreeSet::new(),
                acked: BTreeSet::new(),
                received: BTreeSet::new(),
                ready_sent: false,
                lent,
                sub,
            },
        );
        // Replays what peers sent for subscales started since (later ones wait again).
        for (from, message) in std::mem::take(&mut self.early) {
            if let Err(e) = self.on_peer(from, message, out) {
                out.push(TaskAction::Error(e));
            }
        }
        Ok(())
    }

    pub(super) fn on_peer(
        &mut self,
        from: TaskId,
        message: DrrsPeer,
        out: &mut Vec<TaskAction>,
    ) -> Result<(), ProtocolError> {
        let epoch = message.epoch();
        let unexpected =
            |reason: &str| ProtocolError::UnexpectedPeerMessage { peer: from, epoch, reason: reason.into() };
        if epoch > self.epoch {
            // The peer started the subscale before this task did; replayed at our Start.
            self.early.push((from, message));
            return Ok(());
        }
        let has_state: BTreeSet<BucketId> = if self.fault_process_before_state.on() {
            (0..self.num_buckets).collect()
        } else {
            self.owned.clone()
        };
        let Some(t) = self.subs.get_mut(&epoch) else {
            return Err(unexpected("no subscale of this epoch"));
        };
        match message {
            DrrsPeer::Open { watermark, credit, .. } => match t.outbound.get_mut(&from) {
                Some(o) if o.state == Out::AwaitOpen => {
                    o.state = Out::Open(watermark);
                    o.credit = credit;
                }
                _ => return Err(unexpected("open from a task this one does not send to")),
            },
            DrrsPeer::Credit { records, .. } => match t.outbound.get_mut(&from) {
                Some(o) if o.state != Out::AwaitOpen => o.credit += records,
                _ => return Err(unexpected("credit from a task this one does not forward to")),
            },
            DrrsPeer::FastForward { watermark, .. } => {
                let Some((_, state @ In::Awaiting)) = t.inbound.get_mut(&from) else {
                    return Err(unexpected("fast-forward from a task that is not a pending sender"));
                };
                *state = In::Forwarding;
                if let Some(w) = watermark {
                    self.watermarks.set(InputSource::Peer(from), w)?;
                }
            }
            DrrsPeer::Records { input, records, .. } => {
                if !matches!(t.inbound.get(&from), Some((_, In::Forwarding))) {
                    return Err(unexpected("records on a peer channel that is not open"));
                }
                let Some(lent) = t.lent.get_mut(&from).filter(|l| l.outstanding >= records.len()) else {
                    return Err(unexpected("more records than the credit this task gave"));
                };
                lent.outstanding -= records.len();
                for record in records {
                    let bucket = bucket_of(&record.key, self.num_buckets);
                    if t.incoming.get(&bucket) != Some(&from) {
                        out.push(TaskAction::Error(ProtocolError::Misrouted {
                            bucket,
                            channel: InputSource::Peer(from),
                        }));
                        continue;
                    }
                    if has_state.contains(&bucket) && t.waiting.get(&bucket).is_none_or(|w| w.peer.is_empty())
                    {
                        // Direct records of the bucket may wait for the close: they come after.
                        process(out, input, record);
                        if let Some(lent) = t.lent.get_mut(&from) {
                            lent.freed += 1;
                        }
                        continue;
                    }
                    self.held.add(record.time);
                    self.waited += 1;
                    Waiting::of(&mut t.waiting, bucket, self.intake_tag).peer.push_back((input, record));
                    if !has_state.contains(&bucket) && t.asked.insert(bucket) {
                        out.push(TaskAction::SendToPeer {
                            to: from,
                            message: DrrsPeer::Prioritize { epoch, bucket },
                        });
                    }
                }
            }
            DrrsPeer::Watermark { time, .. } => {
                if !matches!(t.inbound.get(&from), Some((_, In::Forwarding))) {
                    return Err(unexpected("watermark on a peer channel that is not open"));
                }
                self.watermarks.set(InputSource::Peer(from), time)?;
            }
            DrrsPeer::Close { .. } => {
                let Some((buckets, state @ In::Forwarding)) = t.inbound.get_mut(&from) else {
                    return Err(unexpected("close of a peer channel that is not open"));
                };
                *state = In::Closed;
                let buckets = buckets.clone();
                self.watermarks.close(InputSource::Peer(from));
                for b in buckets {
                    self.release(b, out);
                }
            }
            DrrsPeer::Received { .. } => {
                // Every bucket was handed to the runtime (the last `Pushed` may come later).
                let pushed_all =
                    t.outbound.get(&from).is_some_and(|o| o.state == Out::Closed && o.unpushed.is_empty());
                if !pushed_all || !t.received.insert(from) {
                    return Err(unexpected("received before the channel closed and every bucket was pushed"));
                }
            }
            DrrsPeer::Prioritize { bucket, .. } => {
                let Some(o) = t.outbound.get_mut(&from) else {
                    return Err(unexpected("a push request from a task this one does not send to"));
                };
                if let Some(i) = o.unpushed.iter().position(|b| *b == bucket) {
                    o.unpushed.remove(i);
                    o.unpushed.push_front(bucket);
                }
            }
        }
        Ok(())
    }

    pub(super) fn on_arrived(
        &mut self,
        from: TaskId,
        epoch: Epoch,
        bucket: BucketId,
        out: &mut Vec<TaskAction>,
    ) -> Result<(), ProtocolError> {
        let unexpected =
            |reason: &str| ProtocolError::UnexpectedPeerMessage { peer: from, epoch, reason: reason.into() };
        let Some(t) = self.subs.get(&epoch) else {
            return Err(unexpected("a pushed bucket outside its subscale"));
        };
        if t.incoming.get(&bucket) != Some(&from) || self.owned.contains(&bucket) {
            return Err(unexpected("a pushed bucket this task does not expect from that sender"));
        }
        self.owned.insert(bucket);
        self.release(bucket, out);
        Ok(())
    }

    pub(super) fn on_pushed(&mut self, to: TaskId, bucket: BucketId) -> Result<(), ProtocolError> {
        let o = self
            .subs
            .values_mut()
            .filter_map(|t| t.outbound.get_mut(&to))
            .find(|o| o.pushing == Some(bucket));
        match o {
            Some(o) if o.pushing == Some(bucket) => {
                o.pushing = None;
                Ok(())
            }
            _ => Err(ProtocolError::UnexpectedPeerMessage {
                peer: to,
                epoch: self.epoch,
                reason: format!("bucket {bucket} was not being pushed there"),
            }),
        }
    }

    /// Processes what waits for `bucket` and may go now: the forwarded records once its state is
    /// here, then the direct ones once its peer channel also closed.
    pub(super) fn release(&mut self, bucket: BucketId, out: &mut Vec<TaskAction>) {
        if !self.has_state(bucket) {
            return;
        }
        let Some(t) = self.receiving_mut(bucket) else { return };
        let closed =
            t.incoming.get(&bucket).and_then(|s| t.inbound.get(s)).is_some_and(|(_, s)| *s == In::Closed);
        let Some(w) = t.waiting.get_mut(&bucket) else { return };
        let mut go: Vec<(usize, Record)> = w.peer.drain(..).collect();
        // Forwarded records leave the sender's window: it may forward as many more.
        if let Some(lent) = t.incoming.get(&bucket).and_then(|s| t.lent.get_mut(s)) {
            lent.freed += go.len();
        }
        if closed {
            go.extend(w.direct.drain(..));
        }
        let since = w.since;
        if w.peer.is_empty() && w.direct.is_empty() {
            t.waiting.remove(&bucket);
        }
        if go.is_empty() {
            return;
        }
        // The first released record may join the last `Process` action.
        let first = out.len() - usize::from(matches!(out.last(), Some(TaskAction::Process { .. })));
        for (input, record) in go {
            self.held.remove(record.time);
            process(out, input, record);
        }
        self.released.push((first, out.len(), since));
    }
}
