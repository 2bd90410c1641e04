//! Carrying out the Koala core's actions in a task's loop: process a batch, send to a peer or
//! downstream, serve a fetch from the store, install fetched or handed-over state, move timers
//! with a hand-over.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use koala_protocol::TaskAck;
use koala_protocol::koala::{
    BatchTaken, FetchRequest, FetchResponse, FilterBuild, HandOver, PeerMessage, TaskAction, serve_fetch,
};
use koala_types::{BucketId, ChannelMessage, TaskId, bucket_of, encode};

use super::super::TaskSetup;
use super::super::location::{StoreLocation, bundle_writes};
use super::{KoalaOperator, SLOW_BATCH, Wire};
use crate::RuntimeError;
use crate::channel::{FETCH_INPUT, InputChannel};
use crate::links::{open_channel, open_peer};
use crate::metrics::{BatchEnds, entry_bytes};
use crate::output::Outputs;

impl KoalaOperator {
    /// Executes the core's actions; `batches` are the batches among its `Process` actions, in
    /// order (`KoalaTask::take_batches`): each one's latency ends with its last `Process` and
    /// starts when its first record was taken or the task's previous batch ended, whichever is
    /// later (`BatchClock`), so it includes the wait for fetched state.
    pub(super) fn execute(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        actions: Vec<TaskAction>,
        batches: Vec<BatchTaken>,
    ) -> Result<(), RuntimeError> {
        let mut ends = BatchEnds::new(batches.iter().map(|b| (b.taken, b.actions)));
        for action in actions {
            match action {
                TaskAction::Process { input, records } => {
                    let done = self.op.on_batch(setup, outputs, input, records, self.watermark)?;
                    if let Some(tag) = ends.processed() {
                        let taken = self.op.metrics.batch_clock.taken_at(tag);
                        let latency = self.op.metrics.batch_ended(taken, done);
                        if latency >= SLOW_BATCH {
                            tracing::debug!(task = %setup.task, latency_ms = latency.as_millis() as u64, queued = self.core.queued_records(), builds = self.builds.len(), "slow batch: the core");
                        }
                    }
                }
                TaskAction::FetchState { from, request } => {
                    self.send(setup, from, &Wire::Fetch(request))?;
                }
                TaskAction::RequestFilter { from, request } => {
                    self.send(setup, from, &Wire::FilterRequest(request))?;
                }
                TaskAction::WakeAfter { ms } => {
                    let at = Instant::now() + Duration::from_millis(ms);
                    self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
                }
                TaskAction::BuildFilter { to, request } => {
                    let build = FilterBuild::new(request.bucket);
                    self.builds.push_back((to, request, build));
                }
                TaskAction::InstallState { entries } => self.install(setup, entries)?,
                TaskAction::ServeFetch { to, request } => {
                    let response = self.serve(setup, to, request)?;
                    self.send(setup, to, &Wire::Answer(response))?;
                }
                TaskAction::SendToPeer { to, mut message } => {
                    let hand_over = if let PeerMessage::HandOver { hand_over, .. } = &mut message {
                        self.take_timers(setup, hand_over);
                        true
                    } else {
                        false
                    };
                    let sent = self.send(setup, to, &Wire::Peer(message))?;
                    if hand_over {
                        // Everything the hand-over ships: key-lookup entries and timers.
                        self.op.metrics.state_bytes_eager += sent;
                    }
                }
                TaskAction::FireTimers { buckets, up_to } => {
                    let buckets: BTreeSet<BucketId> = buckets.into_iter().collect();
                    let nb = setup.num_buckets;
                    self.op
                        .fire_due_where(setup, outputs, up_to, |key| buckets.contains(&bucket_of(key, nb)))?;
                }
                TaskAction::InstallTimers { timers, .. } => {
                    self.op.timers.register(timers.into_iter().map(|(t, k)| (k, t)));
                }
                TaskAction::FireProcessingTimers { up_to } => {
                    self.op.fire_processing(setup, outputs, up_to)?;
                }
                TaskAction::EmitWatermark(t) => {
                    self.watermark = Some(t);
                    self.op.advance(setup, outputs, t)?;
                }
                TaskAction::Ack { epoch, ack } => setup.ack(epoch, ack),
                TaskAction::Error(error) => {
                    tracing::error!(task = %setup.task, %error, "protocol surprise refused");
                    setup.ack(self.life.epoch(), TaskAck::ProtocolError { error });
                }
            }
        }
        Ok(())
    }

    /// Sends on the lane the message belongs to (`crate::peer`): fetches on the fetch lane, which
    /// never waits for the receiver; everything else on the bounded peer lane through the outbox,
    /// which never blocks the task. Returns the encoded message's size.
    pub(super) fn send(&mut self, setup: &TaskSetup, to: TaskId, wire: &Wire) -> Result<u64, RuntimeError> {
        let bytes = encode(wire)
            .map_err(|source| RuntimeError::Codec { what: "encoding a peer message".into(), source })?;
        let size = bytes.len() as u64;
        let message = ChannelMessage::Protocol(bytes);
        if let Wire::Peer(_) = wire {
            if !self.outbox.is_open(to) {
                self.outbox.open(open_peer(&setup.links, &self.deployment, to, setup.task)?);
            }
            self.outbox.send(to, message)?;
            return Ok(size);
        }
        if !self.fetch_lanes.contains_key(&to) {
            let channel = InputChannel { input: FETCH_INPUT, from: setup.task };
            let lane = open_channel(&setup.links, &self.deployment, to, channel)?;
            self.fetch_lanes.insert(to, lane);
        }
        if let Some(lane) = self.fetch_lanes.get_mut(&to) {
            self.op.metrics.backpressure += lane.send(message)?;
        }
        Ok(size)
    }

    fn state_ids(&self) -> Vec<u8> {
        self.op.logic.state_ids().to_vec()
    }

    /// Answers `to`'s fetch from this task's store (the protocol's one serving function).
    fn serve(
        &mut self,
        setup: &TaskSetup,
        to: TaskId,
        request: FetchRequest,
    ) -> Result<FetchResponse, RuntimeError> {
        let ids = self.state_ids();
        let mut location = StoreLocation::new(store(setup)?, &ids, setup.num_buckets);
        let tag = request.checkpoint;
        let response = serve_fetch(&mut location, &mut self.pull_cursors, to, request)?;
        let served = response.values.iter().filter_map(|(k, v)| Some((k.clone(), v.clone()?)));
        self.cut.on_served(tag, served.chain(response.extra.iter().cloned()));
        self.op.metrics.state_reads += location.reads;
        // A key's state ids travel as one bundle: the key counts once, with the bundle
        // (within a few bytes per state id of `entry_bytes` per entry).
        let metrics = &mut self.op.metrics;
        for (key, value) in response.values.iter().filter_map(|(k, v)| Some((k, v.as_ref()?))) {
            metrics.state_bytes_on_demand += entry_bytes(key.len(), value.len());
            metrics.state_keys_sent += 1;
        }
        metrics.state_bytes_background +=
            response.extra.iter().map(|(k, v)| entry_bytes(k.len(), v.len())).sum::<u64>();
        metrics.state_keys_sent += response.extra.len() as u64;
        Ok(response)
    }

    fn install(&mut self, setup: &TaskSetup, entries: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), RuntimeError> {
        self.cut.on_installed(entries.iter().map(|(k, _)| k.as_slice()));
        let writes = bundle_writes(entries, setup.num_buckets)?;
        self.op.metrics.state_writes += writes.len() as u64;
        if !writes.is_empty() {
            store(setup)?.write_many(writes)?;
        }
        Ok(())
    }

    /// Moves the timers of the handed-over buckets from here into the hand-over; their keys'
    /// state stays here until the receiver fetches it (or it is drained).
    fn take_timers(&mut self, setup: &TaskSetup, hand_over: &mut HandOver) {
        let nb = setup.num_buckets;
        let buckets: BTreeSet<BucketId> = hand_over.buckets.iter().map(|b| b.bucket).collect();
        hand_over.timers = self.op.timers.take_where(|key| buckets.contains(&bucket_of(key, nb)));
    }
}

pub(super) fn store(setup: &TaskSetup) -> Result<&dyn koala_state::StateBackend, RuntimeError> {
    setup
        .store
        .as_deref()
        .ok_or_else(|| RuntimeError::deployment(setup.task, "a keyed task without a state store"))
}
