//! The DRRS core of one target task (docs/protocols.md §11): per subscale, the sender's
//! fast-forward and background bucket pushes, the receiver's out-of-order processing with its
//! bounded wait buffer and backpressure, per-key order across the peer and the direct path, and
//! the watermark hold. Events in, actions out; the runtime executes the actions in order.
//!
//! ```
//! use std::collections::{BTreeMap, BTreeSet};
//! use std::sync::Arc;
//! use koala_protocol::drrs::{DrrsPeer, DrrsTask, Subscale, TaskAction, TaskConfig, TaskEvent};
//! use koala_types::{InputChannel, OperatorId, Record, TaskId, bucket_of};
//!
//! let op = OperatorId(1);
//! let (up, old, new) = (TaskId::new(OperatorId(0), 0), TaskId::new(op, 0), TaskId::new(op, 1));
//! let channel = InputChannel { input: 0, from: up };
//! // The new task takes bucket 1 of 2; it learns its channel from the subscale's upstreams.
//! let mut task = DrrsTask::new(TaskConfig { id: new, num_buckets: 2, owned: BTreeSet::new(), inputs: BTreeSet::new() });
//! task.add_input(channel);
//! let subscale = Subscale {
//!     operator: op, epoch: 1 << 16, index: 0, count: 1,
//!     moves: BTreeMap::from([((old, new), vec![1])]), upstreams: BTreeSet::from([up]), wait_records: 8,
//! };
//! let out = task.on(TaskEvent::Start(Arc::new(subscale)));
//! assert!(matches!(out[0], TaskAction::SendToPeer { message: DrrsPeer::Open { .. }, .. }));
//! let ff = DrrsPeer::FastForward { epoch: 1 << 16, watermark: Some(3) };
//! task.on(TaskEvent::Peer { from: old, message: ff });
//! // A forwarded record of bucket 1 waits: its state has not arrived. The core asks for it first.
//! let key = (0..).map(|i: u32| i.to_string().into_bytes()).find(|k| bucket_of(k, 2) == 1).unwrap();
//! let r = Record { key, value: vec![], time: 5, due_ms: 0 };
//! let records = DrrsPeer::Records { epoch: 1 << 16, input: 0, records: vec![r.clone()] };
//! let out = task.on(TaskEvent::Peer { from: old, message: records });
//! assert!(matches!(out[..], [TaskAction::SendToPeer { message: DrrsPeer::Prioritize { bucket: 1, .. }, .. }]));
//! let out = task.on(TaskEvent::BucketArrived { from: old, epoch: 1 << 16, bucket: 1 });
//! assert_eq!(out[0], TaskAction::Process { input: 0, records: vec![r] });
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use koala_types::{BucketId, Epoch, InputChannel, Record, TaskId, Timestamp, bucket_of};

use super::messages::{DrrsPeer, Subscale};
use crate::control::TaskAck;
use crate::koala::{ChannelWatermarks, HeldTimes, InputSource, ProtocolError};

mod room;

pub use room::low_water;

/// How a target task starts.
#[derive(Clone, Debug)]
pub struct TaskConfig {
    /// The task.
    pub id: TaskId,
    /// Buckets of the operator's key space.
    pub num_buckets: u16,
    /// Buckets whose state is here at deployment; empty for a new task.
    pub owned: BTreeSet<BucketId>,
    /// Data channels open to this task; empty for a new task.
    pub inputs: BTreeSet<InputChannel>,
}

/// Input of a [`DrrsTask`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskEvent {
    /// A batch on a data channel.
    Records {
        /// The channel.
        channel: InputChannel,
        /// The records, in channel order.
        records: Vec<Record>,
    },
    /// A watermark on a data channel.
    Watermark {
        /// The channel.
        channel: InputChannel,
        /// Its event time.
        time: Timestamp,
    },
    /// The upstream switched routing tables for subscale `epoch`.
    Marker {
        /// The channel.
        channel: InputChannel,
        /// The subscale.
        epoch: Epoch,
    },
    /// A data channel ended.
    EndOfStream {
        /// The channel.
        channel: InputChannel,
    },
    /// The coordinator starts a subscale.
    Start(Arc<Subscale>),
    /// A peer-channel message.
    Peer {
        /// The peer task.
        from: TaskId,
        /// The message.
        message: DrrsPeer,
    },
    /// The runtime installed a bucket `from` pushed (its state and its timers).
    BucketArrived {
        /// The sender.
        from: TaskId,
        /// The subscale.
        epoch: Epoch,
        /// The bucket.
        bucket: BucketId,
    },
    /// The runtime sent the bucket of [`TaskAction::PushBucket`]: the next may go.
    Pushed {
        /// The receiver.
        to: TaskId,
        /// The bucket.
        bucket: BucketId,
    },
}

/// Output of a [`DrrsTask`], executed in order by the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskAction {
    /// Run the operator on these records of input `input`, in this order; their buckets' state
    /// is here.
    Process {
        /// The operator input.
        input: usize,
        /// The records.
        records: Vec<Record>,
    },
    /// Send on the peer channel to `to`.
    SendToPeer {
        /// The peer.
        to: TaskId,
        /// The message.
        message: DrrsPeer,
    },
    /// The task stops processing `buckets` (they go to another task): fire their timers due at
    /// event time `up_to` (the task's inputs reached it), then set their other timers aside —
    /// they travel with the bucket's push and never fire here.
    DetachTimers {
        /// The buckets.
        buckets: Vec<BucketId>,
        /// The sender's event time, if it has one.
        up_to: Option<Timestamp>,
    },
    /// Push `bucket` to `to` on the state lane: read and delete its state here, send it with the
    /// timers set aside for it; once sent (it counts against `link_mb_per_sec`), feed
    /// [`TaskEvent::Pushed`]. The receiver installs it and feeds [`TaskEvent::BucketArrived`].
    PushBucket {
        /// The receiver.
        to: TaskId,
        /// The subscale.
        epoch: Epoch,
        /// The bucket.
        bucket: BucketId,
    },
    /// Emit this watermark downstream (monotone).
    EmitWatermark(Timestamp),
    /// Send to the coordinator.
    Ack {
        /// The subscale.
        epoch: Epoch,
        /// The ack.
        ack: TaskAck,
    },
    /// The event was rejected; report it so the coordinator aborts the job.
    Error(ProtocolError),
}

/// A sender's view of one receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Out {
    AwaitOpen,
    /// The receiver emitted up to this watermark; fast-forward once caught up.
    Open(Option<Timestamp>),
    /// Fast-forwarded; the last watermark forwarded.
    Forwarding(Option<Timestamp>),
    Closed,
}

#[derive(Debug)]
struct Outbound {
    buckets: Vec<BucketId>,
    state: Out,
    /// Buckets not pushed yet, in push order.
    unpushed: VecDeque<BucketId>,
    /// The bucket being pushed.
    pushing: Option<BucketId>,
    /// Records the receiver lets this task forward now ([`DrrsPeer::Credit`]).
    credit: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum In {
    Awaiting,
    Forwarding,
    Closed,
}

/// Records waiting for one incoming bucket: those forwarded by the sender, and those that came
/// directly from upstreams after the switch (they go after every forwarded one).
#[derive(Debug, Default)]
struct Waiting {
    peer: VecDeque<(usize, Record)>,
    direct: VecDeque<(usize, Record)>,
    /// The intake tag of the oldest record waiting (per-batch latency, `DrrsTask::take_process_tags`).
    since: u64,
}

impl Waiting {
    /// The wait of `bucket` in `waiting`, started with intake tag `tag` if nothing waited.
    fn of(waiting: &mut BTreeMap<BucketId, Waiting>, bucket: BucketId, tag: u64) -> &mut Waiting {
        let w = waiting.entry(bucket).or_default();
        if w.peer.is_empty() && w.direct.is_empty() {
            w.since = tag;
        }
        w
    }
}

/// A running subscale.
#[derive(Debug)]
struct Transition {
    sub: Arc<Subscale>,
    markers_pending: BTreeSet<InputChannel>,
    markers_seen: BTreeSet<InputChannel>,
    outbound: BTreeMap<TaskId, Outbound>,
    forward: BTreeMap<BucketId, TaskId>,
    inbound: BTreeMap<TaskId, (Vec<BucketId>, In)>,
    incoming: BTreeMap<BucketId, TaskId>,
    waiting: BTreeMap<BucketId, Waiting>,
    /// Buckets the receiver asked its sender to push first.
    asked: BTreeSet<BucketId>,
    /// Senders this receiver told `Received`.
    acked: BTreeSet<TaskId>,
    /// Receivers that told this sender `Received`.
    received: BTreeSet<TaskId>,
    ready_sent: bool,
    /// By sender: its window in this receiver's wait buffer and how much of it is in use.
    lent: BTreeMap<TaskId, room::Lent>,
}

impl Transition {
    fn epoch(&self) -> Epoch {
        self.sub.epoch
    }

    fn is_receiver(&self) -> bool {
        !self.inbound.is_empty()
    }

    /// Whether everything of the subscale is through here: markers (or ends of stream) on
    /// every data channel, every receiver's `Received` and every push sent, every sender told
    /// `Received`, nothing waiting.
    fn done(&self) -> bool {
        self.ready_sent
            && self.markers_pending.is_empty()
            && self.outbound.iter().all(|(to, o)| self.received.contains(to) && o.pushing.is_none())
            && self.inbound.keys().all(|from| self.acked.contains(from))
            && self.waiting.is_empty()
    }
}

/// Where a record that came directly from upstream goes.
enum Route {
    Local,
    Wait,
    Forward(TaskId, Epoch),
    Reject(ProtocolError),
}

/// The DRRS core of one target task.
#[derive(Debug)]
pub struct DrrsTask {
    id: TaskId,
    num_buckets: u16,
    /// Buckets whose state is here (a sender's until it pushes them).
    owned: BTreeSet<BucketId>,
    inputs: BTreeSet<InputChannel>,
    ended: BTreeSet<InputChannel>,
    watermarks: ChannelWatermarks,
    held: HeldTimes,
    emitted: Option<Timestamp>,
    /// The last subscale started here.
    epoch: Epoch,
    started: bool,
    /// The running subscales, by epoch (several under the overlapping schedule; they move
    /// disjoint buckets).
    subs: BTreeMap<Epoch, Transition>,
    early: Vec<(TaskId, DrrsPeer)>,
    /// Direct records that would wait are refused until the wait buffer drained to the
    /// low-water mark ([`Self::data_room`]).
    paused: bool,
    /// Records that ever waited (metrics).
    waited: u64,
    /// The tag records taken from now on carry (`Self::set_intake_tag`).
    intake_tag: u64,
    /// Ranges of this event's actions that hold released waiting records, with their oldest tag.
    released: Vec<(usize, usize, u64)>,
    /// Per `Process` action of the last event, the oldest intake tag of its records.
    process_tags: Vec<u64>,
    fault_process_before_state: bool,
    fault_watermark_before_state: bool,
    fault_unbounded_credit: bool,
}

impl DrrsTask {
    /// A task as deployed: an initial task owns its buckets, a new one waits for its first
    /// subscale.
    pub fn new(config: TaskConfig) -> Self {
        let mut watermarks = ChannelWatermarks::default();
        for &c in &config.inputs {
            watermarks.add(InputSource::Upstream(c));
        }
        Self {
            id: config.id,
            num_buckets: config.num_buckets.max(1),
            started: !config.inputs.is_empty() || !config.owned.is_empty(),
            owned: config.owned,
            inputs: config.inputs,
            ended: BTreeSet::new(),
            watermarks,
            held: HeldTimes::default(),
            emitted: None,
            epoch: 0,
            subs: BTreeMap::new(),
            early: Vec::new(),
            paused: false,
            waited: 0,
            intake_tag: 0,
            released: Vec::new(),
            process_tags: Vec::new(),
            fault_process_before_state: false,
            fault_watermark_before_state: false,
            fault_unbounded_credit: false,
        }
    }

    /// Expects records on one more data channel (a new task learns its channels with its first
    /// subscale). A channel that ended stays ended.
    pub fn add_input(&mut self, channel: InputChannel) {
        if !self.ended.contains(&channel) && self.inputs.insert(channel) {
            self.watermarks.add(InputSource::Upstream(channel));
        }
    }

    /// A restored task's input channels' watermarks as its checkpoint recorded them: its event
    /// time resumes there.
    pub fn restore_watermarks(&mut self, watermarks: impl IntoIterator<Item = (InputChannel, Timestamp)>) {
        self.watermarks.restore_upstream(watermarks);
        self.emitted = self.frontier();
    }

    /// Each input channel's last watermark, for a checkpoint.
    pub fn channel_watermarks(&self) -> Vec<(InputChannel, Option<Timestamp>)> {
        self.watermarks.upstream_marks()
    }

    /// Whether a data channel is still open here.
    pub fn has_inputs(&self) -> bool {
        !self.inputs.is_empty()
    }

    /// The task id.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Buckets whose state is here (processed here, or about to be pushed).
    pub fn owned_buckets(&self) -> Vec<BucketId> {
        self.owned.iter().copied().collect()
    }

    /// The open data channels from `upstream`.
    pub fn inputs_from(&self, upstream: TaskId) -> Vec<InputChannel> {
        self.inputs.iter().filter(|c| c.from == upstream).copied().collect()
    }

    /// Whether a subscale is running here.
    pub fn in_transition(&self) -> bool {
        !self.subs.is_empty()
    }

    /// How many subscales run here (several under the overlapping schedule).
    pub fn running_subscales(&self) -> usize {
        self.subs.len()
    }

    /// How many running subscales this task sends or receives buckets in.
    pub fn moving_subscales(&self) -> usize {
        self.subs.values().filter(|t| !t.inbound.is_empty() || !t.outbound.is_empty()).count()
    }

    /// Whether the task holds records it has not processed.
    pub fn is_busy(&self) -> bool {
        self.held.min().is_some()
    }

    /// Whether the task refuses direct records that would wait (its wait buffer filled its
    /// direct part and has not drained to the low-water mark yet; [`Self::data_room`]).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Records that waited in the wait buffer so far (for their bucket's state, or for the peer
    /// channel's close).
    pub fn waited_records(&self) -> u64 {
        self.waited
    }

    /// Records the task took and has not processed: its wait buffer, forwarded and direct records
    /// alike (the metric `queued_records`; at most [`Self::hold_bound`]).
    pub fn queued_records(&self) -> usize {
        self.held.len()
    }

    /// Sets the tag records taken from now on carry: an opaque, nondecreasing number from the
    /// runtime (its clock), so the core stays free of I/O.
    pub fn set_intake_tag(&mut self, tag: u64) {
        self.intake_tag = tag;
    }

    /// Per `Process` action of the last event's actions, in order, the oldest intake tag of its
    /// records: a record that waited for its bucket's state carries the tag it was taken with, so
    /// the runtime's per-batch latency includes the wait.
    pub fn take_process_tags(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.process_tags)
    }

    /// The last watermark the task emitted.
    pub fn emitted_watermark(&self) -> Option<Timestamp> {
        self.emitted
    }

    /// Fault injection for the simulator's negative tests: process records of an incoming
    /// bucket without waiting for its state.
    #[doc(hidden)]
    pub fn inject_fault_process_before_state(&mut self) {
        self.fault_process_before_state = true;
    }

    /// Fault injection for the simulator's negative tests: emit watermarks while a moved
    /// bucket's state and timers have not arrived.
    #[doc(hidden)]
    pub fn inject_fault_watermark_before_state(&mut self) {
        self.fault_watermark_before_state = true;
    }

    /// Fault injection for the simulator's negative tests: lend senders unbounded credit (the
    /// bound still counts the real windows), so forwarded records pile up past `wait_records`.
    #[doc(hidden)]
    pub fn inject_fault_unbounded_credit(&mut self) {
        self.fault_unbounded_credit = true;
    }

    /// Feeds one event; returns the actions to execute, in order.
    pub fn on(&mut self, event: TaskEvent) -> Vec<TaskAction> {
        let mut out = Vec::new();
        let result = match event {
            TaskEvent::Records { channel, records } => self.on_records(channel, records, &mut out),
            TaskEvent::Watermark { channel, time } => {
                if self.inputs.contains(&channel) {
                    self.watermarks.set(InputSource::Upstream(channel), time)
                } else {
                    Err(ProtocolError::UnknownChannel { channel })
                }
            }
            TaskEvent::Marker { channel, epoch } => self.on_marker(channel, epoch),
            TaskEvent::EndOfStream { channel } => self.on_end_of_stream(channel),
            TaskEvent::Start(sub) => self.on_start(sub, &mut out),
            TaskEvent::Peer { from, message } => self.on_peer(from, message, &mut out),
            TaskEvent::BucketArrived { from, epoch, bucket } => {
                self.on_arrived(from, epoch, bucket, &mut out)
            }
            TaskEvent::Pushed { to, bucket } => self.on_pushed(to, bucket),
        };
        if let Err(e) = result {
            out.push(TaskAction::Error(e));
        }
        self.pump(&mut out);
        self.tag_processes(&out);
        out
    }

    /// The oldest intake tag of each `Process` action in `out` (`Self::take_process_tags`).
    fn tag_processes(&mut self, out: &[TaskAction]) {
        let released = std::mem::take(&mut self.released);
        self.process_tags.clear();
        for (i, a) in out.iter().enumerate() {
            if matches!(a, TaskAction::Process { .. }) {
                let waited = released.iter().filter(|(from, to, _)| (*from..*to).contains(&i)).map(|r| r.2);
                self.process_tags.push(waited.fold(self.intake_tag, u64::min));
            }
        }
    }

    fn on_records(
        &mut self,
        channel: InputChannel,
        records: Vec<Record>,
        out: &mut Vec<TaskAction>,
    ) -> Result<(), ProtocolError> {
        if !self.inputs.contains(&channel) {
            return Err(ProtocolError::UnknownChannel { channel });
        }
        let input = channel.input;
        for record in records {
            let bucket = bucket_of(&record.key, self.num_buckets);
            match self.route_direct(channel, bucket) {
                Route::Local => process(out, input, record),
                Route::Wait => {
                    self.held.add(record.time);
                    self.waited += 1;
                    let from = self.wait(bucket, out);
                    let tag = self.intake_tag;
                    if let Some(t) = self.receiving_mut(bucket) {
                        Waiting::of(&mut t.waiting, bucket, tag).direct.push_back((input, record));
                    }
                    debug_assert!(from.is_some(), "a waiting bucket has a sender");
                }
                Route::Forward(to, epoch) => {
                    if self.take_credit(to, epoch) {
                        forward(out, to, epoch, input, record);
                    } else {
                        debug_assert!(false, "{}: a record forwarded to {to} past its credit", self.id);
                        out.push(TaskAction::Error(ProtocolError::UnexpectedPeerMessage {
                            peer: to,
                            epoch,
                            reason: "a record to forward past the credit the receiver gave (the runtime must ask `data_room`)".into(),
                        }));
                    }
                }
                Route::Reject(e) => out.push(TaskAction::Error(e)),
            }
        }
        Ok(())
    }

    /// The running subscale in which `bucket` comes to this task.
    fn receiving_mut(&mut self, bucket: BucketId) -> Option<&mut Transition> {
        self.subs.values_mut().find(|t| t.incoming.contains_key(&bucket))
    }

    /// Whether records of `bucket` may be processed here now (its state is here).
    fn has_state(&self, bucket: BucketId) -> bool {
        self.fault_process_before_state || self.owned.contains(&bucket)
    }

    fn route_direct(&self, channel: InputChannel, bucket: BucketId) -> Route {
        let misrouted = || ProtocolError::Misrouted { bucket, channel: InputSource::Upstream(channel) };
        for t in self.subs.values() {
            if let Some(sender) = t.incoming.get(&bucket) {
                return match t.inbound.get(sender).map(|(_, s)| *s) {
                    Some(In::Closed)
                        if self.has_state(bucket)
                            && t.waiting
                                .get(&bucket)
                                .is_none_or(|w| w.peer.is_empty() && w.direct.is_empty()) =>
                    {
                        Route::Local
                    }
                    Some(In::Closed | In::Forwarding) => Route::Wait,
                    _ => Route::Reject(misrouted()),
                };
            }
            if let Some(&to) = t.forward.get(&bucket) {
                if t.markers_seen.contains(&channel) {
                    return Route::Reject(ProtocolError::RecordAfterMarker { channel, epoch: t.epoch() });
                }
                return Route::Forward(to, t.epoch());
            }
        }
        if self.owned.contains(&bucket) { Route::Local } else { Route::Reject(misrouted()) }
    }

    /// A record of incoming `bucket` starts or keeps waiting: ask its sender to push the bucket
    /// first if its state is not here. Returns the sender.
    fn wait(&mut self, bucket: BucketId, out: &mut Vec<TaskAction>) -> Option<TaskId> {
        let has_state = self.has_state(bucket);
        let t = self.receiving_mut(bucket)?;
        let from = *t.incoming.get(&bucket)?;
        if !has_state && t.asked.insert(bucket) {
            let message = DrrsPeer::Prioritize { epoch: t.epoch(), bucket };
            out.push(TaskAction::SendToPeer { to: from, message });
        }
        Some(from)
    }

    fn on_marker(&mut self, channel: InputChannel, epoch: Epoch) -> Result<(), ProtocolError> {
        let unexpected = ProtocolError::UnexpectedMarker { channel, epoch };
        let t = self.subs.get_mut(&epoch).ok_or(unexpected.clone())?;
        if !t.markers_pending.remove(&channel) {
            return Err(unexpected);
        }
        t.markers_seen.insert(channel);
        Ok(())
    }

    fn on_end_of_stream(&mut self, channel: InputChannel) -> Result<(), ProtocolError> {
        // The coordinator's word that an upstream finished and the channel's own end (a channel
        // a switch dropped ends too) may both arrive: the second is no news.
        if self.ended.contains(&channel) {
            return Ok(());
        }
        if !self.inputs.remove(&channel) {
            return Err(ProtocolError::UnknownChannel { channel });
        }
        self.ended.insert(channel);
        self.watermarks.close(InputSource::Upstream(channel));
        for t in self.subs.values_mut() {
            // An ended channel carries no marker and nothing more routed by the old table.
            t.markers_pending.remove(&channel);
        }
        Ok(())
    }

    fn on_start(&mut self, sub: Arc<Subscale>, out: &mut Vec<TaskAction>) -> Result<(), ProtocolError> {
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
        let window = super::peer_window(sub.wait_records, inbound.len());
        let mut lent = BTreeMap::new();
        for &from in inbound.keys() {
            self.watermarks.add(InputSource::Peer(from));
            let credit = if self.fault_unbounded_credit { usize::MAX / 4 } else { window };
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

    fn on_peer(
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
        let has_state: BTreeSet<BucketId> = if self.fault_process_before_state {
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

    fn on_arrived(
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

    fn on_pushed(&mut self, to: TaskId, bucket: BucketId) -> Result<(), ProtocolError> {
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
    fn release(&mut self, bucket: BucketId, out: &mut Vec<TaskAction>) {
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

    /// Runs everything the last event may have unblocked.
    fn pump(&mut self, out: &mut Vec<TaskAction>) {
        loop {
            let mut changed = self.try_fast_forward(out);
            changed |= self.try_push(out);
            self.advance_watermark(out);
            changed |= self.check_ready_and_done(out);
            if !changed {
                break;
            }
        }
        self.return_credit(out);
        self.backpressure();
    }

    /// The event time the task may claim: the minimum over its channels, below every record it
    /// holds.
    fn frontier(&self) -> Option<Timestamp> {
        self.below_held(self.watermarks.min()?)
    }

    /// What a sender promises on its peer channels: its upstream channels bound what it forwards.
    /// The records it holds do not: each waits for a bucket this task *receives*, which it never
    /// also sends (a reconfiguration moves a bucket once), so the task processes them itself. Held
    /// below them, a task that receives and sends in one subscale (2 → 4 under the uniform policy:
    /// 0 → 1 → 2) could fast-forward to its receivers only once its own buckets had all arrived, and
    /// every subscale ran its pairs one hop after another (the full scale-out: ~19 s a subscale
    /// for ~7 s of transfer).
    fn sender_frontier(&self) -> Option<Timestamp> {
        self.watermarks.min_upstream()
    }

    fn below_held(&self, channels: Timestamp) -> Option<Timestamp> {
        match self.held.min() {
            None => Some(channels),
            Some(0) => None,
            Some(h) => Some(channels.min(h - 1)),
        }
    }

    fn try_fast_forward(&mut self, out: &mut Vec<TaskAction>) -> bool {
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
    fn try_push(&mut self, out: &mut Vec<TaskAction>) -> bool {
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

    fn advance_watermark(&mut self, out: &mut Vec<TaskAction>) {
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
                        && (self.fault_watermark_before_state
                            || (t.waiting.is_empty() && t.incoming.keys().all(|b| self.owned.contains(b)))))
            });
        if gate_open && self.emitted.is_none_or(|e| f > e) {
            self.emitted = Some(f);
            out.push(TaskAction::EmitWatermark(f));
        }
    }

    fn check_ready_and_done(&mut self, out: &mut Vec<TaskAction>) -> bool {
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
    fn check_transition(
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

/// Appends a record to the `Process` action at the end of `out` if it is of the same input.
fn process(out: &mut Vec<TaskAction>, input: usize, record: Record) {
    if let Some(TaskAction::Process { input: i, records }) = out.last_mut()
        && *i == input
    {
        records.push(record);
        return;
    }
    out.push(TaskAction::Process { input, records: vec![record] });
}

/// Appends a record to the forward at the end of `out` if it goes to the same peer and input.
fn forward(out: &mut Vec<TaskAction>, to: TaskId, epoch: Epoch, input: usize, record: Record) {
    if let Some(TaskAction::SendToPeer { to: t, message: DrrsPeer::Records { input: i, records, .. } }) =
        out.last_mut()
        && *t == to
        && *i == input
    {
        records.push(record);
        return;
    }
    out.push(TaskAction::SendToPeer {
        to,
        message: DrrsPeer::Records { epoch, input, records: vec![record] },
    });
}
