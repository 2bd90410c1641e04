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
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use koala_protocol::checkpoint::{BarrierAligner, TaskCheckpoint};
use koala_protocol::koala::CutPart;
use koala_protocol::{Deployment, Protocol, WorkerMessage};
use koala_state::{FrozenView, OwnedView};
use koala_types::{BucketId, ChannelMessage, CheckpointId, InputChannel, TaskId, Timestamp};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;
use crate::task::TaskSetup;

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

/// A task's barrier alignment over its data inputs, with the messages of held channels.
pub(crate) struct BarrierGate {
    task: TaskId,
    aligner: BarrierAligner<InputChannel>,
    held: VecDeque<(InputChannel, ChannelMessage)>,
    first_barrier: Option<Instant>,
}

impl BarrierGate {
    /// A gate over these input channels.
    pub(crate) fn new(task: TaskId, channels: impl IntoIterator<Item = InputChannel>) -> Self {
        Self { task, aligner: BarrierAligner::new(channels), held: VecDeque::new(), first_barrier: None }
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
            return Ok(Gate::Held);
        }
        match message {
            ChannelMessage::Barrier(id) => {
                self.first_barrier.get_or_insert_with(Instant::now);
                match self.aligner.on_barrier(channel, id) {
                    Ok(Some(id)) => Ok(Gate::Aligned(id)),
                    Ok(None) => Ok(Gate::Waiting),
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
    pub(crate) fn new(task: TaskId, channels: impl IntoIterator<Item = InputChannel>) -> Self {
        Self { gate: BarrierGate::new(task, channels), pending: None, writer: None }
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

/// One checkpoint as a task captured it at its barrier, for its writer.
struct Job {
    id: CheckpointId,
    /// Its store as of the barrier (`None`: a stateless task).
    view: Option<Box<dyn FrozenView>>,
    meta: TaskMeta,
    alignment_ms: u64,
}

/// A task's checkpoint writer (docs/architecture.md §10, "Asynchronous, incremental"): at the
/// barrier the task only freezes its store ([`koala_state::StateBackend::freeze`]: the cache's
/// dirty entries copied, fjall's read snapshot taken) and hands it here, forwards the barrier and
/// goes on; this thread writes the part into `<dir>/<id>/<operator>-<index>` — incrementally,
/// sharing the files of unchanged buckets with the task's previous part — and acknowledges the
/// checkpoint to the coordinator once it is durable. One checkpoint waits while one is written;
/// a third barrier waits for the writer (memory for views stays bounded). A failure is the
/// task's: [`Self::check`] returns it on the task's thread.
pub(crate) struct CheckpointWriter {
    task: TaskId,
    jobs: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
    failed: Arc<Mutex<Option<String>>>,
}

impl CheckpointWriter {
    /// Starts the writer of a task of a job with checkpoints.
    pub(crate) fn start(setup: &TaskSetup, id: CheckpointId) -> Result<Self, RuntimeError> {
        let task = setup.task;
        let Some(root) = setup.options.checkpoint.dir.as_deref() else {
            let what = format!("barrier of checkpoint {id} in a job without checkpoints");
            return Err(RuntimeError::Checkpoint { task, what });
        };
        let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(1);
        let failed = Arc::new(Mutex::new(None));
        let (root, events, num_buckets) = (PathBuf::from(root), setup.events.clone(), setup.num_buckets);
        let failure = Arc::clone(&failed);
        let thread = std::thread::Builder::new()
            .name(format!("ckpt-{}-{}", task.operator.0, task.index))
            .spawn(move || {
                // The state directory of the part this writer wrote last: the base to share with.
                let mut base: Option<PathBuf> = None;
                for job in queue {
                    match write_part(&root, task, num_buckets, &job, base.as_deref()) {
                        Ok((ack, state)) => {
                            base = state;
                            let _ = events.send(WorkerMessage::CheckpointAck { task, id: job.id, ack });
                        }
                        Err(what) => {
                            tracing::error!(%task, checkpoint = job.id, %what, "writing a checkpoint failed");
                            if let Ok(mut failed) = failure.lock() {
                                *failed = Some(format!("checkpoint {}: {what}", job.id));
                            }
                            return;
                        }
                    }
                }
            })
            .map_err(|e| RuntimeError::Checkpoint { task, what: format!("starting its writer: {e}") })?;
        Ok(Self { task, jobs: Some(jobs), thread: Some(thread), failed })
    }

    /// Hands checkpoint `id` as captured at the barrier to the writer (waiting while it still
    /// has one queued).
    pub(crate) fn submit(
        &self,
        id: CheckpointId,
        view: Option<Box<dyn FrozenView>>,
        meta: TaskMeta,
        alignment_ms: u64,
    ) -> Result<(), RuntimeError> {
        self.check()?;
        let sent =
            self.jobs.as_ref().is_some_and(|jobs| jobs.send(Job { id, view, meta, alignment_ms }).is_ok());
        if !sent {
            self.check()?;
            let what = format!("its writer stopped before checkpoint {id}");
            return Err(RuntimeError::Checkpoint { task: self.task, what });
        }
        Ok(())
    }

    /// The writer's failure, if it failed.
    pub(crate) fn check(&self) -> Result<(), RuntimeError> {
        match self.failed.lock().ok().and_then(|f| f.clone()) {
            Some(what) => Err(RuntimeError::Checkpoint { task: self.task, what }),
            None => Ok(()),
        }
    }

    /// Waits until every checkpoint handed over is written and acknowledged (before the task
    /// reports that it finished: a finished task's part is no longer waited for).
    pub(crate) fn finish(&mut self) -> Result<(), RuntimeError> {
        self.jobs = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            let what = "its writer panicked".to_string();
            return Err(RuntimeError::Checkpoint { task: self.task, what });
        }
        self.check()
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Buckets per part file of a task's state in a checkpoint: `num_buckets / PARTS_PER_TASK`, so
/// a part changes only when one of its few buckets changed.
const PARTS_PER_TASK: u16 = 16;

/// Writes `task`'s part of a checkpoint: its frozen store (if any), sharing unchanged part files
/// with `base`, and its meta; returns the acknowledgement and the state directory written.
fn write_part(
    root: &Path,
    task: TaskId,
    num_buckets: u16,
    job: &Job,
    base: Option<&Path>,
) -> Result<(TaskCheckpoint, Option<PathBuf>), String> {
    let dir = task_dir(root, job.id, task);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("clearing {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut ack = TaskCheckpoint { alignment_ms: job.alignment_ms, ..TaskCheckpoint::default() };
    let mut state = None;
    if let Some(view) = job.view.as_deref() {
        let path = dir.join("state");
        let group = num_buckets.div_ceil(PARTS_PER_TASK);
        let stats = koala_state::snapshot::snapshot_frozen(view, num_buckets, &path, group, base)
            .map_err(|e| e.to_string())?;
        tracing::debug!(%task, checkpoint = job.id, bytes = stats.bytes, written = stats.written_bytes,
            shared = stats.shared_parts, parts = stats.parts, "checkpoint part written");
        ack.entries = stats.entries;
        ack.bytes += stats.bytes;
        state = Some(path);
    }
    let bytes = koala_types::encode(&job.meta).map_err(|e| e.to_string())?;
    ack.bytes += bytes.len() as u64;
    let tmp = dir.join("meta.tmp");
    std::fs::write(&tmp, &bytes)
        .and_then(|()| std::fs::rename(&tmp, dir.join("meta")))
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    Ok((ack, state))
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
    Ok(Some(store.freeze(&all)?))
}
