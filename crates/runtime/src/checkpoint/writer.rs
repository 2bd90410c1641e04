//! A task's checkpoint writer (docs/architecture.md §10, "Asynchronous" and "Incremental"):
//! the thread that writes each part a task froze at its barrier — only what changed since the
//! task's previous part — and acknowledges it once it is durable; and the change log its store
//! keeps for that ([`tracked_store`]).

use std::path::{Path, PathBuf};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use koala_protocol::checkpoint::TaskCheckpoint;
use koala_protocol::{Protocol, WorkerMessage};
use koala_state::FrozenView;
use koala_types::{CheckpointId, TaskId};

use super::{TaskMeta, task_dir};
use crate::RuntimeError;
use crate::task::setup::TaskSetup;

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
/// dirty entries of the groups this writer will scan copied, fjall's read snapshot taken) and
/// hands it here, forwards the barrier and goes on; this thread writes the part into `<dir>/<id>/<operator>-<index>` — incrementally,
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
                // Below the task threads: under CPU contention a checkpoint takes longer (and
                // the next is skipped) rather than records waiting. Linux's nice is per thread.
                if let Err(e) = rustix::process::nice(WRITER_NICE) {
                    tracing::debug!(%task, error = %e, "could not lower the checkpoint writer's priority");
                }
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

/// How much lower than the task threads a checkpoint writer runs (a nice increment).
const WRITER_NICE: i32 = 10;

/// Bucket groups of a task's state in a checkpoint (`num_buckets / PARTS_PER_TASK` buckets
/// each): the unit a checkpoint links, appends a delta to, or rewrites.
const PARTS_PER_TASK: u16 = 16;

/// Buckets per group of a checkpoint part ([`PARTS_PER_TASK`]).
pub(crate) fn group_buckets(num_buckets: u16) -> u16 {
    num_buckets.div_ceil(PARTS_PER_TASK)
}

/// A stateful task's store as checkpoints need it: with checkpoints on and a store of its own,
/// wrapped so it logs what changed since each freeze ([`koala_state::ChangeTracking`]), so the
/// writer touches only that. A shared store (Remote) is written per owned bucket as before: the
/// other tasks' writes to a bucket it comes to own are not in its log.
pub(crate) fn tracked_store(
    store: Box<dyn koala_state::StateBackend>,
    options: &koala_protocol::RuntimeOptions,
    protocol: Protocol,
    num_buckets: u16,
) -> Box<dyn koala_state::StateBackend> {
    if options.checkpoint.dir.is_none() || protocol == Protocol::Remote || store.is_shared() {
        return store;
    }
    Box::new(koala_state::ChangeTracking::new(store, num_buckets, group_buckets(num_buckets)))
}

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
        let group = group_buckets(num_buckets);
        let stats = koala_state::snapshot::snapshot_frozen(view, num_buckets, &path, group, base)
            .map_err(|e| e.to_string())?;
        tracing::debug!(%task, checkpoint = job.id, bytes = stats.bytes, written = stats.written_bytes,
            shared = stats.shared_parts, parts = stats.parts, deltas = stats.delta_parts,
            scanned = stats.scanned_groups, "checkpoint part written");
        ack.entries = stats.entries;
        ack.bytes += stats.bytes;
        ack.written_bytes += stats.written_bytes;
        state = Some(path);
    }
    let bytes = koala_types::encode(&job.meta).map_err(|e| e.to_string())?;
    ack.bytes += bytes.len() as u64;
    ack.written_bytes += bytes.len() as u64;
    let tmp = dir.join("meta.tmp");
    std::fs::write(&tmp, &bytes)
        .and_then(|()| std::fs::rename(&tmp, dir.join("meta")))
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    Ok((ack, state))
}
