//! The loop of a stateful task under DRRS (docs/protocols.md §11). Every input — records,
//! watermarks, markers, peer messages, pushed buckets — goes through the protocol's sans-IO core
//! ([`DrrsTask`], the one the simulator checks), which decides; this loop only executes its
//! actions: process the records whose state is here, forward records and watermarks to a
//! receiver, set a moved bucket's timers aside and push the bucket whole (its state by range
//! scan, then its timers) on the peer lane, install what arrives, stop taking data input while
//! the core says so (backpressure), emit watermarks, acknowledge.
//!
//! Pushed buckets travel on the peer lane, so between workers they pass the emulated link
//! (`[runtime] link_mb_per_sec`, `crate::throttle`). A bucket being pushed is a stream of
//! messages handed to its receiver's lane as the lane makes room; once the last one left (nothing
//! of it waits in the outbox) the core picks the next, a bucket records wait for first. A push in
//! progress never stops the task: it keeps taking input for the buckets it still owns and waits
//! on its queues and on the lanes it pushes into with a real deadline. Data input stops only
//! where the core says (`DrrsTask::data_room`, the bounded wait buffer: a record to forward
//! without the receiver's credit, a record that would wait past the buffer; the rest of its
//! batch and its channel wait in the intake, `super::koala_intake`) and for a full outbox.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Select, TryRecvError};
use koala_protocol::drrs::{DrrsLife, DrrsPeer, DrrsTask, LoopHolds, TaskAction, TaskConfig, TaskEvent};
use koala_protocol::{Deployment, TaskAck};
use koala_state::{StateKey, StateWrite};
use koala_types::{
    BucketId, ChannelMessage, Epoch, StateEntry, TaskId, Timestamp, bucket_of, decode, encode,
};
use serde::{Deserialize, Serialize};

use super::koala_intake::Intake;
use super::location::codec;
use super::operator::OperatorTask;
use super::{TaskCommand, TaskSetup};
use crate::RuntimeError;
use crate::channel::InputChannel;
use crate::checkpoint::{CoreCheckpoints, TaskMeta};
use crate::links::open_peer;
use crate::metrics::{BatchEnds, timer_bytes};
use crate::output::Outputs;
use crate::peer::Outbox;

/// Bytes of state per pushed message.
const CHUNK_BYTES: usize = 256 * 1024;

/// Messages the outbox may hold for full peer lanes before the task stops taking data input
/// (forwarded records wait there when a receiver is slower than the upstreams): the outbox stays
/// bounded and the backlog goes upstream. Pushed buckets do not count: they wait in
/// [`DrrsOperator::streams`], one bucket per receiver.
const OUTBOX_BOUND: usize = 64;

/// A bucket being pushed: what of it has not been handed to the receiver's lane yet.
struct Stream {
    bucket: BucketId,
    messages: VecDeque<ChannelMessage>,
}

/// What one task sends another on the peer lane under DRRS (a wire type: `crate::wire_schema`).
#[derive(Serialize, Deserialize)]
#[serde(rename = "DrrsWire")]
pub enum Wire {
    /// A message of the DRRS core.
    Peer(DrrsPeer),
    /// Part of a pushed bucket's state.
    Chunk {
        /// The bucket pushed.
        bucket: BucketId,
        /// Its entries in this part.
        entries: Vec<StateEntry>,
    },
    /// The end of a pushed bucket, with the timers set aside for it.
    BucketEnd {
        /// The reconfiguration.
        epoch: Epoch,
        /// The bucket pushed.
        bucket: BucketId,
        /// Its timers: due time and key.
        timers: Vec<(Timestamp, Vec<u8>)>,
    },
}

struct DrrsOperator {
    op: OperatorTask,
    core: DrrsTask,
    deployment: Arc<Deployment>,
    outbox: Outbox,
    watermark: Option<Timestamp>,
    epoch: u64,
    /// Data the core did not take yet (its wait buffer's bound, a receiver's credit).
    intake: Intake,
    /// Timers of buckets this task stopped processing, until their bucket's push.
    aside: Vec<(Timestamp, Vec<u8>)>,
    /// The bucket being pushed to each receiver (the core pushes one at a time per receiver);
    /// the core hears `Pushed` once all of it left (nothing of it waits in the outbox either).
    streams: BTreeMap<TaskId, Stream>,
    /// When it may exit, and a new task's channels until its first subscale: the rule the
    /// simulator checks.
    life: DrrsLife,
    /// Barrier alignment in front of the core, the deferred snapshot and its writer.
    checkpoints: CoreCheckpoints,
}

/// Runs a stateful task under DRRS until its inputs ended (it reports `InputsEnded`) and the
/// coordinator released it, or, cancelled, until it pushed every bucket and was released.
pub fn run_drrs_operator(mut setup: TaskSetup) -> Result<(), RuntimeError> {
    let mut op = OperatorTask::new(&mut setup)?;
    op.latency_by_caller = true;
    let d = setup.deployment.clone();
    let me = setup.task;
    let owned: BTreeSet<BucketId> = d
        .routing
        .get(&me.operator)
        .filter(|_| !setup.created_by_reconfiguration)
        .map(|t| t.iter().enumerate().filter(|(_, o)| **o == me.index).map(|(b, _)| b as BucketId).collect())
        .unwrap_or_default();
    let mut core = DrrsTask::new(TaskConfig {
        id: me,
        num_buckets: setup.num_buckets,
        owned,
        // A new task's core learns its channels with its first subscale (as the simulator
        // deploys it): before that it owns nothing and emits no watermark.
        inputs: if setup.created_by_reconfiguration { BTreeSet::new() } else { setup.inputs.clone() },
    });
    if setup.options.checkpoint.restore.is_some() {
        core.restore_watermarks(op.input_watermarks());
    }
    let watermark = core.emitted_watermark();
    let mut task = DrrsOperator {
        op,
        core,
        deployment: d,
        outbox: Outbox::default(),
        watermark,
        epoch: 0,
        intake: Intake::default(),
        aside: Vec::new(),
        streams: BTreeMap::new(),
        life: DrrsLife::new(setup.created_by_reconfiguration, setup.inputs.iter().copied()),
        checkpoints: CoreCheckpoints::new(me, setup.inputs.iter().copied(), setup.inbox.alignment_hold()),
    };
    let mut outputs = std::mem::replace(&mut setup.outputs, Outputs::new(Vec::new(), 1, Duration::ZERO));
    loop {
        // What waited for room first; then the gate holds back the channels still waiting.
        task.drain_intake(&setup, &mut outputs)?;
        task.intake.hold_back(&setup.inbox);
        let now = Instant::now();
        let gate = task.op.data_closed_until(now);
        let deadline = outputs
            .next_deadline()
            .map_or(task.op.metrics.next_tick(), |d| d.min(task.op.metrics.next_tick()));
        let deadline = gate.map_or(deadline, |g| g.min(deadline));
        let deadline = task.op.clock_deadline().map_or(deadline, |c| c.min(deadline));
        let outbox_full = task.outbox.waiting_len() >= OUTBOX_BOUND;
        let data_open = gate.is_none() && !outbox_full && !task.checkpoints.holds_input();
        // Held back by the protocol (records its core refused wait); a full outbox counts as
        // backpressure.
        task.op.metrics.input_paused(gate.is_none() && task.intake.has_data(), now);
        task.turn(&setup, &mut outputs, data_open, deadline.saturating_duration_since(now))?;
        task.pump_streams(&setup, &mut outputs)?;
        task.life.check_taking_part(&task.core);
        task.snapshot_when_idle(&setup, &mut outputs)?;
        task.checkpoints.check()?;
        let holds = task.holds();
        if let Some(epoch) = task.life.check_inputs_ended(&task.core, holds) {
            // Every input ended: fire every timer, end the outputs, and wait for the release.
            task.end_outputs(&setup, &mut outputs)?;
            setup.ack(epoch, TaskAck::InputsEnded);
        }
        if task.life.may_exit(&task.core, holds) {
            task.checkpoints.finish()?;
            if !task.life.inputs_ended() {
                // A cancelled task, released with every bucket pushed and its inputs open.
                task.end_outputs(&setup, &mut outputs)?;
            }
            setup.report_last(&mut task.op.metrics, &mut outputs);
            return Ok(());
        }
        let now = Instant::now();
        task.op.processing_tick(&setup, &mut outputs, now)?;
        outputs.flush_due(now)?;
        task.op.metrics.queued_records = Some(task.core.queued_records() as u64);
        setup.report(&mut task.op.metrics, &mut outputs, now);
    }
}

impl DrrsOperator {
    /// One turn: serve a command, a peer message or (if `data_open`) a data message, or move
    /// waiting messages into a peer lane that made room; or nothing within `timeout`.
    fn turn(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        data_open: bool,
        timeout: Duration,
    ) -> Result<(), RuntimeError> {
        let blocked = self.outbox.blocked();
        let mut ready = Select::new();
        let commands = ready.recv(&setup.commands);
        let peers = ready.recv(&setup.peer_inbox);
        let data = data_open.then(|| ready.recv(setup.inbox.queue()));
        for lane in &blocked {
            ready.send(lane);
        }
        let started = Instant::now();
        let which = ready.ready_timeout(timeout);
        if data.is_none() && !blocked.is_empty() {
            self.op.metrics.backpressure += started.elapsed();
        }
        // `ready` may report spuriously: every operation below is a try, and the loop comes back.
        match which {
            Err(_) => Ok(()),
            Ok(i) if i == commands => match setup.commands.try_recv() {
                Ok(cmd) => self.on_command(setup, outputs, cmd),
                Err(TryRecvError::Empty) => Ok(()),
                Err(TryRecvError::Disconnected) => Err(RuntimeError::WorkerGone(setup.task)),
            },
            Ok(i) if i == peers => match setup.peer_inbox.try_recv() {
                Ok(item) => self.on_peer(setup, outputs, item.channel.from, item.message),
                Err(_) => Ok(()),
            },
            Ok(i) if Some(i) == data => match setup.inbox.queue().try_recv() {
                Ok(item) => {
                    setup.inbox.took();
                    self.take_data(setup, outputs, item.channel, item.message)
                }
                Err(TryRecvError::Empty) => Ok(()),
                Err(TryRecvError::Disconnected) => Err(RuntimeError::InputClosed(setup.task)),
            },
            Ok(_) => self.outbox.flush(),
        }
    }

    /// Moves waiting messages into lanes with room, hands each push's next messages to its lane
    /// while the lane takes them, and tells the core of every push that left (it may start the
    /// next at once).
    fn pump_streams(&mut self, setup: &TaskSetup, outputs: &mut Outputs) -> Result<(), RuntimeError> {
        self.outbox.flush()?;
        loop {
            let mut left = Vec::new();
            for (&to, stream) in &mut self.streams {
                while !self.outbox.is_waiting_for(to)
                    && let Some(message) = stream.messages.pop_front()
                {
                    self.outbox.send(to, message)?;
                }
                if stream.messages.is_empty() && !self.outbox.is_waiting_for(to) {
                    left.push((to, stream.bucket));
                }
            }
            if left.is_empty() {
                return Ok(());
            }
            for (to, bucket) in left {
                self.streams.remove(&to);
                self.feed(setup, outputs, TaskEvent::Pushed { to, bucket })?;
            }
        }
    }

    /// A message taken off the data queue: through the barrier gate, then the intake, then the
    /// core.
    fn take_data(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        channel: InputChannel,
        message: ChannelMessage,
    ) -> Result<(), RuntimeError> {
        if let Some(message) = self.checkpoints.admit(channel, message)?
            && let Some(message) = self.intake.take(&self.core, channel, message)
        {
            self.on_data(setup, outputs, channel, message)?;
        }
        Ok(())
    }

    /// Takes an aligned checkpoint's snapshot once the core holds no record taken before the
    /// barrier (checkpoints never overlap a reconfiguration, so every bucket's state is at its
    /// owner), then takes what was held behind the barrier.
    fn snapshot_when_idle(&mut self, setup: &TaskSetup, outputs: &mut Outputs) -> Result<(), RuntimeError> {
        if self.checkpoints.pending().is_none()
            || self.core.is_busy()
            || self.core.in_transition()
            || self.intake.has_data()
        {
            return Ok(());
        }
        let meta = TaskMeta {
            watermarks: self.core.channel_watermarks(),
            timers: self.op.timers.pending(),
            cut: Default::default(),
        };
        let view = crate::checkpoint::freeze(setup, BTreeSet::new)?;
        let held = self.checkpoints.snapshot(setup, outputs, view, meta)?;
        for (channel, message) in held {
            self.take_data(setup, outputs, channel, message)?;
        }
        Ok(())
    }

    /// Feeds the core what waited in the intake for room, as far as it takes it now.
    fn drain_intake(&mut self, setup: &TaskSetup, outputs: &mut Outputs) -> Result<(), RuntimeError> {
        while let Some((channel, message)) = self.intake.next(&self.core) {
            self.on_data(setup, outputs, channel, message)?;
        }
        Ok(())
    }

    /// What the loop holds outside the core, which the exit rule (`DrrsLife`, the one the
    /// simulator checks) waits for.
    fn holds(&self) -> LoopHolds {
        LoopHolds {
            input: self.intake.has_data(),
            sends: self.outbox.has_waiting() || !self.streams.is_empty(),
        }
    }

    /// Fires every timer and ends the outputs.
    fn end_outputs(&mut self, setup: &TaskSetup, outputs: &mut Outputs) -> Result<(), RuntimeError> {
        self.op.advance(setup, outputs, Timestamp::MAX)?;
        outputs.flush_all()?;
        outputs.broadcast(&ChannelMessage::EndOfStream)
    }

    fn on_command(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        cmd: TaskCommand,
    ) -> Result<(), RuntimeError> {
        match cmd {
            TaskCommand::Prepare(plan) => {
                self.epoch = plan.epoch;
                self.deployment = Arc::new(plan.deployment.clone());
                self.life.prepared(&plan, setup.task);
                setup.ack(plan.epoch, TaskAck::Prepared);
            }
            TaskCommand::DrrsBegin(subscale) => {
                self.epoch = subscale.epoch;
                // A new task's core learns its open channels now.
                self.life.begin(&mut self.core, &subscale);
                self.feed(setup, outputs, TaskEvent::Start(subscale))?;
            }
            TaskCommand::Release => self.life.release(),
            TaskCommand::HandOver { .. } => {}
            // Outputs that ended carry nothing more, not even a marker; the coordinator stopped
            // counting on this task when it reported `InputsEnded`.
            TaskCommand::Switch(_) if self.life.inputs_ended() => {}
            TaskCommand::Switch(switch) => setup.switch_and_ack(&switch, outputs)?,
            TaskCommand::UpstreamEnded(upstream) => {
                for channel in self.life.upstream_ended(&self.core, upstream) {
                    self.checkpoints.on_end(&channel);
                    self.feed(setup, outputs, TaskEvent::EndOfStream { channel })?;
                }
            }
            TaskCommand::AddInputs { epoch, channels } => {
                for c in channels {
                    self.checkpoints.add_channel(c);
                    self.life.add_input(&mut self.core, c);
                }
                setup.ack(epoch, TaskAck::Prepared);
            }
            other => {
                tracing::error!(task = %setup.task, command = other.name(), "command a DRRS task does not take; ignored");
            }
        }
        Ok(())
    }

    fn on_data(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        channel: InputChannel,
        message: ChannelMessage,
    ) -> Result<(), RuntimeError> {
        let event = match message {
            ChannelMessage::Batch(records) => TaskEvent::Records { channel, records },
            ChannelMessage::Watermark(time) => TaskEvent::Watermark { channel, time },
            ChannelMessage::Marker(epoch) => TaskEvent::Marker { channel, epoch },
            ChannelMessage::EndOfStream => TaskEvent::EndOfStream { channel },
            other => {
                let message = super::transfer::message_kind(&other);
                return Err(RuntimeError::MisplacedMessage { task: setup.task, channel, message });
            }
        };
        self.feed(setup, outputs, event)
    }

    fn on_peer(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        from: TaskId,
        message: ChannelMessage,
    ) -> Result<(), RuntimeError> {
        let ChannelMessage::Protocol(bytes) = message else {
            let reason = "a non-protocol message on the peer channel".into();
            return Err(RuntimeError::Peer { task: setup.task, from, reason });
        };
        match decode::<Wire>(&bytes) {
            Ok(Wire::Peer(message)) => self.feed(setup, outputs, TaskEvent::Peer { from, message }),
            Ok(Wire::Chunk { bucket, entries }) => {
                if let Some(e) = entries.iter().find(|e| e.bucket != bucket) {
                    let reason = format!("a chunk of bucket {bucket} holds a key of bucket {}", e.bucket);
                    return Err(RuntimeError::Peer { task: setup.task, from, reason });
                }
                let writes: Vec<StateWrite> = entries
                    .into_iter()
                    .map(|e| {
                        StateWrite::Put(StateKey { bucket: e.bucket, state: e.state, key: e.key }, e.value)
                    })
                    .collect();
                self.op.metrics.state_writes += writes.len() as u64;
                if !writes.is_empty() {
                    store(setup)?.write_many(writes)?;
                }
                Ok(())
            }
            Ok(Wire::BucketEnd { epoch, bucket, timers }) => {
                self.op.timers.register(timers.into_iter().map(|(t, k)| (k, t)));
                self.feed(setup, outputs, TaskEvent::BucketArrived { from, epoch, bucket })
            }
            Err(e) => {
                let reason = format!("an undecodable peer message ({e})");
                Err(RuntimeError::Peer { task: setup.task, from, reason })
            }
        }
    }

    fn feed(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        event: TaskEvent,
    ) -> Result<(), RuntimeError> {
        self.core.set_intake_tag(self.op.metrics.batch_clock.tag_now());
        let actions = self.core.on(event);
        self.op.metrics.held(self.core.queued_records() as u64);
        let tags = self.core.take_process_tags();
        self.execute(setup, outputs, actions, tags)
    }

    fn execute(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        actions: Vec<TaskAction>,
        tags: Vec<u64>,
    ) -> Result<(), RuntimeError> {
        let nb = setup.num_buckets;
        // Per `Process`, when its oldest record was taken: the batch's latency includes the wait
        // for its bucket's state (`DrrsTask::take_process_tags`, `BatchClock`).
        let mut ends = BatchEnds::new(tags.into_iter().map(|t| (t, 1)));
        for action in actions {
            match action {
                TaskAction::Process { input, records } => {
                    let started = Instant::now();
                    let done = self.op.on_batch(setup, outputs, input, records, self.watermark)?;
                    let taken =
                        ends.processed().map_or(started, |tag| self.op.metrics.batch_clock.taken_at(tag));
                    self.op.metrics.batch_ended(taken, done);
                }
                TaskAction::SendToPeer { to, message } => self.send(setup, to, &Wire::Peer(message))?,
                TaskAction::DetachTimers { buckets, up_to } => {
                    let buckets: BTreeSet<BucketId> = buckets.into_iter().collect();
                    if let Some(up_to) = up_to {
                        self.op
                            .fire_due_where(setup, outputs, up_to, |k| buckets.contains(&bucket_of(k, nb)))?;
                    }
                    self.aside.extend(self.op.timers.take_where(|k| buckets.contains(&bucket_of(k, nb))));
                    // What this task emitted for these keys goes out before anything the new
                    // owner emits for them.
                    outputs.flush_all()?;
                }
                TaskAction::PushBucket { to, epoch, bucket } => self.push(setup, to, epoch, bucket)?,
                TaskAction::EmitWatermark(t) => {
                    self.watermark = Some(t);
                    self.op.advance(setup, outputs, t)?;
                }
                TaskAction::Ack { epoch, ack } => setup.ack(epoch, ack),
                TaskAction::Error(error) => {
                    tracing::error!(task = %setup.task, %error, "protocol surprise refused");
                    setup.ack(self.epoch, TaskAck::ProtocolError { error });
                }
            }
        }
        Ok(())
    }

    /// Starts pushing `bucket` whole to `to`: reads its state in chunks, then the timers set
    /// aside for it, into the receiver's stream (handed to the lane as it makes room); the bucket
    /// is gone here afterwards (one live copy).
    fn push(
        &mut self,
        setup: &TaskSetup,
        to: TaskId,
        epoch: Epoch,
        bucket: BucketId,
    ) -> Result<(), RuntimeError> {
        let store = store(setup)?;
        let mut chunks: Vec<Vec<StateEntry>> = Vec::new();
        let bytes = store.scan_buckets(&[bucket], CHUNK_BYTES, &mut |chunk| {
            chunks.push(
                chunk
                    .into_iter()
                    .map(|(k, value)| StateEntry { bucket: k.bucket, state: k.state, key: k.key, value })
                    .collect(),
            );
            Ok(())
        })?;
        let entries: usize = chunks.iter().map(Vec::len).sum();
        let mut messages = VecDeque::with_capacity(chunks.len() + 1);
        for entries in chunks {
            messages.push_back(wire_message(&Wire::Chunk { bucket, entries })?);
        }
        let nb = setup.num_buckets;
        let (timers, kept): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.aside).into_iter().partition(|(_, k)| bucket_of(k, nb) == bucket);
        self.aside = kept;
        let timers_bytes = timers.iter().map(|(_, k)| timer_bytes(k)).sum::<u64>();
        messages.push_back(wire_message(&Wire::BucketEnd { epoch, bucket, timers })?);
        self.open_lane(setup, to)?;
        if let Some(s) = self.streams.insert(to, Stream { bucket, messages }) {
            let reason = format!("bucket {bucket} pushed while bucket {} still was", s.bucket);
            return Err(RuntimeError::Peer { task: setup.task, from: to, reason });
        }
        store.delete_buckets(&[bucket])?;
        self.op.metrics.state_bytes_background += bytes + timers_bytes;
        tracing::debug!(task = %setup.task, %to, bucket, bytes, entries, "bucket pushed");
        Ok(())
    }

    /// Sends on the bounded peer lane through the outbox, which never blocks the task.
    fn send(&mut self, setup: &TaskSetup, to: TaskId, wire: &Wire) -> Result<(), RuntimeError> {
        self.open_lane(setup, to)?;
        self.outbox.send(to, wire_message(wire)?)
    }

    fn open_lane(&mut self, setup: &TaskSetup, to: TaskId) -> Result<(), RuntimeError> {
        if !self.outbox.is_open(to) {
            self.outbox.open(open_peer(&setup.links, &self.deployment, to, setup.task)?);
        }
        Ok(())
    }
}

fn wire_message(wire: &Wire) -> Result<ChannelMessage, RuntimeError> {
    Ok(ChannelMessage::Protocol(encode(wire).map_err(codec)?))
}

fn store(setup: &TaskSetup) -> Result<&dyn koala_state::StateBackend, RuntimeError> {
    setup
        .store
        .as_deref()
        .ok_or_else(|| RuntimeError::deployment(setup.task, "a keyed task without a state store"))
}
