//! What a DRRS task does once an event may have unblocked it (docs/protocols.md §11): a
//! sender's fast-forward, bucket pushes and forwarded watermarks, the receiver's watermark hold,
//! and the acks that end a subscale.

use std::collections::BTreeSet;

use koala_types::{BucketId, Epoch, Timestamp};

use super::transition::Out;
use super::{DrrsTask, In, TaskAction, Transition};
use crate::control::TaskAck;
use crate::drrs::DrrsPeer;

impl DrrsTask {
    /// The event time the task may claim: the minimum over its channels, below every record it
    /// holds.
    pub(super) fn frontier(&self) -> Option<Timestamp> {
        self.below_held(self.watermarks.min()?)
    }

    /// What a sender promises on its peer channels: its upstream channels bound what it forwards.
    /// The records it holds do not: each waits for a bucket this task *receives*, which it never
    /// also sends (a reconfiguration moves a bucket once), so the task processes them itself. Held
    /// below them, a task that receives and sends in one subscale (2 → 4 under the uniform policy:
    /// 0 → 1 → 2) could fast-forward to its receivers only once its own buckets had all arrived, and
    /// every subscale ran its pairs one hop after another (the full scale-out: ~19 s a subscale
    /// for ~7 s of transfer).
    pub(super) fn sender_frontier(&self) -> Option<Timestamp> {
        self.watermarks.min_upstream()
    }

    pub(super) fn below_held(&self, channels: Timestamp) -> Option<Timestamp> {
        match self.held.min() {
            None => Some(channels),
            Some(0) => None,
            Some(h) => Some(channels.min(h - 1)),
        }
    }

    pub(super) fn try_fast_forward(&mut self, out: &mut Vec<TaskAction>) -> bool {
        let frontier = self.sender_frontier();
        let mut changed = false;
        for t in self.subs.values_mut() {
            let epoch = t.epoch();
            for (&to, o) in t.outbound.iter_mut() {
                let ready = match o.state {
                    Out::Open(None) => true,
                    Out::Open(Some(w)) => frontier.is_some_and(|f| f >= w),
                    _ => false,
                };
                if !ready {
                    continue;
                }
                o.state = Out::Forwarding(frontier);
                t.forward.extend(o.buckets.iter().map(|&b| (b, to)));
                out.push(TaskAction::DetachTimers { buckets: o.buckets.clone(), up_to: frontier });
                out.push(TaskAction::SendToPeer {
                    to,
                    message: DrrsPeer::FastForward { epoch, watermark: frontier },
                });
                changed = true;
            }
        }
        changed
    }

    /// Pushes the next bucket to every receiver with none in flight: a bucket records wait for
    /// first, else in bucket order.
    pub(super) fn try_push(&mut self, out: &mut Vec<TaskAction>) -> bool {
        let mut changed = false;
        for t in self.subs.values_mut() {
            let epoch = t.epoch();
            for (&to, o) in t.outbound.iter_mut() {
                if o.pushing.is_some() || matches!(o.state, Out::AwaitOpen | Out::Open(_)) {
                    continue;
                }
                let Some(bucket) = o.unpushed.pop_front() else { continue };
                o.pushing = Some(bucket);
                self.owned.remove(&bucket);
                out.push(TaskAction::PushBucket { to, epoch, bucket });
                changed = true;
            }
        }
        changed
    }

    pub(super) fn advance_watermark(&mut self, out: &mut Vec<TaskAction>) {
        if let Some(f) = self.sender_frontier() {
            for t in self.subs.values_mut() {
                let epoch = t.epoch();
                for (&to, o) in t.outbound.iter_mut() {
                    if let Out::Forwarding(last) = &mut o.state
                        && last.is_none_or(|l| f > l)
                    {
                        *last = Some(f);
                        let message = DrrsPeer::Watermark { epoch, time: f };
                        out.push(TaskAction::SendToPeer { to, message });
                    }
                }
            }
        }
        let Some(f) = self.frontier() else { return };
        // A receiver holds its event time until every marker arrived (as Koala does) and — the
        // watermark propagation the paper adds to DRRS — while records wait or a moved bucket's
        // state and timers have not arrived.
        let gate_open = self.started
            && self.subs.values().all(|t| {
                !t.is_receiver()
                    || (t.markers_pending.is_empty()
                        && (self.fault_watermark_before_state.on()
                            || (t.waiting.is_empty() && t.incoming.keys().all(|b| self.owned.contains(b)))))
            });
        if gate_open && self.emitted.is_none_or(|e| f > e) {
            self.emitted = Some(f);
            out.push(TaskAction::EmitWatermark(f));
        }
    }

    pub(super) fn check_ready_and_done(&mut self, out: &mut Vec<TaskAction>) -> bool {
        let mut changed = false;
        let mut finished = Vec::new();
        for (&epoch, t) in self.subs.iter_mut() {
            changed |= Self::check_transition(epoch, t, &self.owned, out);
            if t.done() {
                finished.push(epoch);
            }
        }
        for epoch in finished {
            self.subs.remove(&epoch);
            out.push(TaskAction::Ack { epoch, ack: TaskAck::Done });
            changed = true;
        }
        changed
    }

    /// Acks `PeerReady`, closes peer channels and tells senders `Received` as subscale `epoch`
    /// allows.
    pub(super) fn check_transition(
        epoch: Epoch,
        t: &mut Transition,
        owned: &BTreeSet<BucketId>,
        out: &mut Vec<TaskAction>,
    ) -> bool {
        let mut changed = false;
        if !t.ready_sent && t.inbound.values().all(|(_, s)| *s != In::Awaiting) {
            t.ready_sent = true;
            out.push(TaskAction::Ack { epoch, ack: TaskAck::PeerReady });
            changed = true;
        }
        if t.markers_pending.is_empty() {
            for (&to, o) in t.outbound.iter_mut() {
                if matches!(o.state, Out::Forwarding(_)) {
                    o.state = Out::Closed;
                    out.push(TaskAction::SendToPeer { to, message: DrrsPeer::Close { epoch } });
                    changed = true;
                }
            }
        }
        // A receiver tells each sender whose channel closed and whose buckets all arrived.
        for (&from, (buckets, state)) in &t.inbound {
            if *state == In::Closed && buckets.iter().all(|b| owned.contains(b)) && t.acked.insert(from) {
                out.push(TaskAction::SendToPeer { to: from, message: DrrsPeer::Received { epoch } });
                changed = true;
            }
        }
        changed
    }
}
