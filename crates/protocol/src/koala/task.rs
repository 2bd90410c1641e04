//! The protocol core of one target task (paper §3.1–§3.4, Appendix A): ownership, key lookup,
//! the per-epoch transition, parking for per-key FIFO, event time, lazy fetches and progressive
//! migration. Events in, actions out; the runtime executes the actions in order.
//!
//! ```
//! use std::collections::BTreeSet;
//! use koala_protocol::koala::{KoalaTask, TaskAction, TaskConfig, TaskEvent};
//! use koala_types::{InputChannel, OperatorId, Record, TaskId};
//!
//! // A self-join: one upstream task feeds both inputs of the operator.
//! let (up, me) = (TaskId::new(OperatorId(0), 0), TaskId::new(OperatorId(1), 0));
//! let (left, right) = (InputChannel { input: 0, from: up }, InputChannel { input: 1, from: up });
//! let mut task = KoalaTask::new(TaskConfig {
//!     id: me,
//!     num_buckets: 4,
//!     owned: (0..4).collect(),
//!     inputs: BTreeSet::from([left, right]),
//! });
//! let r = Record { key: b"k".to_vec(), value: vec![], time: 5, due_ms: 0 };
//! let out = task.on(TaskEvent::Records { channel: right, records: vec![r.clone()] });
//! assert_eq!(out, vec![TaskAction::Process { input: 1, records: vec![r] }]);
//! // The event time is the minimum over both channels.
//! assert_eq!(task.on(TaskEvent::Watermark { channel: left, time: 5 }), vec![]);
//! let out = task.on(TaskEvent::Watermark { channel: right, time: 7 });
//! assert_eq!(out, vec![TaskAction::EmitWatermark(5)]);
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use koala_types::{BucketId, Epoch, InputChannel, PROCESSING_TIME, Record, TaskId, TimeDomain, Timestamp};

use super::awaited::AwaitedFilters;
use super::klt::KeyLookupTable;
use super::messages::PeerMessage;
use crate::common::error::ProtocolError;
use crate::common::event_time::{ChannelWatermarks, HeldTimes};
use crate::common::input::InputSource;
use crate::control::TaskAck;
use crate::fault::FaultSwitch;
use pipeline::{InputRecord, Pipeline};
use timers::{ACCESS, HandedTimers};
use transition::Transition;

pub use events::{TaskAction, TaskConfig, TaskEvent};

mod events;
pub(crate) mod limits;
pub(super) mod lookahead;
pub(crate) mod pipeline;
mod timers;
mod transition;

/// The task's own store, as the core's lookups need it: local first (docs/protocols.md §6).
pub trait LocalKeys {
    /// Which of `keys` have state in this task's store, in order (one call per batch).
    fn contains_many(&mut self, keys: &[&[u8]]) -> Vec<bool>;
    /// Called before (`started`) and after a batch's lookups, with the number of keys the store
    /// was asked about: the runtime times the lookup with it (metric `klt_lookup_mean_us`). A
    /// batch whose buckets all hold their state here makes no lookup: only the call after.
    fn lookup(&mut self, _started: bool, _probed: usize) {}
}

/// A store that never has a key (for tests and doc examples): correct, since a location that is
/// asked for a key it does not hold answers "not here", but every lookup of a key of a bucket
/// with a remote layer costs a round trip.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoLocalKeys;

impl LocalKeys for NoLocalKeys {
    fn contains_many(&mut self, keys: &[&[u8]]) -> Vec<bool> {
        vec![false; keys.len()]
    }
}

/// Where a record goes.
pub(super) enum Route {
    Local,
    Park,
    Forward(TaskId),
    Reject(ProtocolError),
}

/// The Koala protocol core of one target task.
#[derive(Debug)]
pub struct KoalaTask {
    pub(super) id: TaskId,
    pub(super) num_buckets: u16,
    pub(super) klt: KeyLookupTable,
    /// Open data channels: markers and ends of stream are counted per channel, not per upstream
    /// task, so a self-join's upstream is expected on both of its channels.
    pub(super) inputs: BTreeSet<InputChannel>,
    pub(super) ended: BTreeSet<InputChannel>,
    pub(super) watermarks: ChannelWatermarks,
    pub(super) held: HeldTimes,
    pub(super) emitted: Option<Timestamp>,
    /// The task's clock, from [`TaskEvent::ProcessingTime`].
    pub(super) clock: Option<Timestamp>,
    /// The last [`TaskAction::FireProcessingTimers`].
    pub(super) fired_processing: Option<Timestamp>,
    pub(super) pipeline: Pipeline,
    pub(super) epoch: Epoch,
    pub(super) transition: Option<Transition>,
    pub(super) early: Vec<(TaskId, PeerMessage)>,
    pub(super) retired: BTreeSet<TaskId>,
    pub(super) extra_keys: usize,
    pub(super) drain_keys_per_sec: u64,
    pub(super) drained: BTreeMap<TaskId, Epoch>,
    /// Fault injection: records of a moved bucket skip the wait for the peer channel.
    pub(super) fault_no_parking: FaultSwitch,
    /// Timers that came with hand-overs, held until their key is accessed ([`timers`]).
    pub(super) timers: HandedTimers,
    /// Fault injection: handed-over timers hold nothing (they fire on state that is elsewhere).
    pub(super) fault_no_timer_access: FaultSwitch,
    pub(super) started: bool,
    /// Records held ([`Self::queued_records`]) at which the task stops taking data input.
    pub(super) max_queued: usize,
    /// The tag records taken from now on carry ([`Self::set_intake_tag`]).
    pub(super) intake_tag: u64,
    /// Fault injection: the reverted hold-back rule ([`Self::inject_fault_hold_back_after_marker`]).
    pub(super) fault_hold_back_after_marker: FaultSwitch,
    /// Filter requests sent and not answered yet ([`Self::awaits_filters`]).
    pub(super) filters: AwaitedFilters,
}

impl KoalaTask {
    /// A task as deployed: an initial task owns its buckets, a new one waits for its first `Start`.
    pub fn new(config: TaskConfig) -> Self {
        let mut watermarks = ChannelWatermarks::default();
        for &c in &config.inputs {
            watermarks.add(InputSource::Upstream(c));
        }
        Self {
            id: config.id,
            num_buckets: config.num_buckets.max(1),
            started: !config.inputs.is_empty() || !config.owned.is_empty(),
            klt: KeyLookupTable::new(config.id, config.owned),
            inputs: config.inputs,
            ended: BTreeSet::new(),
            watermarks,
            held: HeldTimes::default(),
            emitted: None,
            clock: None,
            fired_processing: None,
            pipeline: Pipeline::default(),
            epoch: 0,
            transition: None,
            early: Vec::new(),
            retired: BTreeSet::new(),
            extra_keys: 0,
            drain_keys_per_sec: 0,
            drained: BTreeMap::new(),
            fault_no_parking: FaultSwitch::default(),
            timers: HandedTimers::default(),
            fault_no_timer_access: FaultSwitch::default(),
            max_queued: limits::DEFAULT_MAX_QUEUED_RECORDS,
            filters: AwaitedFilters::default(),
            intake_tag: 0,
            fault_hold_back_after_marker: FaultSwitch::default(),
        }
    }

    /// Expects records on one more data channel (an upstream operator was scaled out, or a new
    /// task learns its channels). The channel holds this task's event time until it sends a
    /// watermark. A channel that ended stays ended.
    pub fn add_input(&mut self, channel: InputChannel) {
        if !self.ended.contains(&channel) && self.inputs.insert(channel) {
            self.watermarks.add(InputSource::Upstream(channel));
        }
    }

    /// The task id.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Whether the task owns `bucket` now (may read and write its keys).
    pub fn owns(&self, bucket: BucketId) -> bool {
        self.klt.owns(bucket)
    }

    /// The buckets the task owns now.
    pub fn owned_buckets(&self) -> Vec<BucketId> {
        self.klt.owned().collect()
    }

    /// The key lookup table (read-only: metrics, checkpoints).
    pub fn klt(&self) -> &KeyLookupTable {
        &self.klt
    }

    /// Whether a data channel is still open here (its end of stream has not arrived).
    pub fn has_inputs(&self) -> bool {
        !self.inputs.is_empty()
    }

    /// The open data channels from `upstream` (markers and end of stream are expected on each;
    /// two for a self-join).
    pub fn inputs_from(&self, upstream: TaskId) -> Vec<InputChannel> {
        self.inputs.iter().filter(|c| c.from == upstream).copied().collect()
    }

    /// The last watermark the task emitted.
    pub fn emitted_watermark(&self) -> Option<Timestamp> {
        self.emitted
    }

    /// Whether a reconfiguration is running at this task.
    pub fn in_transition(&self) -> bool {
        self.transition.is_some()
    }

    /// Whether the task holds records it has not processed or has a fetch outstanding.
    pub fn is_busy(&self) -> bool {
        self.held.min().is_some() || !self.pipeline.is_quiet() || !self.timers.is_idle()
    }

    /// Whether the task may take a checkpoint's snapshot now (rule 1 of the cut, `cut.rs`): it
    /// holds no record it took and has no fetch or pull outstanding. Handed-over timers that wait
    /// for their key's state do not hold a snapshot back: they wait for event time the barrier
    /// holds back, and their keys' state is in the old location's snapshot.
    pub fn may_snapshot(&self) -> bool {
        self.queued_records() == 0 && self.pipeline.is_quiet()
    }

    /// Whether a filter this task asked for has not arrived yet: the location must not be
    /// released meanwhile, so the task does not report `InputsEnded` (`TaskLife`).
    pub fn awaits_filters(&self) -> bool {
        self.filters.any()
    }

    /// The last checkpoint the task snapshotted or was restored from: the tag its fetches and
    /// pulls carry from now on (the checkpoint cut, `cut.rs`). Set only while no fetch is
    /// outstanding (a task snapshots only then).
    pub fn set_checkpoint(&mut self, id: koala_types::CheckpointId) {
        debug_assert!(self.pipeline.is_quiet(), "a checkpoint tag changed with a fetch outstanding");
        self.pipeline.checkpoint = id;
    }

    /// A restored task's input channels' watermarks as its checkpoint recorded them: its event
    /// time resumes there, not from nothing (records late then are late now).
    pub fn restore_watermarks(&mut self, watermarks: impl IntoIterator<Item = (InputChannel, Timestamp)>) {
        self.watermarks.restore_upstream(watermarks);
        self.emitted = self.frontier();
    }

    /// Each input channel's last watermark, for a checkpoint.
    pub fn channel_watermarks(&self) -> Vec<(InputChannel, Option<Timestamp>)> {
        self.watermarks.upstream_marks()
    }

    /// Sets `[runtime] max_queued_records` (at least 1): see [`Self::takes_data`].
    pub fn set_max_queued_records(&mut self, max: usize) {
        self.max_queued = max.max(1);
    }

    /// Records the task took from its inputs (data channels and peer lanes) and has not handed to
    /// the operator yet: queued, parked for per-key order, or in a batch waiting for state (the
    /// metric `queued_records`), including records forwarded to it before its `Start` (kept until
    /// then). Accesses of handed-over timers queued beside them are no input and do not count.
    pub fn queued_records(&self) -> usize {
        let early: usize = self
            .early
            .iter()
            .map(|(_, m)| match m {
                PeerMessage::Records { records, .. } => records.len(),
                _ => 0,
            })
            .sum();
        self.held.len().saturating_sub(self.timers.queued) + early
    }

    /// Sets the tag records taken from now on carry: an opaque, nondecreasing number from the
    /// runtime (its clock; the simulator's step), so the core stays free of I/O. A batch reports
    /// the smallest tag of its records ([`Self::take_batches`]).
    pub fn set_intake_tag(&mut self, tag: u64) {
        self.intake_tag = tag;
    }

    /// The batches handed to the operator (`TaskAction::Process`) since the last call, in the
    /// order of their actions: per batch, the smallest intake tag of its records and how many
    /// `Process` actions carry it. The runtime's per-batch latency runs from that tag to the end of
    /// the batch's last action, so it includes every wait for state (fetches, hand-overs).
    pub fn take_batches(&mut self) -> Vec<pipeline::BatchTaken> {
        std::mem::take(&mut self.pipeline.batches)
    }

    /// Fault injection for the simulator's negative tests: process records of a moved bucket that
    /// arrive directly from upstreams without waiting for the peer channel (breaks per-key FIFO).
    #[cfg(any(test, feature = "sim"))]
    #[doc(hidden)]
    pub fn inject_fault_no_parking(&mut self) {
        self.fault_no_parking.set();
    }

    /// Fault injection for the simulator's negative tests: timers that come with a hand-over
    /// neither hold the event time nor have their keys accessed, so they fire on state that is
    /// still at the sender.
    #[cfg(any(test, feature = "sim"))]
    #[doc(hidden)]
    pub fn inject_fault_no_timer_access(&mut self) {
        self.fault_no_timer_access.set();
    }

    /// Feeds one event; returns the actions to execute, in order. Lookups treat the local store
    /// as empty ([`NoLocalKeys`]); the runtime and the simulator use [`Self::on_with`].
    pub fn on(&mut self, event: TaskEvent) -> Vec<TaskAction> {
        self.on_with(event, &mut NoLocalKeys)
    }

    /// Feeds one event, with the task's store for local-first lookups; returns the actions to
    /// execute, in order.
    pub fn on_with(&mut self, event: TaskEvent, local: &mut dyn LocalKeys) -> Vec<TaskAction> {
        let mut out = Vec::new();
        self.klt.trim_memo();
        let result = match event {
            TaskEvent::Records { channel, records } => self.on_records(channel, records, &mut out),
            TaskEvent::Watermark { channel, time } => self.on_watermark(channel, time),
            TaskEvent::Marker { channel, epoch } => self.on_marker(channel, epoch),
            TaskEvent::EndOfStream { channel } => self.on_end_of_stream(channel),
            TaskEvent::Start(reconfiguration) => self.on_start(reconfiguration, &mut out),
            TaskEvent::Peer { from, message } => self.on_peer(from, message, &mut out),
            TaskEvent::FetchRequest { from, request } => self.on_fetch_request(from, request, &mut out),
            TaskEvent::FetchResponse { from, response } => self.on_fetch_response(from, response, &mut out),
            TaskEvent::FilterRequest { from, request } => {
                // Every request is answered, so the asker knows when nobody owes it one (it
                // reports `InputsEnded` only then, `TaskLife`). If this task owns the bucket again,
                // the asker handed it on since and drops the answer.
                out.push(TaskAction::BuildFilter { to: from, request });
                Ok(())
            }
            TaskEvent::Filter { from, response } => {
                self.filters.arrived(from, response.bucket);
                self.klt.filter_arrived(from, response.bucket, response.since, response.filter);
                Ok(())
            }
            TaskEvent::Wake => {
                self.pipeline.drain_resting = false;
                Ok(())
            }
            TaskEvent::ProcessingTime { now } => {
                self.clock = Some(self.clock.map_or(now, |c| c.max(now)));
                Ok(())
            }
        };
        if let Err(e) = result {
            out.push(TaskAction::Error(e));
        }
        self.pump(&mut out, local);
        out
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
        let mut forwards: BTreeMap<TaskId, Vec<Record>> = BTreeMap::new();
        for record in records {
            let r = InputRecord::arrived(input, record, self.num_buckets).taken_at(self.intake_tag);
            match self.route_direct(channel, r.bucket) {
                Route::Local => self.admit(r),
                Route::Park => {
                    self.held.add(r.record.time);
                    if let Some(t) = self.transition.as_mut() {
                        t.parked.entry(r.bucket).or_default().push_back(r);
                    }
                }
                Route::Forward(to) => forwards.entry(to).or_default().push(r.record),
                Route::Reject(e) => out.push(TaskAction::Error(e)),
            }
        }
        for (to, records) in forwards {
            out.push(TaskAction::SendToPeer {
                to,
                message: PeerMessage::Records { epoch: self.epoch, input, records },
            });
        }
        Ok(())
    }

    /// Where a record of `bucket` that came directly from upstream on `channel` goes.
    fn route_direct(&self, channel: InputChannel, bucket: BucketId) -> Route {
        if let Some(t) = &self.transition
            && let Some(route) = t.route_direct(channel, bucket, !self.fault_no_parking.on())
        {
            return route;
        }
        if self.klt.owns(bucket) {
            Route::Local
        } else {
            Route::Reject(ProtocolError::Misrouted { bucket, channel: InputSource::Upstream(channel) })
        }
    }

    /// Queues an owned record for processing.
    pub(super) fn admit(&mut self, r: InputRecord) {
        self.held.add(r.record.time);
        self.pipeline.inbox.push_back(r);
    }

    fn on_watermark(&mut self, channel: InputChannel, time: Timestamp) -> Result<(), ProtocolError> {
        if !self.inputs.contains(&channel) {
            return Err(ProtocolError::UnknownChannel { channel });
        }
        self.watermarks.set(InputSource::Upstream(channel), time)
    }

    fn on_end_of_stream(&mut self, channel: InputChannel) -> Result<(), ProtocolError> {
        if !self.inputs.remove(&channel) {
            return Err(ProtocolError::UnknownChannel { channel });
        }
        self.ended.insert(channel);
        self.watermarks.close(InputSource::Upstream(channel));
        if let Some(t) = self.transition.as_mut() {
            // An ended channel carries no marker; nothing its upstream routed on it by the old
            // table is in flight.
            t.markers_pending.remove(&channel);
        }
        Ok(())
    }

    /// Runs everything the last event may have unblocked, until nothing changes; then pulls
    /// from retired locations that have no pull outstanding.
    fn pump(&mut self, out: &mut Vec<TaskAction>, local: &mut dyn LocalKeys) {
        loop {
            let mut changed = self.try_hand_over(out);
            changed |= self.queue_timer_accesses();
            self.look_ahead(out, local);
            changed |= self.try_process(out, local);
            self.advance_watermark(out);
            self.advance_processing_time(out);
            changed |= self.check_ready_and_done(out);
            if !changed {
                break;
            }
        }
        self.pull(out);
        self.report_drained(out);
    }

    /// The event time the task may claim now: the minimum over its input channels, kept below
    /// every record it holds (parked, queued, waiting for state).
    pub(super) fn frontier(&self) -> Option<Timestamp> {
        self.below_held(self.watermarks.min()?)
    }

    /// The event time a sender promises on its peer channels: records it forwards come from its
    /// upstreams, so its own inbound peer channels do not bound them (and must not: two tasks that
    /// send to each other would wait on each other's hand-over).
    pub(super) fn sender_frontier(&self) -> Option<Timestamp> {
        self.below_held(self.watermarks.min_upstream()?)
    }

    fn below_held(&self, channels: Timestamp) -> Option<Timestamp> {
        let held = match (self.held.min(), self.timers.hold()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match held {
            None => Some(channels),
            Some(0) => None,
            Some(h) => Some(channels.min(h - 1)),
        }
    }

    fn advance_watermark(&mut self, out: &mut Vec<TaskAction>) {
        if let Some(f) = self.sender_frontier()
            && let Some(t) = self.transition.as_mut()
        {
            t.forward_watermark(f, out);
        }
        let Some(f) = self.frontier() else { return };
        // Algorithm 1 line 4: no advance before every expected marker arrived.
        // Only a receiver gates: a task that only sends (or neither sends nor receives) keeps its
        // event time, since nothing of the moved buckets comes back to it.
        let gate_open = self.started
            && self.transition.as_ref().is_none_or(|t| t.markers_pending.is_empty() || !t.is_receiver());
        if gate_open && self.emitted.is_none_or(|e| f > e) {
            self.emitted = Some(f);
            out.push(TaskAction::EmitWatermark(f));
        }
    }

    /// Lets the runtime fire processing-time timers up to the clock, below every handed-over
    /// processing-time timer whose key's access is not through yet (`timers`).
    fn advance_processing_time(&mut self, out: &mut Vec<TaskAction>) {
        let Some(clock) = self.clock else { return };
        let queued = self.held.min_from(PROCESSING_TIME).map(|t| TimeDomain::of(t).1);
        let held = match (self.timers.processing_hold(), queued) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let up_to = match held {
            None => clock,
            Some(0) => return,
            Some(h) => clock.min(h - 1),
        };
        if self.fired_processing.is_none_or(|f| up_to > f) {
            self.fired_processing = Some(up_to);
            out.push(TaskAction::FireProcessingTimers { up_to });
        }
    }

    /// Reports retired locations this task's KLT no longer points at and owes no filter
    /// (outside transitions; `super::awaited`).
    fn report_drained(&mut self, out: &mut Vec<TaskAction>) {
        if self.transition.is_some() || !self.pipeline.is_quiet() {
            return;
        }
        for &loc in &self.retired {
            if loc == self.id
                || self.drained.get(&loc) == Some(&self.epoch)
                || self.klt.references(loc)
                || self.filters.from(loc)
            {
                continue;
            }
            self.drained.insert(loc, self.epoch);
            out.push(TaskAction::Ack { epoch: self.epoch, ack: TaskAck::LocationDrained { location: loc } });
        }
    }

    /// Records of the inbox that belong to `buckets`, removed in order (for a hand-over). Timer
    /// accesses of those buckets are dropped: the timers travel with the runtime's.
    pub(super) fn take_inbox(&mut self, buckets: &BTreeSet<BucketId>) -> Vec<InputRecord> {
        let (moved, kept): (VecDeque<InputRecord>, VecDeque<InputRecord>) =
            std::mem::take(&mut self.pipeline.inbox).into_iter().partition(|r| buckets.contains(&r.bucket));
        self.pipeline.inbox = kept;
        self.pipeline.inbox_reshaped();
        for r in &moved {
            self.held.remove(r.record.time);
        }
        self.timers.drop_buckets(buckets, self.num_buckets);
        let (accesses, records): (Vec<InputRecord>, Vec<InputRecord>) =
            moved.into_iter().partition(|r| r.input == ACCESS);
        self.timers.queued -= accesses.len();
        records
    }
}

/// What the exit rule (`crate::common::life::TaskLife`) reads of the core.
impl crate::common::life::CoreActivity for KoalaTask {
    fn has_inputs(&self) -> bool {
        KoalaTask::has_inputs(self)
    }
    fn is_busy(&self) -> bool {
        KoalaTask::is_busy(self)
    }
    fn awaits_filters(&self) -> bool {
        KoalaTask::awaits_filters(self)
    }
    fn in_transition(&self) -> bool {
        KoalaTask::in_transition(self)
    }
}
