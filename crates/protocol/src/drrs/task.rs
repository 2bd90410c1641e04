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

use std::collections::{BTreeMap, BTreeSet};

use koala_types::{BucketId, Epoch, InputChannel, Record, TaskId, Timestamp, bucket_of};

use super::messages::DrrsPeer;
use crate::common::error::ProtocolError;
use crate::common::event_time::{ChannelWatermarks, HeldTimes};
use crate::common::input::InputSource;
use crate::fault::FaultSwitch;

mod events;
mod life;
mod peer;
mod progress;
mod room;
mod transition;

pub use events::{TaskAction, TaskConfig, TaskEvent};
pub use life::{DrrsLife, LoopHolds};
pub use room::low_water;
use transition::{In, Transition, Waiting};

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
    fault_process_before_state: FaultSwitch,
    fault_watermark_before_state: FaultSwitch,
    fault_unbounded_credit: FaultSwitch,
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
            fault_process_before_state: FaultSwitch::default(),
            fault_watermark_before_state: FaultSwitch::default(),
            fault_unbounded_credit: FaultSwitch::default(),
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
    #[cfg(any(test, feature = "sim"))]
    #[doc(hidden)]
    pub fn inject_fault_process_before_state(&mut self) {
        self.fault_process_before_state.set();
    }

    /// Fault injection for the simulator's negative tests: emit watermarks while a moved
    /// bucket's state and timers have not arrived.
    #[cfg(any(test, feature = "sim"))]
    #[doc(hidden)]
    pub fn inject_fault_watermark_before_state(&mut self) {
        self.fault_watermark_before_state.set();
    }

    /// Fault injection for the simulator's negative tests: lend senders unbounded credit (the
    /// bound still counts the real windows), so forwarded records pile up past `wait_records`.
    #[cfg(any(test, feature = "sim"))]
    #[doc(hidden)]
    pub fn inject_fault_unbounded_credit(&mut self) {
        self.fault_unbounded_credit.set();
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
        self.fault_process_before_state.on() || self.owned.contains(&bucket)
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
