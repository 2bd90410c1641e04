//! A task's side of checkpoints (docs/architecture.md §10): barrier alignment over its data
//! inputs by the protocol's rule ([`BarrierAligner`], which the simulator runs too), writing its
//! part — its store frozen at the barrier and written out by a background [`CheckpointWriter`]
//! through the snapshot primitive (`koala_state::snapshot`), incrementally; timers and
//! per-channel watermarks — into `<dir>/<id>/<operator>-<index>`, and restoring from one.
//!
//! A restore re-buckets: a stateful task loads the buckets it owns from the snapshots of every
//! task of its operator, so a key's state is found wherever it was at the checkpoint.

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use koala_protocol::WorkerMessage;
use koala_protocol::checkpoint::{BarrierAligner, TaskCheckpoint};
use koala_state::FrozenView;
use koala_types::{BucketId, ChannelMessage, CheckpointId, InputChannel, TaskId, Timestamp, bucket_of};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;
use crate::task::TaskSetup;

/// What a task records besides its state.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct TaskMeta {
    /// Each open input channel's last watermark.
    pub(crate) watermarks: Vec<(InputChannel, Option<Timestamp>)>,
    /// Pending timers.
    pub(crate) timers: Vec<(Timestamp, Vec<u8>)>,
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
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(Job { id, view, meta, alignment_ms }));
        if !matches!(sent, Some(Ok(()))) {
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

/// The buckets `task` owns in the deployment (`None`: not a stateful operator).
fn owned_buckets(setup: &TaskSetup) -> Option<BTreeSet<BucketId>> {
    let table = setup.deployment.routing.get(&setup.task.operator)?;
    Some(
        table
            .iter()
            .enumerate()
            .filter(|(_, o)| **o == setup.task.index)
            .map(|(b, _)| b as BucketId)
            .collect(),
    )
}

/// A restarted job (`checkpoint.restore`): loads this task's state and timers from the
/// checkpoint — the buckets it owns from every task of its operator — and returns its own
/// record's watermarks with those timers. `None` when the job does not restore.
pub(crate) fn restore_task(setup: &TaskSetup) -> Result<Option<TaskMeta>, RuntimeError> {
    let task = setup.task;
    let fail = |what: String| RuntimeError::Checkpoint { task, what };
    let (Some(root), Some(point)) =
        (setup.options.checkpoint.dir.as_deref(), &setup.options.checkpoint.restore)
    else {
        return Ok(None);
    };
    let own = task_dir(Path::new(root), point.id, task);
    let owned = owned_buckets(setup);
    let prefix = format!("{}-", task.operator.0);
    let checkpoint = Path::new(root).join(point.id.to_string());
    // No directory: no transform task had a part (every one had finished).
    let listing = match std::fs::read_dir(&checkpoint) {
        Ok(listing) => Some(listing),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(fail(format!("reading {}: {e}", checkpoint.display()))),
    };
    let mut dirs: Vec<PathBuf> = listing
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)))
        .collect();
    dirs.sort();
    if let Some(store) = setup.store.as_deref() {
        // Whatever the store held before the crash is not the checkpoint's.
        let all: Vec<BucketId> = (0..setup.num_buckets).collect();
        store.delete_buckets(&all)?;
        for dir in &dirs {
            let state = dir.join("state");
            if state.join("manifest").exists() {
                koala_state::snapshot::restore(store, &state, owned.as_ref())
                    .map_err(|e| fail(e.to_string()))?;
            }
        }
    }
    let read = |dir: &Path| -> Result<Option<TaskMeta>, RuntimeError> {
        let path = dir.join("meta");
        if !path.exists() {
            return Ok(None);
        }
        let bytes = std::fs::read(&path).map_err(|e| fail(format!("reading {}: {e}", path.display())))?;
        koala_types::decode(&bytes).map(Some).map_err(|e| fail(format!("{}: {e}", path.display())))
    };
    let mut meta = read(&own)?.unwrap_or_default();
    meta.timers.clear();
    for dir in &dirs {
        // A stateless task's timers are its own; a stateful task's are those of its buckets.
        let Some(other) = read(dir)? else { continue };
        match &owned {
            Some(owned) => meta.timers.extend(
                other.timers.into_iter().filter(|(_, k)| owned.contains(&bucket_of(k, setup.num_buckets))),
            ),
            None if *dir == own => meta.timers.extend(other.timers),
            None => {}
        }
    }
    tracing::info!(%task, checkpoint = point.id, timers = meta.timers.len(), "restored from a checkpoint");
    Ok(Some(meta))
}
