//! A task's side of checkpoints (docs/architecture.md §10): barrier alignment over its data
//! inputs by the protocol's rule ([`BarrierAligner`], which the simulator runs too), writing its
//! part — its store frozen at the barrier and written out by a background [`CheckpointWriter`]
//! through the snapshot primitive (`koala_state::snapshot`), incrementally; timers and
//! per-channel watermarks — into `<dir>/<id>/<operator>-<index>`, and restoring from one.
//!
//! A restore ([`restore`]) re-buckets: a stateful task loads the buckets it owns from the
//! snapshots of every task of its operator, so a key's state is found wherever it was at the
//! checkpoint — under Koala at an old location that still holds it (cold state), or retained by
//! one that served it to an owner already past the barrier — in the order of Koala's cut rule
//! (`koala_protocol::koala::restore_steps`, docs/protocols.md §12): the other parts, then the
//! owner's tombstones, then its own part; lazily, a bucket group on first access. Over a store
//! every task shares (the Remote backend's state servers), a task snapshots and restores only
//! the buckets it owns, so no restore touches another task's buckets and tasks may restore
//! concurrently.
//!
//! A task whose protocol core holds records (Koala, DRRS) checkpoints through
//! [`CoreCheckpoints`]: once aligned, its snapshot waits until the core has processed every
//! record taken before the barrier and has no fetch outstanding.

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Instant;

use koala_protocol::checkpoint::{BarrierAligner, TaskCheckpoint};
use koala_protocol::koala::CutPart;
use koala_protocol::{Deployment, Protocol, WorkerMessage};
use koala_state::{FrozenView, OwnedView};
use koala_types::{BucketId, ChannelMessage, CheckpointId, InputChannel, TaskId, Timestamp};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;

mod writer;

use crate::queue::AlignmentHold;
use crate::task::setup::TaskSetup;
pub(crate) use writer::{CheckpointWriter, tracked_store};

mod restore;
pub use restore::RESTORE_EAGERLY;
pub(crate) use restore::restore_task;

/// What a task records besides its state.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct TaskMeta {
    /// Each open input channel's last watermark.
    pub(crate) watermarks: Vec<(InputChannel, Option<Timestamp>)>,
    /// Pending timers.
    pub(crate) timers: Vec<(Timestamp, Vec<u8>)>,
    /// Koala's checkpoint cut: entries served to owners already past this checkpoint, and keys
    /// installed from fetches since the previous one (empty under the other protocols).
    pub(crate) cut: CutPart,
}

/// The directory of `task`'s part of checkpoint `id` under `root`.
pub(crate) fn task_dir(root: &Path, id: CheckpointId, task: TaskId) -> PathBuf {
    root.join(id.to_string()).join(format!("{}-{}", task.operator.0, task.index))
}

/// What to do with a message taken from a data input.
#[derive(Debug)]
pub(crate) enum Gate {
    /// Process it.
    Take(ChannelMessage),
    /// Its channel is held (its barrier arrived first): kept for later.
    Held,
    /// A barrier; others are still to come.
    Waiting,
    /// A barrier that aligned checkpoint `id`: snapshot, forward the barrier, acknowledge, then
    /// take [`BarrierGate::release`]d messages.
    Aligned(CheckpointId),
}

/// Messages a task keeps behind barriers before it stops reading the channels whose barrier
/// arrived (bounded alignment): a short alignment costs no throughput, a long one no memory.
const HELD_BEFORE_HOLD: usize = 256;

/// A task's barrier alignment over its data inputs, with the messages of held channels. Past
/// [`HELD_BEFORE_HOLD`] held messages, the held channels are also held back at the task's data
/// queue ([`AlignmentHold`]) until the checkpoint aligns: what waits here stays bounded by that
/// plus what was already queued, however late the other barriers come.
pub(crate) struct BarrierGate {
    task: TaskId,
    aligner: BarrierAligner<InputChannel>,
    held: VecDeque<(InputChannel, ChannelMessage)>,
    first_barrier: Option<Instant>,
    /// The channels whose barrier arrived, held back at the queue through `hold` once more
    /// than `hold_after` messages wait here.
    arrived: BTreeSet<InputChannel>,
    hold: AlignmentHold,
    hold_after: usize,
    holding: bool,
}

impl BarrierGate {
    /// A gate over these input channels of the task whose data queue `hold` holds back.
    pub(crate) fn new(
        task: TaskId,
        channels: impl IntoIterator<Item = InputChannel>,
        hold: AlignmentHold,
    ) -> Self {
        Self {
            task,
            aligner: BarrierAligner::new(channels),
            held: VecDeque::new(),
            first_barrier: None,
            arrived: BTreeSet::new(),
            hold,
            hold_after: HELD_BEFORE_HOLD,
            holding: false,
        }
    }

    /// A reconfiguration added an input channel.
    pub(crate) fn add_channel(&mut self, channel: InputChannel) {
        self.aligner.add_channel(channel);
    }

    /// Decides about one message of `channel`.
    pub(crate) fn admit(
        &mut self,
        channel: InputChannel,
        message: ChannelMessage,
    ) -> Result<Gate, RuntimeError> {
        if self.aligner.holds(&channel) {
            self.held.push_back((channel, message));
            if !self.holding && self.held.len() >= self.hold_after {
                self.holding = true;
                self.hold.set(&self.arrived);
            }
            return Ok(Gate::Held);
        }
        match message {
            ChannelMessage::Barrier(id) => {
                self.first_barrier.get_or_insert_with(Instant::now);
                match self.aligner.on_barrier(channel, id) {
                    Ok(Some(id)) => Ok(Gate::Aligned(id)),
                    Ok(None) => {
                        self.arrived.insert(channel);
                        if self.holding {
                            self.hold.set(&self.arrived);
                        }
                        Ok(Gate::Waiting)
                    }
                    Err(e) => Err(RuntimeError::Checkpoint { task: self.task, what: e.to_string() }),
                }
            }
            other => Ok(Gate::Take(other)),
        }
    }

    /// `channel` ended (after its end of stream was processed): `Some(id)` if that aligned `id`.
    pub(crate) fn on_end(&mut self, channel: &InputChannel) -> Option<CheckpointId> {
        self.aligner.on_end(channel)
    }

    /// After an alignment: the held messages in arrival order, and how long it took (ms).
    pub(crate) fn release(&mut self) -> (VecDeque<(InputChannel, ChannelMessage)>, u64) {
        let ms = self.first_barrier.take().map_or(0, |t| t.elapsed().as_millis() as u64);
        self.arrived.clear();
        if std::mem::take(&mut self.holding) {
            self.hold.set(&self.arrived);
        }
        (std::mem::take(&mut self.held), ms)
    }
}

/// Messages of data channels held behind a barrier, in arrival order.
type Held = VecDeque<(InputChannel, ChannelMessage)>;

/// Checkpoints of a task whose protocol core holds records (Koala, DRRS): the barrier gate in
/// front of the core and, once a checkpoint is aligned, the snapshot deferred until the loop
/// says the core is idle — it has processed every record taken before the barrier and waits for
/// no state (rule 1 of the cut, `koala_protocol::koala::CheckpointCut`). Until then the task
/// takes no data input ([`Self::holds_input`]); commands, peer and fetch lanes go on.
pub(crate) struct CoreCheckpoints {
    gate: BarrierGate,
    /// An aligned checkpoint waiting for the core: its id, what is held behind its barrier, and
    /// the alignment time (ms).
    pending: Option<(CheckpointId, Held, u64)>,
    writer: Option<CheckpointWriter>,
}

impl CoreCheckpoints {
    /// Checkpoints over these input channels.
    pub(crate) fn new(
        task: TaskId,
        channels: impl IntoIterator<Item = InputChannel>,
        hold: AlignmentHold,
    ) -> Self {
        Self { gate: BarrierGate::new(task, channels, hold), pending: None, writer: None }
    }

    /// A reconfiguration added an input channel.
    pub(crate) fn add_channel(&mut self, channel: InputChannel) {
        self.gate.add_channel(channel);
    }

    /// Whether data input must wait: an aligned checkpoint waits for its snapshot.
    pub(crate) fn holds_input(&self) -> bool {
        self.pending.is_some()
    }

    /// One message of a data channel: `Some` to hand to the core now; a barrier, or a message
    /// of a channel held behind one, stays here.
    pub(crate) fn admit(
        &mut self,
        channel: InputChannel,
        message: ChannelMessage,
    ) -> Result<Option<ChannelMessage>, RuntimeError> {
        if let Some((_, held, _)) = self.pending.as_mut() {
            held.push_back((channel, message));
            return Ok(None);
        }
        match self.gate.admit(channel, message)? {
            Gate::Take(ChannelMessage::EndOfStream) => {
                // An ended channel counts as arrived: its end may align a checkpoint.
                if let Some(id) = self.gate.on_end(&channel) {
                    self.align(id);
                }
                Ok(Some(ChannelMessage::EndOfStream))
            }
            Gate::Take(message) => Ok(Some(message)),
            Gate::Held | Gate::Waiting => Ok(None),
            Gate::Aligned(id) => {
                self.align(id);
                Ok(None)
            }
        }
    }

    /// An input channel ended without its end of stream passing [`Self::admit`] (its upstream
    /// finished before this task knew it).
    pub(crate) fn on_end(&mut self, channel: &InputChannel) {
        if let Some(id) = self.gate.on_end(channel) {
            self.align(id);
        }
    }

    fn align(&mut self, id: CheckpointId) {
        let (held, alignment_ms) = self.gate.release();
        self.pending = Some((id, held, alignment_ms));
    }

    /// The checkpoint aligned and waiting for the core, if any.
    pub(crate) fn pending(&self) -> Option<CheckpointId> {
        self.pending.as_ref().map(|(id, _, _)| *id)
    }

    /// Takes the pending checkpoint's snapshot now (the caller checked that the core is idle):
    /// `meta` as the task gives it, its store frozen, the barrier forwarded on every output and
    /// the part handed to the writer. Returns what was held behind the barrier, to be admitted
    /// again in order.
    pub(crate) fn snapshot(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut crate::output::Outputs,
        view: Option<Box<dyn FrozenView>>,
        meta: TaskMeta,
    ) -> Result<Held, RuntimeError> {
        let Some((id, held, alignment_ms)) = self.pending.take() else { return Ok(Held::new()) };
        outputs.broadcast_barrier(id)?;
        let writer = match &mut self.writer {
            Some(writer) => writer,
            None => self.writer.insert(CheckpointWriter::start(setup, id)?),
        };
        writer.submit(id, view, meta, alignment_ms)?;
        Ok(held)
    }

    /// The writer's failure, if it failed.
    pub(crate) fn check(&self) -> Result<(), RuntimeError> {
        self.writer.as_ref().map_or(Ok(()), CheckpointWriter::check)
    }

    /// Waits until every part handed over is written (before the task reports it finished).
    pub(crate) fn finish(&mut self) -> Result<(), RuntimeError> {
        self.writer.as_mut().map_or(Ok(()), CheckpointWriter::finish)
    }
}

/// Tells the coordinator `task` wrote its part of checkpoint `id`.
pub(crate) fn acknowledge(setup: &TaskSetup, id: CheckpointId, ack: TaskCheckpoint) {
    let _ = setup.events.send(WorkerMessage::CheckpointAck { task: setup.task, id, ack });
}

/// The buckets `task` owns in `deployment` (none if its operator is not keyed).
pub(crate) fn owned_in(deployment: &Deployment, task: TaskId) -> BTreeSet<BucketId> {
    deployment.routing.get(&task.operator).map_or_else(BTreeSet::new, |table| {
        table.iter().enumerate().filter(|(_, o)| **o == task.index).map(|(b, _)| b as BucketId).collect()
    })
}

/// Whether the task's store is shared by every task of its operator (the Remote backend).
fn shared_store(setup: &TaskSetup) -> bool {
    setup.deployment.protocol == Protocol::Remote
}

/// The task's store frozen at its barrier (`None`: a stateless task): every bucket of a private
/// store (cold state a Koala task still holds for others included), only `owned` of a shared one.
pub(crate) fn freeze(
    setup: &TaskSetup,
    owned: impl FnOnce() -> BTreeSet<BucketId>,
) -> Result<Option<Box<dyn FrozenView>>, RuntimeError> {
    let Some(store) = setup.store.as_deref() else { return Ok(None) };
    if shared_store(setup) {
        let owned: Vec<BucketId> = owned().into_iter().collect();
        let view = store.freeze(&owned)?;
        return Ok(Some(Box::new(OwnedView::new(view, owned))));
    }
    let all: Vec<BucketId> = (0..setup.num_buckets).collect();
    let started = std::time::Instant::now();
    let view = store.freeze(&all)?;
    // On the task's thread: what a checkpoint costs the records (a tracked store copies only
    // the groups its writer scans).
    tracing::debug!(task = %setup.task, copied = view.copied_bytes(), us = started.elapsed().as_micros() as u64, "store frozen");
    Ok(Some(view))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use koala_types::OperatorId;

    use super::*;
    use crate::channel::TaskInput;
    use crate::queue::{SendFailed, data_queue};

    fn channel(from: u32) -> InputChannel {
        InputChannel { input: 0, from: TaskId::new(OperatorId(0), from) }
    }

    fn input(from: u32, n: u64) -> TaskInput {
        TaskInput { channel: channel(from), message: ChannelMessage::Watermark(n) }
    }

    #[test]
    fn past_the_bound_a_channel_whose_barrier_arrived_is_not_read_until_the_checkpoint_aligns()
    -> Result<(), RuntimeError> {
        let (tx, rx) = data_queue(8);
        let gone = || RuntimeError::NoInbox(TaskId::new(OperatorId(1), 0));
        let mut gate =
            BarrierGate::new(TaskId::new(OperatorId(1), 0), [channel(0), channel(1)], rx.alignment_hold());
        gate.hold_after = 2;
        assert!(matches!(gate.admit(channel(0), ChannelMessage::Barrier(1))?, Gate::Waiting));
        // Below the bound, channel 0 is read and its messages are kept behind the barrier.
        tx.send(input(0, 1)).map_err(|_| gone())?;
        assert!(matches!(gate.admit(channel(0), ChannelMessage::Watermark(1))?, Gate::Held));
        assert!(matches!(gate.admit(channel(0), ChannelMessage::Watermark(2))?, Gate::Held));
        // At the bound, channel 0's sender waits at the queue (nothing more piles up behind the
        // barrier) while channel 1 goes on.
        let refused = tx.send_timeout(input(0, 3), Duration::from_millis(5));
        assert!(matches!(refused, Err(SendFailed::Timeout(_))), "channel 0 is held back");
        tx.send(input(1, 1)).map_err(|_| gone())?;
        assert!(matches!(gate.admit(channel(1), ChannelMessage::Watermark(1))?, Gate::Take(_)));
        assert!(matches!(gate.admit(channel(1), ChannelMessage::Barrier(1))?, Gate::Aligned(1)));
        let (held, _) = gate.release();
        assert_eq!(held.len(), 2, "the two messages kept behind the barrier");
        // Aligned: channel 0 is read again.
        assert!(tx.send_timeout(input(0, 4), Duration::from_secs(5)).is_ok(), "channel 0 is released");
        Ok(())
    }
}
