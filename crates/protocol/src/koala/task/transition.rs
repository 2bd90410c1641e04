//! One reconfiguration epoch at a target task (paper §3.1 steps 2–6, §3.2; docs/protocols.md §5 fixes).
//!
//! Sender: once the receiver's `Open` arrived and the sender's event time has caught up with the
//! watermark the receiver already emitted, and between two batches, it hands the KLT entries of the
//! moved buckets to the receiver, forwards the queued records of those buckets behind them, and
//! from then on forwards their records and its event time over the peer channel. After markers from
//! all upstreams it closes the peer channel.
//!
//! Receiver: adds each peer channel as an input (event time held until the hand-over brings the
//! sender's watermark), acks `PeerReady` once all hand-overs arrived, parks records of a moved
//! bucket that arrive directly from upstreams until that bucket's peer channel closed (per-key
//! FIFO), and is `Done` after all markers and all peer closes. The catch-up rule for existing
//! receivers is an addition to the paper: without it a rebalance or scale-in onto a task that is
//! ahead in event time would hand it records behind a watermark it already emitted.
//!
//! Markers are counted per data channel (upstream task and operator input): an upstream that
//! feeds two inputs of the operator (a self-join) sends one marker on each, and records on one of
//! its channels may still be routed by the old table after the marker on the other.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use koala_types::{BucketId, Epoch, InputChannel, TaskId, Timestamp, bucket_of};

use super::pipeline::{InputRecord, runs_by_input};
use super::{KoalaTask, Route, TaskAction};
use crate::common::error::ProtocolError;
use crate::common::input::InputSource;
use crate::control::TaskAck;
use crate::koala::messages::{FilterRequest, PeerMessage, Reconfiguration};

/// A sender's view of one receiver.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outbound {
    /// Waiting for the receiver's `Open`.
    AwaitOpen,
    /// The receiver emitted up to this watermark; hand over once caught up.
    Open(Option<Timestamp>),
    /// Handed over; the last watermark forwarded.
    HandedOver(Option<Timestamp>),
    /// Peer channel closed.
    Closed,
}

/// A receiver's view of one sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inbound {
    Awaiting,
    HandedOver,
    Closed,
}

/// Transition state of the running epoch.
#[derive(Debug)]
pub(crate) struct Transition {
    reconf: Arc<Reconfiguration>,
    pub(crate) markers_pending: BTreeSet<InputChannel>,
    markers_seen: BTreeSet<InputChannel>,
    outbound: BTreeMap<TaskId, (Vec<BucketId>, Outbound)>,
    forward: BTreeMap<BucketId, TaskId>,
    inbound: BTreeMap<TaskId, (Vec<BucketId>, Inbound)>,
    incoming: BTreeMap<BucketId, TaskId>,
    pub(crate) parked: BTreeMap<BucketId, VecDeque<InputRecord>>,
    ready_sent: bool,
}

impl Transition {
    fn epoch(&self) -> Epoch {
        self.reconf.epoch
    }

    /// Route of a record that came directly from upstream on `channel`, if the transition
    /// decides it.
    pub(crate) fn route_direct(&self, channel: InputChannel, bucket: BucketId, park: bool) -> Option<Route> {
        if let Some(sender) = self.incoming.get(&bucket) {
            return match self.inbound.get(sender).map(|(_, s)| *s) {
                Some(Inbound::Closed) => None,
                Some(Inbound::HandedOver) if park => Some(Route::Park),
                Some(Inbound::HandedOver) => None,
                _ => Some(Route::Reject(ProtocolError::Misrouted {
                    bucket,
                    channel: InputSource::Upstream(channel),
                })),
            };
        }
        let to = *self.forward.get(&bucket)?;
        if self.markers_seen.contains(&channel) {
            return Some(Route::Reject(ProtocolError::RecordAfterMarker { channel, epoch: self.epoch() }));
        }
        match self.outbound.get(&to).map(|(_, s)| s) {
            Some(Outbound::HandedOver(_)) => Some(Route::Forward(to)),
            _ => Some(Route::Reject(ProtocolError::Misrouted {
                bucket,
                channel: InputSource::Upstream(channel),
            })),
        }
    }

    /// Forwards the sender's event time to every receiver it handed over to.
    pub(crate) fn forward_watermark(&mut self, frontier: Timestamp, out: &mut Vec<TaskAction>) {
        let epoch = self.epoch();
        for (&to, (_, state)) in self.outbound.iter_mut() {
            if let Outbound::HandedOver(last) = state
                && last.is_none_or(|l| frontier > l)
            {
                *last = Some(frontier);
                out.push(TaskAction::SendToPeer {
                    to,
                    message: PeerMessage::Watermark { epoch, time: frontier },
                });
            }
        }
    }

    /// Whether the task takes buckets over in this epoch.
    pub(crate) fn is_receiver(&self) -> bool {
        !self.inbound.is_empty()
    }

    /// Whether some hand-over of this task has not happened yet.
    pub(crate) fn hand_over_pending(&self) -> bool {
        self.outbound.values().any(|(_, s)| matches!(s, Outbound::AwaitOpen | Outbound::Open(_)))
    }
}

impl KoalaTask {
    pub(in crate::koala) fn on_start(
        &mut self,
        reconf: Arc<Reconfiguration>,
        out: &mut Vec<TaskAction>,
    ) -> Result<(), ProtocolError> {
        if reconf.epoch <= self.epoch || self.transition.is_some() {
            return Err(ProtocolError::StaleEpoch { got: reconf.epoch, current: self.epoch });
        }
        reconf.validate(self.num_buckets)?;
        let role = reconf.role_of(self.id);
        let invalid = |reason: String| ProtocolError::InvalidReconfiguration { epoch: reconf.epoch, reason };
        for (to, buckets) in &role.outbound {
            if let Some(b) = buckets.iter().find(|b| !self.klt.owns(**b)) {
                return Err(invalid(format!("{} moves bucket {b} to {to} but does not own it", self.id)));
            }
        }
        for (from, buckets) in &role.inbound {
            if let Some(b) = buckets.iter().find(|b| self.klt.owns(**b)) {
                return Err(invalid(format!("{} receives bucket {b} from {from} but owns it", self.id)));
            }
        }
        self.epoch = reconf.epoch;
        self.started = true;
        self.retired.extend(reconf.retired.iter().copied());
        self.extra_keys = reconf.extra_keys;
        self.drain_keys_per_sec = reconf.drain_keys_per_sec;
        // A marker, or the end of stream, on every data channel open here (its channels are
        // known from deployment and `add_input`, with their inputs; `reconf.upstreams` names
        // tasks only): also from an upstream the coordinator no longer counts (it finished or
        // was cancelled), whose records routed by the old table may still be in flight.
        let markers_pending = self.inputs.clone();
        let mut incoming = BTreeMap::new();
        for (&from, buckets) in &role.inbound {
            self.watermarks.add(InputSource::Peer(from));
            incoming.extend(buckets.iter().map(|&b| (b, from)));
            if !reconf.new_tasks.contains(&self.id) {
                let message = PeerMessage::Open { epoch: reconf.epoch, watermark: self.emitted };
                out.push(TaskAction::SendToPeer { to: from, message });
            }
        }
        let outbound = role
            .outbound
            .into_iter()
            .map(|(to, buckets)| {
                let state =
                    if reconf.new_tasks.contains(&to) { Outbound::Open(None) } else { Outbound::AwaitOpen };
                (to, (buckets, state))
            })
            .collect();
        let inbound = role.inbound.into_iter().map(|(from, b)| (from, (b, Inbound::Awaiting))).collect();
        self.transition = Some(Transition {
            reconf,
            markers_pending,
            markers_seen: BTreeSet::new(),
            outbound,
            forward: BTreeMap::new(),
            inbound,
            incoming,
            parked: BTreeMap::new(),
            ready_sent: false,
        });
        // Peer messages of this epoch that overtook the Start.
        let early = std::mem::take(&mut self.early);
        for (from, message) in early {
            if let Err(e) = self.on_peer(from, message, out) {
                out.push(TaskAction::Error(e));
            }
        }
        Ok(())
    }

    pub(in crate::koala) fn on_marker(
        &mut self,
        channel: InputChannel,
        epoch: Epoch,
    ) -> Result<(), ProtocolError> {
        let unexpected = ProtocolError::UnexpectedMarker { channel, epoch };
        let Some(t) = self.transition.as_mut() else {
            return Err(unexpected);
        };
        if t.epoch() != epoch || !t.markers_pending.remove(&channel) {
            return Err(unexpected);
        }
        t.markers_seen.insert(channel);
        Ok(())
    }

    pub(in crate::koala) fn on_peer(
        &mut self,
        from: TaskId,
        message: PeerMessage,
        out: &mut Vec<TaskAction>,
    ) -> Result<(), ProtocolError> {
        let epoch = message.epoch();
        let unexpected =
            |reason: &str| ProtocolError::UnexpectedPeerMessage { peer: from, epoch, reason: reason.into() };
        if epoch > self.epoch {
            // The sender or receiver started before this task did; replay at our Start.
            self.early.push((from, message));
            return Ok(());
        }
        let Some(t) = self.transition.as_mut().filter(|t| t.epoch() == epoch) else {
            return Err(unexpected("no transition of this epoch"));
        };
        match message {
            PeerMessage::Open { watermark, .. } => match t.outbound.get_mut(&from) {
                Some((_, state @ Outbound::AwaitOpen)) => *state = Outbound::Open(watermark),
                _ => return Err(unexpected("open from a task this one does not send to")),
            },
            PeerMessage::HandOver { hand_over, .. } => {
                let Some((_, state @ Inbound::Awaiting)) = t.inbound.get_mut(&from) else {
                    return Err(unexpected("hand-over from a task that is not a pending sender"));
                };
                let expected: BTreeSet<BucketId> =
                    t.incoming.iter().filter(|(_, s)| **s == from).map(|(b, _)| *b).collect();
                let got: BTreeSet<BucketId> = hand_over.buckets.iter().map(|b| b.bucket).collect();
                if expected != got {
                    return Err(unexpected("hand-over of other buckets than the moves say"));
                }
                // Timers only of the moved buckets; their keys' state stays where the locations
                // say (`super::timers`).
                let nb = self.num_buckets;
                if let Some((_, key)) =
                    hand_over.timers.iter().find(|(_, k)| !got.contains(&bucket_of(k, nb)))
                {
                    let b = bucket_of(key, nb);
                    return Err(unexpected(&format!(
                        "hand-over of a timer of bucket {b}, which it does not move"
                    )));
                }
                // The locations as the sender had them, with the sender in front; ask for the
                // filters that are still to be built.
                let mut hand_over = *hand_over;
                let timers = std::mem::take(&mut hand_over.timers);
                let watermark = hand_over.watermark;
                let pending = self.klt.install(hand_over)?;
                for p in pending {
                    self.filters.asked(p.location, p.bucket);
                    out.push(TaskAction::RequestFilter {
                        from: p.location,
                        request: FilterRequest { bucket: p.bucket, since: p.since },
                    });
                }
                *state = Inbound::HandedOver;
                if let Some(w) = watermark {
                    self.watermarks.set(InputSource::Peer(from), w)?;
                }
                if !timers.is_empty() {
                    if !self.fault_no_timer_access.on() {
                        self.timers.add(&timers);
                    }
                    out.push(TaskAction::InstallTimers { from, timers });
                }
            }
            PeerMessage::Records { input, records, .. } => {
                if !matches!(t.inbound.get(&from), Some((_, Inbound::HandedOver))) {
                    return Err(unexpected("records on a peer channel that is not open"));
                }
                for record in records {
                    let r = InputRecord::arrived(input, record, self.num_buckets).taken_at(self.intake_tag);
                    if t.incoming.get(&r.bucket) == Some(&from) {
                        self.held.add(r.record.time);
                        self.pipeline.inbox.push_back(r);
                    } else {
                        out.push(TaskAction::Error(ProtocolError::Misrouted {
                            bucket: r.bucket,
                            channel: InputSource::Peer(from),
                        }));
                    }
                }
            }
            PeerMessage::Watermark { time, .. } => {
                if !matches!(t.inbound.get(&from), Some((_, Inbound::HandedOver))) {
                    return Err(unexpected("watermark on a peer channel that is not open"));
                }
                self.watermarks.set(InputSource::Peer(from), time)?;
            }
            PeerMessage::Close { .. } => {
                let Some((buckets, state @ Inbound::HandedOver)) = t.inbound.get_mut(&from) else {
                    return Err(unexpected("close of a peer channel that is not open"));
                };
                *state = Inbound::Closed;
                let buckets = buckets.clone();
                self.watermarks.close(InputSource::Peer(from));
                // Everything the sender forwarded is queued now: release the parked direct records.
                for b in buckets {
                    let parked = t.parked.remove(&b).unwrap_or_default();
                    self.pipeline.inbox.extend(parked);
                }
            }
        }
        Ok(())
    }

    /// Hands over to every receiver that is ready; true if any hand-over happened.
    pub(in crate::koala) fn try_hand_over(&mut self, out: &mut Vec<TaskAction>) -> bool {
        let frontier = self.sender_frontier();
        let quiet = self.pipeline.is_quiet();
        let Some(t) = self.transition.as_mut() else {
            return false;
        };
        if !quiet {
            return false;
        }
        // Not while a filter of a moved bucket is awaited (`super::awaited`).
        let filters = &self.filters;
        let ready: Vec<TaskId> = t
            .outbound
            .iter()
            .filter(|(_, (buckets, s))| match s {
                Outbound::Open(None) => !filters.of_any(buckets),
                Outbound::Open(Some(w)) => frontier.is_some_and(|f| f >= *w) && !filters.of_any(buckets),
                _ => false,
            })
            .map(|(&to, _)| to)
            .collect();
        if ready.is_empty() {
            return false;
        }
        let epoch = t.epoch();
        for to in ready {
            let Some(t) = self.transition.as_mut() else {
                break;
            };
            let Some((buckets, state)) = t.outbound.get_mut(&to) else {
                continue;
            };
            let buckets = buckets.clone();
            *state = Outbound::HandedOver(frontier);
            t.forward.extend(buckets.iter().map(|&b| (b, to)));
            if let Some(up_to) = frontier {
                out.push(TaskAction::FireTimers { buckets: buckets.clone(), up_to });
            }
            let mut hand_over = self.klt.take(&buckets, epoch);
            hand_over.watermark = frontier;
            out.push(TaskAction::SendToPeer {
                to,
                message: PeerMessage::HandOver { epoch, hand_over: Box::new(hand_over) },
            });
            let moved = self.take_inbox(&buckets.iter().copied().collect());
            for (input, records) in runs_by_input(moved) {
                out.push(TaskAction::SendToPeer {
                    to,
                    message: PeerMessage::Records { epoch, input, records },
                });
            }
        }
        true
    }

    /// Acks `PeerReady`, closes peer channels after all markers, and acks `Done`.
    pub(in crate::koala) fn check_ready_and_done(&mut self, out: &mut Vec<TaskAction>) -> bool {
        let Some(t) = self.transition.as_mut() else {
            return false;
        };
        let epoch = t.epoch();
        let mut changed = false;
        if !t.ready_sent && t.inbound.values().all(|(_, s)| *s != Inbound::Awaiting) {
            t.ready_sent = true;
            out.push(TaskAction::Ack { epoch, ack: TaskAck::PeerReady });
            changed = true;
        }
        if t.markers_pending.is_empty() {
            for (&to, (_, state)) in t.outbound.iter_mut() {
                if matches!(state, Outbound::HandedOver(_)) {
                    *state = Outbound::Closed;
                    out.push(TaskAction::SendToPeer { to, message: PeerMessage::Close { epoch } });
                    changed = true;
                }
            }
        }
        let done = t.ready_sent
            && t.markers_pending.is_empty()
            && t.outbound.values().all(|(_, s)| *s == Outbound::Closed)
            && t.inbound.values().all(|(_, s)| *s == Inbound::Closed);
        if done {
            debug_assert!(
                t.parked.values().all(VecDeque::is_empty),
                "parked records outlive their peer channel"
            );
            let leftover: Vec<InputRecord> = std::mem::take(&mut t.parked).into_values().flatten().collect();
            self.pipeline.inbox.extend(leftover);
            self.transition = None;
            out.push(TaskAction::Ack { epoch, ack: TaskAck::Done });
            changed = true;
        }
        changed
    }
}
