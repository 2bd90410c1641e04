//! The loop of a stateful task under the Koala protocol (paper §3; docs/protocols.md §3). Every input —
//! records, watermarks, markers, peer messages, fetches — goes through the protocol's sans-IO core
//! ([`KoalaTask`]), which decides; this loop only executes the core's actions: process a batch
//! whose keys are local, fetch remote keys from their KLT location in one hop, serve (and delete:
//! one live copy) keys others fetch, hand buckets over, emit watermarks, acknowledge.
//!
//! Records keep the operator input they arrived on through the core (`TaskEvent::Records` names
//! the channel, `TaskAction::Process` the input), and the core counts markers and ends of stream
//! per channel, so a self-join (one upstream task on both inputs) needs nothing special here.
//!
//! A hand-over carries the timers of the moved buckets (`HandOver::timers`), not their keys'
//! state (lazy windows): the state of a key with an open window stays where it is, like any
//! other key's, until a record of it or its timer needs it; the core holds the watermark that
//! fires the timer until the key's state is here (`koala_protocol::koala` timers), so a timer
//! always fires on local state. The core looks keys up in the task's own store first
//! (`StoreKeys`). An old location builds the membership filter of a bucket it handed over when
//! the owner asks, a few thousand keys per turn of the loop between its inputs, and sends it on
//! the fetch lane.
//!
//! The loop never blocks on a peer (`crate::peer`): fetches and their answers go on the fetch
//! lane, which nobody waits on; peer messages go on the bounded peer lane through an outbox, and
//! while anything waits there the loop serves commands and its own lanes but takes no data.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::select;
use koala_protocol::koala::{
    CheckpointCut, FetchRequest, FetchResponse, FilterBuild, FilterRequest, FilterResponse, KoalaTask,
    PeerMessage, PullCursors, TaskConfig, TaskEvent, TaskLife,
};
use koala_protocol::{Deployment, TaskAck, UnstartedInputs};
use koala_state::StateKey;
use koala_types::{BucketId, ChannelMessage, TaskId, Timestamp, decode};
use serde::{Deserialize, Serialize};

use super::koala_intake::Intake;
use super::location::{StoreKeys, StoreLocation};
use super::operator::OperatorTask;
use super::{TaskCommand, TaskSetup};
use crate::RuntimeError;
use crate::channel::{ChannelSender, InputChannel};
use crate::checkpoint::{CoreCheckpoints, TaskMeta};
use crate::output::Outputs;
use crate::peer::Outbox;

mod actions;
use actions::store;
mod wait;

#[cfg(test)]
mod test_harness;
#[cfg(test)]
mod tests_serve;

/// Keys a filter build reads per turn of the loop, between two inputs.
const FILTER_BUILD_STEP: usize = 4096;

/// A batch slower than this (`BatchClock`) is logged at debug level with the core's queue and
/// filter builds (the metrics log its latency and its queueing beside it).
const SLOW_BATCH: Duration = Duration::from_millis(50);

/// What one task sends another on a peer channel under Koala (a wire type: `crate::wire_schema`).
#[derive(Serialize, Deserialize)]
#[serde(rename = "KoalaWire")]
pub enum Wire {
    /// A message of the Koala core.
    Peer(PeerMessage),
    /// A request for keys' state.
    Fetch(FetchRequest),
    /// The answer to a fetch.
    Answer(FetchResponse),
    /// A request for a location's membership filter.
    FilterRequest(FilterRequest),
    /// The filter asked for.
    Filter(FilterResponse),
}

struct KoalaOperator {
    op: OperatorTask,
    core: KoalaTask,
    deployment: Arc<Deployment>,
    /// Where progressive pulls of each requester stopped in each bucket of this task's store.
    pull_cursors: PullCursors<StateKey>,
    /// Filters of handed-over buckets being built for the owners that asked, a step per turn.
    builds: VecDeque<(TaskId, FilterRequest, FilterBuild<StateKey>)>,
    /// When the core asked to be woken (the background drain's rate limit).
    wake_at: Option<Instant>,
    /// Fetch lanes to peers (requests and responses; never waited on, `crate::peer`).
    fetch_lanes: HashMap<TaskId, ChannelSender>,
    /// Peer lanes to peers, with what a full one could not take yet.
    outbox: Outbox,
    /// Input taken off the data queue and peer lane that the core did not take yet (the bound).
    intake: Intake,
    /// A task a reconfiguration created, until its first `Begin`: the input channels it will
    /// have, and those that ended already (their upstream finished before it switched). The core
    /// learns them at `Begin`, so before it owns anything it emits no watermark and does not end.
    unstarted: UnstartedInputs,
    watermark: Option<Timestamp>,
    /// When its inputs ended and when it may exit: the rule the simulator checks.
    life: TaskLife,
    /// Barrier alignment in front of the core, the deferred snapshot and its writer.
    checkpoints: CoreCheckpoints,
    /// Its side of the checkpoint cut: what it served to owners past its snapshot, what it
    /// installed since its last one.
    cut: CheckpointCut,
}

/// Runs a stateful task under Koala until every input ended and the coordinator released it.
pub fn run_koala_operator(mut setup: TaskSetup) -> Result<(), RuntimeError> {
    let op = OperatorTask::new(&mut setup)?;
    let d = setup.deployment.clone();
    let me = setup.task;
    // A task a reconfiguration created owns nothing until buckets are handed over to it.
    let owned: BTreeSet<BucketId> = d
        .routing
        .get(&me.operator)
        .filter(|_| !setup.created_by_reconfiguration)
        .map(|t| t.iter().enumerate().filter(|(_, o)| **o == me.index).map(|(b, _)| b as BucketId).collect())
        .unwrap_or_default();
    let mut core = KoalaTask::new(TaskConfig {
        id: me,
        num_buckets: setup.num_buckets,
        owned,
        // A new task's core learns its channels at its first `Start` (as the simulator deploys
        // it): before that it owns nothing and must emit no watermark, since its senders hand it
        // records without waiting for its event time.
        inputs: if setup.created_by_reconfiguration { BTreeSet::new() } else { setup.inputs.clone() },
    });
    core.set_max_queued_records(setup.options.max_queued_records);
    // A restored task resumes its channels' event time and its requests' checkpoint tag.
    let restored = setup.options.checkpoint.restore.as_ref().map_or(0, |p| p.id);
    if restored > 0 {
        core.set_checkpoint(restored);
        core.restore_watermarks(op.input_watermarks());
    }
    let watermark = core.emitted_watermark();
    let mut op = op;
    op.latency_by_caller = true;
    let mut task = KoalaOperator {
        op,
        core,
        deployment: d,
        pull_cursors: PullCursors::new(),
        builds: VecDeque::new(),
        wake_at: None,
        fetch_lanes: HashMap::new(),
        outbox: Outbox::default(),
        intake: Intake::default(),
        unstarted: UnstartedInputs::new(setup.created_by_reconfiguration, setup.inputs.iter().copied()),
        watermark,
        life: TaskLife::new(setup.created_by_reconfiguration),
        checkpoints: CoreCheckpoints::new(me, setup.inputs.iter().copied(), setup.inbox.alignment_hold()),
        cut: CheckpointCut::new(restored),
    };
    let mut outputs = std::mem::replace(&mut setup.outputs, Outputs::new(Vec::new(), 1, Duration::ZERO));
    let closed = crossbeam_channel::never();
    loop {
        // What waited for room first; then the gate holds back the channels still waiting.
        task.drain_intake(&setup, &mut outputs)?;
        task.intake.hold_back(&setup.inbox);
        let now = Instant::now();
        // The processing budget holds back data input only (`crate::throttle`).
        let gate = task.op.data_closed_until(now);
        // So does a full inbox: what the task holds drains without data input (`takes_data`),
        // and part of a forwarded batch waiting for room (it goes first).
        let full = !task.core.takes_data() || task.intake.peer_waiting();
        let held_back = full && gate.is_none() && !task.outbox.has_waiting();
        let data_waiting = held_back && (!setup.inbox.queue().is_empty() || task.intake.has_data());
        task.op.metrics.input_paused(data_waiting, now);
        let deadline = outputs
            .next_deadline()
            .map_or(task.op.metrics.next_tick(), |d| d.min(task.op.metrics.next_tick()));
        let deadline = task.wake_at.map_or(deadline, |w| w.min(deadline));
        let deadline = task.op.clock_deadline().map_or(deadline, |c| c.min(deadline));
        let deadline = gate.map_or(deadline, |g| g.min(deadline));
        // A filter being built takes a step whenever no input is waiting.
        let timeout =
            if task.builds.is_empty() { deadline.saturating_duration_since(now) } else { Duration::ZERO };
        if task.outbox.has_waiting() {
            task.wait_for_peers(&setup, &mut outputs, timeout)?;
        } else if held_back && !data_waiting {
            // Full, and nothing waits upstream yet: also wake when data arrives (the pause
            // starts then), without taking it.
            task.wait_while_full(&setup, &mut outputs, timeout)?;
        } else {
            select! {
                recv(setup.commands) -> cmd => match cmd {
                    Ok(cmd) => task.on_command(&setup, &mut outputs, cmd)?,
                    Err(_) => return Err(RuntimeError::WorkerGone(me)),
                },
                recv(setup.fetch_inbox) -> item => {
                    if let Ok(item) = item {
                        task.on_peer(&setup, &mut outputs, item.channel.from, item.message)?;
                    }
                },
                recv(if task.intake.peer_waiting() { &closed } else { &setup.peer_inbox }) -> item => {
                    if let Ok(item) = item {
                        task.on_peer(&setup, &mut outputs, item.channel.from, item.message)?;
                    }
                },
                recv(if gate.is_some() || full || task.checkpoints.holds_input() { &closed } else { setup.inbox.queue() }) -> item => {
                    let Ok(item) = item else {
                        return Err(RuntimeError::InputClosed(me));
                    };
                    setup.inbox.took();
                    task.take_data(&setup, &mut outputs, item.channel, item.message)?;
                },
                default(timeout) => {}
            }
        }
        if !task.builds.is_empty() {
            // Fetches, their answers and filter requests come before a build step: they share
            // the fetch lane (FIFO) with the filter requests that started the builds, and taken
            // one per turn, a receiver's first fetch waited behind every filter request it had
            // sent, one build step each (the 10 M-key scale-in: 68 requests, 80 ms).
            task.serve_fetch_lane(&setup, &mut outputs)?;
        }
        task.build_filters(&setup)?;
        let now = Instant::now();
        if task.wake_at.is_some_and(|w| now >= w) {
            task.wake_at = None;
            task.feed(&setup, &mut outputs, TaskEvent::Wake)?;
        }
        if let Some(clock) = task.op.clock_due(now) {
            // Processing-time timers fire when the core says their keys' state is here.
            task.feed(&setup, &mut outputs, TaskEvent::ProcessingTime { now: clock })?;
        }
        task.snapshot_when_idle(&setup, &mut outputs)?;
        task.check_inputs_ended(&setup, &mut outputs)?;
        if task.life.may_exit() && !task.outbox.has_waiting() {
            // Released (no live task points here any more), nothing left to process or send.
            task.checkpoints.finish()?;
            task.sample_klt();
            setup.report_last(&mut task.op.metrics, &mut outputs);
            return Ok(());
        }
        if now >= task.op.metrics.next_tick() {
            task.sample_klt();
        }
        task.checkpoints.check()?;
        outputs.flush_due(now)?;
        setup.report(&mut task.op.metrics, &mut outputs, now);
    }
}

impl KoalaOperator {
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

    /// Takes an aligned checkpoint's snapshot once the core has processed everything taken
    /// before the barrier and has no fetch outstanding (the checkpoint cut, docs/protocols.md
    /// §13), then takes what was held behind the barrier.
    fn snapshot_when_idle(&mut self, setup: &TaskSetup, outputs: &mut Outputs) -> Result<(), RuntimeError> {
        let Some(id) = self.checkpoints.pending() else { return Ok(()) };
        if !self.core.may_snapshot() || self.intake.has_data() || self.intake.peer_waiting() {
            return Ok(());
        }
        let meta = TaskMeta {
            watermarks: self.core.channel_watermarks(),
            timers: self.op.timers.pending(),
            cut: self.cut.snapshot(id),
        };
        self.core.set_checkpoint(id);
        let view = crate::checkpoint::freeze(setup, BTreeSet::new)?;
        let held = self.checkpoints.snapshot(setup, outputs, view, meta)?;
        for (channel, message) in held {
            self.take_data(setup, outputs, channel, message)?;
        }
        Ok(())
    }

    /// Records the KLT's size and the records the core holds for the next metrics sample.
    fn sample_klt(&mut self) {
        let klt = self.core.klt();
        self.op.metrics.klt_size = Some((klt.approx_bytes() as u64, klt.entries() as u64));
        self.op.metrics.queued_records = Some(self.core.queued_records() as u64);
    }

    fn on_command(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        cmd: TaskCommand,
    ) -> Result<(), RuntimeError> {
        match cmd {
            TaskCommand::Prepare(plan) => {
                // Every task of the operator that may still be asked for state (live, cancelled,
                // retired) learns the new placement before any new task can ask it.
                self.life.prepared(plan.epoch, !plan.senders_to(setup.task).is_empty());
                self.deployment = Arc::new(plan.deployment.clone());
                setup.ack(plan.epoch, TaskAck::Prepared);
            }
            TaskCommand::Begin(reconfiguration) => {
                self.life.started(reconfiguration.epoch);
                let first = self.unstarted.start();
                for &channel in &first.channels {
                    self.core.add_input(channel);
                }
                self.feed(setup, outputs, TaskEvent::Start(reconfiguration))?;
                // Channels that ended before the core knew them (a new task's, before `Start`).
                for channel in first.ended {
                    self.feed(setup, outputs, TaskEvent::EndOfStream { channel })?;
                }
            }
            TaskCommand::Release => self.life.release(),
            // Koala hands over per `Begin`; this is for stop-and-restart and stateless operators.
            TaskCommand::HandOver { .. } => {}
            // Outputs that ended carry nothing more, not even a marker; the coordinator stopped
            // counting on this task when it reported `InputsEnded`.
            TaskCommand::Switch(_) if self.life.outputs_ended() => {}
            TaskCommand::Switch(switch) => {
                setup.switch_and_ack(&switch, outputs)?;
            }
            TaskCommand::UpstreamEnded(upstream) => {
                if self.unstarted.upstream_ended(upstream) {
                    return Ok(());
                }
                // Every channel from it: a self-join's upstream has two.
                for channel in self.core.inputs_from(upstream) {
                    self.checkpoints.on_end(&channel);
                    self.feed(setup, outputs, TaskEvent::EndOfStream { channel })?;
                }
            }
            TaskCommand::AddInputs { epoch, channels } => {
                for c in channels {
                    self.checkpoints.add_channel(c);
                    if !self.unstarted.add(c) {
                        self.core.add_input(c);
                    }
                }
                setup.ack(epoch, TaskAck::Prepared);
            }
            other => {
                let name = format!("{other:?}").chars().take(40).collect::<String>();
                tracing::error!(task = %setup.task, command = %name, "command a Koala task does not take; ignored");
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
                tracing::error!(task = %setup.task, %channel, message = ?other, "unexpected message on a data channel; ignored");
                return Ok(());
            }
        };
        self.feed(setup, outputs, event)
    }

    /// Feeds the core one event, with this task's store for its local-first lookups (timed:
    /// `klt_lookup_mean_us`), and executes its actions.
    fn feed(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        event: TaskEvent,
    ) -> Result<(), RuntimeError> {
        let mut local = StoreKeys::new(store(setup)?, self.op.logic.state_ids(), setup.num_buckets);
        // Records this event brings are taken now (per-batch latency starts here).
        self.core.set_intake_tag(self.op.metrics.batch_clock.tag_now());
        // Background pulls wait while input does (`KoalaTask::set_input_backlog`).
        self.core.set_input_backlog(setup.inbox.queue().len() + usize::from(self.intake.has_data()));
        let actions = self.core.on_with(event, &mut local);
        let (spent, batches, error) = local.finish();
        self.op.metrics.klt_lookup.0 += spent;
        self.op.metrics.klt_lookup.1 += batches;
        if let Some(e) = error {
            return Err(e);
        }
        self.op.metrics.held(self.core.queued_records() as u64);
        let batches = self.core.take_batches();
        self.execute(setup, outputs, actions, batches)
    }

    fn on_peer(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        from: TaskId,
        message: ChannelMessage,
    ) -> Result<(), RuntimeError> {
        // Peer messages come from our own tasks: one that is not understood means lost protocol
        // state, so the task fails (and with it the job) instead of dropping it.
        let ChannelMessage::Protocol(bytes) = message else {
            let reason = "a non-protocol message on the peer channel".into();
            return Err(RuntimeError::Peer { task: setup.task, from, reason });
        };
        let event = match decode::<Wire>(&bytes) {
            Ok(Wire::Peer(message)) => match self.intake.take_peer(&self.core, from, message) {
                Some(message) => TaskEvent::Peer { from, message },
                None => return Ok(()),
            },
            Ok(Wire::Fetch(request)) => TaskEvent::FetchRequest { from, request },
            Ok(Wire::Answer(response)) => {
                self.op.metrics.fetch_not_here +=
                    response.values.iter().filter(|(_, v)| v.is_none()).count() as u64;
                TaskEvent::FetchResponse { from, response }
            }
            Ok(Wire::FilterRequest(request)) => TaskEvent::FilterRequest { from, request },
            Ok(Wire::Filter(response)) => TaskEvent::Filter { from, response },
            Err(e) => {
                let reason = format!("an undecodable peer message ({e})");
                return Err(RuntimeError::Peer { task: setup.task, from, reason });
            }
        };
        self.feed(setup, outputs, event)
    }

    /// Feeds the core what waited in the intake for room, as far as it takes it now.
    fn drain_intake(&mut self, setup: &TaskSetup, outputs: &mut Outputs) -> Result<(), RuntimeError> {
        while let Some((from, message)) = self.intake.next_peer(&self.core) {
            self.feed(setup, outputs, TaskEvent::Peer { from, message })?;
        }
        while let Some((channel, message)) = self.intake.next(&self.core) {
            self.on_data(setup, outputs, channel, message)?;
        }
        Ok(())
    }

    /// Takes everything waiting on the fetch lane (fetches, answers, filter requests, filters):
    /// none of it waits for room, and a filter request only queues a build.
    fn serve_fetch_lane(&mut self, setup: &TaskSetup, outputs: &mut Outputs) -> Result<(), RuntimeError> {
        while let Ok(item) = setup.fetch_inbox.try_recv() {
            self.on_peer(setup, outputs, item.channel.from, item.message)?;
        }
        Ok(())
    }

    /// One step of the oldest filter build; a finished filter goes to the owner that asked.
    fn build_filters(&mut self, setup: &TaskSetup) -> Result<(), RuntimeError> {
        let Some((_, _, build)) = self.builds.front_mut() else {
            return Ok(());
        };
        let ids = self.op.logic.state_ids().to_vec();
        let mut location = StoreLocation::new(store(setup)?, &ids, setup.num_buckets);
        let Some(filter) = build.step(&mut location, FILTER_BUILD_STEP)? else {
            return Ok(());
        };
        let Some((to, request, _)) = self.builds.pop_front() else {
            return Ok(());
        };
        tracing::debug!(task = %setup.task, %to, bucket = request.bucket, keys = filter.keys(), bytes = filter.approx_bytes(), "filter built");
        let response = FilterResponse { bucket: request.bucket, since: request.since, filter };
        self.send(setup, to, &Wire::Filter(response))?;
        Ok(())
    }

    /// Once every input ended and nothing is left to process — nor will be: no epoch this task
    /// takes buckets in is still to begin — fire every timer, close the outputs, tell the
    /// coordinator, and keep serving state until released.
    fn check_inputs_ended(&mut self, setup: &TaskSetup, outputs: &mut Outputs) -> Result<(), RuntimeError> {
        debug_assert_eq!(self.unstarted.is_waiting(), self.life.unstarted());
        let Some(ended) = self.life.check_inputs_ended(&self.core) else {
            return Ok(());
        };
        if ended.end_outputs {
            self.op.advance(setup, outputs, Timestamp::MAX)?;
            outputs.flush_all()?;
            outputs.broadcast(&ChannelMessage::EndOfStream)?;
        }
        setup.ack(ended.epoch, TaskAck::InputsEnded);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
