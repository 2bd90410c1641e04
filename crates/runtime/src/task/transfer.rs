//! The target side of stop-and-restart (docs/protocols.md §7): once a task of the reconfigured operator
//! has seen the marker of every upstream task, nothing routed by the old routing table is still
//! on its way, so it streams the buckets it gives away (state by range scan, then their timers)
//! to their new owners over peer channels and deletes them locally. Receivers store what arrives
//! and report when every sender has finished.

use std::collections::BTreeSet;
use std::sync::Arc;

use koala_protocol::{ReconfigPlan, TaskAck};
use koala_state::{StateKey, StateWrite};
use koala_types::{BucketId, ChannelMessage, StateEntry, TaskId, Timestamp, bucket_of};

use super::TaskSetup;
use crate::RuntimeError;
use crate::channel::InputChannel;
use crate::links::open_peer;
use crate::metrics::TaskMetrics;
use crate::output::Outputs;
use crate::peer::PeerSender;
use crate::timers::TimerService;

/// Bytes per state message on a peer channel.
const CHUNK_BYTES: usize = 256 * 1024;

/// One task's part in one reconfiguration of its operator.
pub struct Transfer {
    plan: Arc<ReconfigPlan>,
    /// Upstream channels whose marker has not arrived yet.
    awaiting: BTreeSet<InputChannel>,
    /// Tasks still sending state to this one.
    incoming: BTreeSet<u32>,
    sent: bool,
}

impl Transfer {
    /// Starts this task's part; `inputs` are its open upstream channels.
    pub fn new(
        setup: &TaskSetup,
        plan: Arc<ReconfigPlan>,
        inputs: impl IntoIterator<Item = InputChannel>,
    ) -> Self {
        let created = plan.created.contains(&setup.task.index);
        let awaiting = if created { BTreeSet::new() } else { inputs.into_iter().collect() };
        let incoming = plan.senders_to(setup.task).into_iter().map(|t| t.index).collect();
        setup.ack(plan.epoch, TaskAck::Prepared);
        Self { plan, awaiting, incoming, sent: created }
    }

    /// The reconfiguration.
    pub fn epoch(&self) -> u64 {
        self.plan.epoch
    }

    /// Whether this task's part is over.
    pub fn finished(&self) -> bool {
        self.sent && self.incoming.is_empty()
    }

    /// A marker of this epoch (or the end of stream) arrived on `channel`; once all have, send.
    pub fn on_marker(
        &mut self,
        setup: &TaskSetup,
        channel: &InputChannel,
        outputs: &mut Outputs,
        timers: &mut TimerService,
        metrics: &mut TaskMetrics,
    ) -> Result<(), RuntimeError> {
        self.awaiting.remove(channel);
        self.send_if_drained(setup, outputs, timers, metrics)
    }

    /// Sends the moved buckets if every upstream channel is drained.
    pub fn send_if_drained(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        timers: &mut TimerService,
        metrics: &mut TaskMetrics,
    ) -> Result<(), RuntimeError> {
        if self.sent || !self.awaiting.is_empty() {
            return Ok(());
        }
        self.sent = true;
        // Results of records processed before the switch go out before anything the new
        // owners emit for the same keys.
        outputs.flush_all()?;
        let mut bytes = 0u64;
        let mut entries = 0u64;
        let me = setup.task;
        let mut moved: Vec<BucketId> = Vec::new();
        let plan = self.plan.clone();
        for (to, buckets) in plan.outgoing(me) {
            let peer = open_peer(&setup.links, &plan.deployment, to, me)?;
            if let Some(store) = setup.store.as_deref() {
                let mut send_err = None;
                bytes += store.scan_buckets(buckets, CHUNK_BYTES, &mut |chunk| {
                    entries += chunk.len() as u64;
                    let entries = chunk
                        .into_iter()
                        .map(|(k, value)| StateEntry { bucket: k.bucket, state: k.state, key: k.key, value })
                        .collect();
                    if let Err(e) =
                        self.send(setup, &peer, ChannelMessage::State { epoch: plan.epoch, entries }, timers)
                    {
                        let msg = e.to_string();
                        send_err = Some(e);
                        return Err(koala_state::StateError::sink(msg));
                    }
                    Ok(())
                })?;
                if let Some(e) = send_err {
                    return Err(e);
                }
            }
            let moved_here: BTreeSet<BucketId> = buckets.iter().copied().collect();
            let moving = timers.take_where(|key| moved_here.contains(&bucket_of(key, setup.num_buckets)));
            if !moving.is_empty() {
                self.send(
                    setup,
                    &peer,
                    ChannelMessage::Timers { epoch: plan.epoch, timers: moving },
                    timers,
                )?;
            }
            self.send(setup, &peer, ChannelMessage::StateEnd { epoch: plan.epoch }, timers)?;
            moved.extend_from_slice(buckets);
        }
        if let Some(store) = setup.store.as_deref()
            && !moved.is_empty()
        {
            // One live copy: what moved is gone here, so a bucket that comes back later can
            // never read a stale value.
            store.delete_buckets(&moved)?;
        }
        metrics.state_bytes_moved += bytes;
        tracing::debug!(task = %me, epoch = self.plan.epoch, bytes, entries, "moved state sent");
        setup.ack(self.plan.epoch, TaskAck::StateSent { bytes, entries });
        Ok(())
    }

    /// Sends on a peer lane; while it is full, takes in the state arriving for this task, so two
    /// tasks streaming state to each other both progress (`crate::peer`).
    fn send(
        &mut self,
        setup: &TaskSetup,
        peer: &PeerSender,
        message: ChannelMessage,
        timers: &mut TimerService,
    ) -> Result<(), RuntimeError> {
        let own = &setup.peer_inbox;
        peer.send_draining(message, own, |i| self.on_peer(setup, i.channel.from, i.message, timers))?;
        Ok(())
    }

    /// A message on a peer channel.
    pub fn on_peer(
        &mut self,
        setup: &TaskSetup,
        from: TaskId,
        message: ChannelMessage,
        timers: &mut TimerService,
    ) -> Result<(), RuntimeError> {
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
                timers.register(moved.into_iter().map(|(t, k): (Timestamp, Vec<u8>)| (k, t)));
            }
            ChannelMessage::StateEnd { .. } => {
                self.incoming.remove(&from.index);
                if self.incoming.is_empty() {
                    setup.ack(self.plan.epoch, TaskAck::StateReceived);
                }
            }
            other => {
                tracing::error!(task = %setup.task, %from, message = ?other, "unexpected message on a peer channel; ignored");
            }
        }
        Ok(())
    }
}
