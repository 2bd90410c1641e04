//! The target side of stop-and-restart (docs/protocols.md §7), as the executor of
//! [`TargetCore`]: the core decides when a task of the reconfigured operator has seen every
//! marker, what it sends and which state it accepts; this module does the I/O — it streams the
//! buckets the task gives away (state by range scan, then their timers, then `StateEnd`) to
//! their new owners over peer channels, deletes them locally, and installs what arrives.
//! Under the `remote` protocol (docs/protocols.md §7.1) the core asks for a flush instead: the
//! task releases the moved buckets to the shared state servers (its cache's dirty entries are
//! written back, its copies forgotten), sends their timers and `StateEnd`; no state moves.

use std::collections::BTreeSet;
use std::sync::Arc;

use crossbeam_channel::Select;
use koala_protocol::stop_restart::{TargetAction, TargetCore, TargetEvent};
use koala_protocol::{ReconfigPlan, TaskAck};
use koala_state::{StateKey, StateWrite};
use koala_types::{BucketId, ChannelMessage, Epoch, StateEntry, TaskId, Timestamp, bucket_of};

use super::TaskSetup;
use crate::RuntimeError;
use crate::channel::InputChannel;
use crate::links::open_peer;
use crate::metrics::{TaskMetrics, timer_bytes};
use crate::output::Outputs;
use crate::peer::PeerSender;
use crate::timers::TimerService;

/// Bytes per state message on a peer channel.
const CHUNK_BYTES: usize = 256 * 1024;

/// What the executor touches besides the task's setup.
pub struct TransferIo<'a> {
    /// The task's outputs (flushed before state leaves).
    pub outputs: &'a mut Outputs,
    /// The task's timers (moved with their buckets).
    pub timers: &'a mut TimerService,
    /// The task's counters.
    pub metrics: &'a mut TaskMetrics,
}

/// One task's part in the reconfigurations of its operator: the core and what the executor
/// needs to carry out its actions.
pub struct StateTransfer {
    core: TargetCore<InputChannel>,
    /// The plan of the last `Prepare` the core accepted (where the new owners run).
    plan: Option<Arc<ReconfigPlan>>,
}

impl StateTransfer {
    /// Task `task`, in no reconfiguration; `remote`: under the `remote` protocol.
    pub fn new(task: TaskId, remote: bool) -> Self {
        let core = if remote { TargetCore::new_remote(task) } else { TargetCore::new(task) };
        Self { core, plan: None }
    }

    /// Whether the task may read the state of `bucket` now ([`TargetCore::may_read`]).
    pub fn may_read(&self, bucket: BucketId) -> bool {
        self.core.may_read(bucket)
    }

    /// The buckets `task` owns under the last plan it prepared for (or the deployment it started
    /// with): what it snapshots over a shared store (`crate::checkpoint::freeze`).
    pub fn owned(&self, setup: &TaskSetup) -> BTreeSet<BucketId> {
        let deployment = self.plan.as_ref().map_or(&*setup.deployment, |p| &p.deployment);
        crate::checkpoint::owned_in(deployment, setup.task)
    }

    /// Whether a reconfiguration part is running: the task must not exit yet.
    pub fn busy(&self) -> bool {
        self.core.busy()
    }

    /// Feeds `event` to the core and carries out what it decides.
    pub fn on(
        &mut self,
        setup: &TaskSetup,
        event: TargetEvent<InputChannel>,
        io: &mut TransferIo<'_>,
    ) -> Result<(), RuntimeError> {
        let plan = match &event {
            TargetEvent::Prepare { plan, .. } => Some(plan.clone()),
            _ => None,
        };
        let actions = self.core.on(event);
        if let Some(plan) = plan
            && !actions.iter().any(|a| matches!(a, TargetAction::Error(_)))
        {
            self.plan = Some(plan);
        }
        for action in actions {
            match action {
                TargetAction::Ack { epoch, ack } => setup.ack(epoch, ack),
                TargetAction::SendState { epoch, moves } => self.send_state(setup, epoch, &moves, io)?,
                TargetAction::Flush { epoch, moves } => self.flush(setup, epoch, &moves, io)?,
                TargetAction::Error(source) => {
                    return Err(RuntimeError::StopRestart { task: setup.task, source });
                }
            }
        }
        Ok(())
    }

    /// A message on a peer channel: checked by the core, then installed.
    pub fn on_peer(
        &mut self,
        setup: &TaskSetup,
        channel: InputChannel,
        message: ChannelMessage,
        io: &mut TransferIo<'_>,
    ) -> Result<(), RuntimeError> {
        let from = channel.from;
        let event = match &message {
            ChannelMessage::State { epoch, .. } => TargetEvent::StateChunk { from, epoch: *epoch },
            ChannelMessage::Timers { epoch, .. } => TargetEvent::TimersChunk { from, epoch: *epoch },
            ChannelMessage::StateEnd { epoch } => TargetEvent::StateEnd { from, epoch: *epoch },
            other => {
                let message = message_kind(other);
                return Err(RuntimeError::MisplacedMessage { task: setup.task, channel, message });
            }
        };
        // State nobody expects is refused before it is written.
        self.on(setup, event, io)?;
        match message {
            ChannelMessage::State { entries, .. } => {
                let store = setup.store.as_deref().ok_or_else(|| {
                    RuntimeError::deployment(setup.task, "received state but has no state store")
                })?;
                let writes = entries
                    .into_iter()
                    .map(|e| {
                        StateWrite::Put(StateKey { bucket: e.bucket, state: e.state, key: e.key }, e.value)
                    })
                    .collect();
                store.write_many(writes)?;
            }
            ChannelMessage::Timers { timers: moved, .. } => {
                io.timers.register(moved.into_iter().map(|(t, k): (Timestamp, Vec<u8>)| (k, t)));
            }
            _ => {}
        }
        Ok(())
    }

    /// Every awaited marker arrived: flushes, sends each new owner its buckets' state and timers
    /// then `StateEnd`, deletes what moved, and acks `StateSent` with what was sent.
    ///
    /// Every new owner gets its own stream, all at once (a thread each, scanning its buckets), as
    /// every destination pulls its buckets in parallel in the authors' stop-and-restart: a
    /// receiver's link or ingest paces only its own stream. One after another, a task with two new
    /// owners paused for both transfers back to back (4 → 8 under the uniform policy: 2 × 45 s).
    /// Meanwhile this thread takes in the state arriving for this task, so two tasks streaming to
    /// each other both progress.
    fn send_state(
        &mut self,
        setup: &TaskSetup,
        epoch: Epoch,
        moves: &[(TaskId, Vec<BucketId>)],
        io: &mut TransferIo<'_>,
    ) -> Result<(), RuntimeError> {
        let Some(plan) = self.plan.clone().filter(|p| p.epoch == epoch) else {
            debug_assert!(false, "SendState of epoch {epoch} without its plan");
            return Err(RuntimeError::Invariant { task: setup.task, what: "SendState without its plan" });
        };
        // Results of records processed before the switch go out before anything the new
        // owners emit for the same keys.
        io.outputs.flush_all()?;
        let me = setup.task;
        let mut streams = Vec::with_capacity(moves.len());
        for (to, buckets) in moves {
            let peer = open_peer(&setup.links, &plan.deployment, *to, me)?;
            let moved_here: BTreeSet<BucketId> = buckets.iter().copied().collect();
            let timers = io.timers.take_where(|key| moved_here.contains(&bucket_of(key, setup.num_buckets)));
            streams.push((peer, buckets.as_slice(), timers));
        }
        let store = setup.store.as_deref();
        let (done_tx, done) = crossbeam_channel::unbounded();
        let (mut bytes, mut entries) = (0u64, 0u64);
        std::thread::scope(|scope| -> Result<(), RuntimeError> {
            for (peer, buckets, timers) in streams {
                let done_tx = done_tx.clone();
                let spawned = std::thread::Builder::new().name("koala-state-out".into()).spawn_scoped(
                    scope,
                    move || {
                        let _ = done_tx.send(stream_buckets(store, &peer, buckets, timers, epoch));
                    },
                );
                if let Err(e) = spawned {
                    return Err(RuntimeError::io("spawning a state stream", e));
                }
            }
            drop(done_tx);
            let mut first_error = None;
            let mut inbox_open = true;
            loop {
                let mut select = Select::new();
                let finished = select.recv(&done);
                let arrived = if inbox_open { select.recv(&setup.peer_inbox) } else { usize::MAX };
                let op = select.select();
                if op.index() == finished {
                    match op.recv(&done) {
                        Ok(Ok((b, n))) => (bytes, entries) = (bytes + b, entries + n),
                        Ok(Err(e)) => first_error = first_error.or(Some(e)),
                        Err(_) => break, // every stream ended
                    }
                } else if op.index() == arrived {
                    match op.recv(&setup.peer_inbox) {
                        Ok(item) if first_error.is_none() => {
                            if let Err(e) = self.on_peer(setup, item.channel, item.message, io) {
                                first_error = Some(e);
                            }
                        }
                        Ok(_) => {}
                        Err(_) => inbox_open = false,
                    }
                }
            }
            first_error.map_or(Ok(()), Err)
        })?;
        if let Some(store) = store {
            let moved: Vec<BucketId> = moves.iter().flat_map(|(_, b)| b.iter().copied()).collect();
            if !moved.is_empty() {
                // One live copy: what moved is gone here, so a bucket that comes back later can
                // never read a stale value.
                store.delete_buckets(&moved)?;
            }
        }
        io.metrics.state_bytes_eager += bytes;
        tracing::debug!(task = %me, epoch, bytes, entries, "moved state sent");
        setup.ack(epoch, TaskAck::StateSent { bytes, entries });
        Ok(())
    }
}

/// One new owner's stream: its buckets' state by range scan, their timers, then `StateEnd`.
/// Returns the bytes and entries sent.
fn stream_buckets(
    store: Option<&dyn koala_state::StateBackend>,
    peer: &PeerSender,
    buckets: &[BucketId],
    timers: Vec<(Timestamp, Vec<u8>)>,
    epoch: Epoch,
) -> Result<(u64, u64), RuntimeError> {
    let (mut bytes, mut entries) = (0u64, 0u64);
    if let Some(store) = store {
        let mut send_err = None;
        let scanned = store.scan_buckets(buckets, CHUNK_BYTES, &mut |chunk| {
            entries += chunk.len() as u64;
            let entries = chunk
                .into_iter()
                .map(|(k, value)| StateEntry { bucket: k.bucket, state: k.state, key: k.key, value })
                .collect();
            peer.send(ChannelMessage::State { epoch, entries }).map_err(|e| {
                let msg = e.to_string();
                send_err = Some(e);
                koala_state::StateError::sink(msg)
            })
        });
        if let Some(e) = send_err {
            return Err(e);
        }
        bytes += scanned?;
    }
    if !timers.is_empty() {
        bytes += timers.iter().map(|(_, k)| timer_bytes(k)).sum::<u64>();
        peer.send(ChannelMessage::Timers { epoch, timers })?;
    }
    peer.send(ChannelMessage::StateEnd { epoch })?;
    Ok((bytes, entries))
}

impl StateTransfer {
    /// The `remote` protocol's `SendState`: every awaited marker arrived; flushes outputs, then
    /// per new owner releases its buckets to the state servers (whatever this task buffered for
    /// them is written back before `StateEnd` leaves, so the new owner's first read sees it),
    /// sends their timers and `StateEnd`; acks `StateSent` with the bytes written back and the
    /// timers sent (the Remote baseline's eager state moved; no entry goes to a task).
    fn flush(
        &mut self,
        setup: &TaskSetup,
        epoch: Epoch,
        moves: &[(TaskId, Vec<BucketId>)],
        io: &mut TransferIo<'_>,
    ) -> Result<(), RuntimeError> {
        let Some(plan) = self.plan.clone().filter(|p| p.epoch == epoch) else {
            debug_assert!(false, "Flush of epoch {epoch} without its plan");
            return Err(RuntimeError::Invariant { task: setup.task, what: "Flush without its plan" });
        };
        io.outputs.flush_all()?;
        let me = setup.task;
        let mut flushed = 0u64;
        for (to, buckets) in moves {
            let peer = open_peer(&setup.links, &plan.deployment, *to, me)?;
            if let Some(store) = setup.store.as_deref() {
                flushed += store.release_buckets(buckets)?;
            }
            let moved_here: BTreeSet<BucketId> = buckets.iter().copied().collect();
            let moving = io.timers.take_where(|key| moved_here.contains(&bucket_of(key, setup.num_buckets)));
            if !moving.is_empty() {
                flushed += moving.iter().map(|(_, k)| timer_bytes(k)).sum::<u64>();
                self.send(setup, &peer, ChannelMessage::Timers { epoch, timers: moving }, io)?;
            }
            self.send(setup, &peer, ChannelMessage::StateEnd { epoch }, io)?;
        }
        tracing::debug!(task = %me, epoch, flushed, "moved buckets released to the state servers");
        io.metrics.state_bytes_eager += flushed;
        setup.ack(epoch, TaskAck::StateSent { bytes: flushed, entries: 0 });
        Ok(())
    }

    /// Sends on a peer lane; while it is full, takes in the state arriving for this task, so two
    /// tasks streaming state to each other both progress (`crate::peer`).
    fn send(
        &mut self,
        setup: &TaskSetup,
        peer: &PeerSender,
        message: ChannelMessage,
        io: &mut TransferIo<'_>,
    ) -> Result<(), RuntimeError> {
        let own = &setup.peer_inbox;
        peer.send_draining(message, own, |item| self.on_peer(setup, item.channel, item.message, io))?;
        Ok(())
    }
}

/// The kind of a channel message, for errors.
pub(super) fn message_kind(message: &ChannelMessage) -> &'static str {
    match message {
        ChannelMessage::Batch(_) => "Batch",
        ChannelMessage::Watermark(_) => "Watermark",
        ChannelMessage::Marker(_) => "Marker",
        ChannelMessage::Barrier(_) => "Barrier",
        ChannelMessage::EndOfStream => "EndOfStream",
        ChannelMessage::State { .. } => "State",
        ChannelMessage::Timers { .. } => "Timers",
        ChannelMessage::StateEnd { .. } => "StateEnd",
        ChannelMessage::Protocol(_) => "Protocol",
    }
}
