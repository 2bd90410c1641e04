//! A task's side of checkpoints (docs/architecture.md §10): barrier alignment over its data
//! inputs by the protocol's rule ([`BarrierAligner`], which the simulator runs too), writing its
//! snapshot — state streamed through the snapshot primitive (`koala_state::snapshot`; the
//! write-back cache's dirty entries included, as every scan sees them), timers and per-channel
//! watermarks — into `<dir>/<id>/<operator>-<index>`, and restoring from one.
//!
//! A restore re-buckets: a stateful task loads the buckets it owns from the snapshots of every
//! task of its operator, so a key's state is found wherever it was at the checkpoint.

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Instant;

use koala_protocol::WorkerMessage;
use koala_protocol::checkpoint::{BarrierAligner, TaskCheckpoint};
use koala_types::{BucketId, ChannelMessage, CheckpointId, InputChannel, TaskId, Timestamp, bucket_of};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;
use crate::task::TaskSetup;

/// Bytes per snapshot part file.
const PART_BYTES: u64 = 64 << 20;

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

/// Writes `task`'s part of checkpoint `id`: its store (if any) and `meta`; returns what it wrote.
pub(crate) fn write_task_checkpoint(
    setup: &TaskSetup,
    id: CheckpointId,
    meta: &TaskMeta,
    alignment_ms: u64,
) -> Result<TaskCheckpoint, RuntimeError> {
    let task = setup.task;
    let fail = |what: String| RuntimeError::Checkpoint { task, what };
    let Some(root) = setup.options.checkpoint.dir.as_deref() else {
        return Err(fail(format!("barrier of checkpoint {id} in a job without checkpoints")));
    };
    let dir = task_dir(Path::new(root), id, task);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| fail(format!("clearing {}: {e}", dir.display())))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
    let mut ack = TaskCheckpoint { alignment_ms, ..TaskCheckpoint::default() };
    if let Some(store) = setup.store.as_deref() {
        let stats = koala_state::snapshot::snapshot(store, setup.num_buckets, &dir.join("state"), PART_BYTES)
            .map_err(|e| fail(e.to_string()))?;
        ack.entries = stats.entries;
        ack.bytes += stats.bytes;
    }
    let bytes = koala_types::encode(meta).map_err(|e| fail(e.to_string()))?;
    ack.bytes += bytes.len() as u64;
    let tmp = dir.join("meta.tmp");
    std::fs::write(&tmp, &bytes)
        .and_then(|()| std::fs::rename(&tmp, dir.join("meta")))
        .map_err(|e| fail(format!("writing {}: {e}", tmp.display())))?;
    Ok(ack)
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
