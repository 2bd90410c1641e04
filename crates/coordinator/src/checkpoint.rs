//! The coordinator's checkpoints and recoveries (docs/architecture.md §10): the I/O around the
//! checkpoint core (`koala_protocol::checkpoint::CheckpointCore`, which the simulator drives
//! too). Every `checkpoint_interval_ms` it injects barriers at the live sources — never while a
//! reconfiguration runs or a cancelled Koala task still holds state, and no reconfiguration
//! starts while a checkpoint runs — records each completed checkpoint in the metrics database,
//! tells the sinks to commit, and deletes checkpoints beyond `checkpoints_retained`.
//!
//! A lost worker (closed connection or no heartbeat) then no longer fails the job: every other
//! worker restarts its process and registers again (with any replacement that registered), and
//! the job is deployed anew from the latest completed checkpoint — the same tasks and routing,
//! placed over the workers there are now — with sources rewound to their recorded positions.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use koala_protocol::checkpoint::{CheckpointAction, CheckpointCore, TaskCheckpoint};
use koala_protocol::engine::Engine;
use koala_protocol::{ClientReply, CoordinatorMessage, Deployment, RestorePoint, WorkerMessage};
use koala_types::{CheckpointId, TaskId, WorkerId};

use crate::clock::unix_ms;
use crate::control::{Event, Registrations, STARTUP_TIMEOUT};
use crate::error::CoordinatorError;
use crate::job::JobState;
use crate::metrics_store::{CheckpointRecord, RecoveryRecord};
use crate::progress::ProgressEvent;
use crate::reconfig::operator_inputs;
use crate::resume::CheckpointMetadata;

/// Recoveries in a row, with no checkpoint completed between them, after which a failure ends
/// the job: a task that fails the same way after every restart (a bug, a bad record) must not
/// restart forever.
const MAX_RECOVERIES_WITHOUT_PROGRESS: u32 = 3;

/// A completed checkpoint the job can restart from.
struct Latest {
    point: RestorePoint,
    deployment: Deployment,
}

/// The job's checkpoints.
pub(crate) struct Checkpoints {
    core: CheckpointCore,
    interval: Duration,
    dir: PathBuf,
    next_due: Instant,
    /// The running checkpoint.
    running: Option<RunningCheckpoint>,
    latest: Option<Latest>,
    /// What a job restarts from when no checkpoint completed yet.
    initial: Deployment,
    /// Completed checkpoints (without their deployments), for the summary.
    pub(crate) completed: Vec<CheckpointRecord>,
    /// Recoveries, for the summary; the last one's first output arrives after [`Self::recover`].
    pub(crate) recoveries: Vec<RecoveryRecord>,
    /// Checkpoints skipped: due while the previous one was still being written.
    pub(crate) skipped: u64,
    /// Recoveries since a checkpoint last completed (a failure that recurs before the job gets
    /// anywhere ends it after [`MAX_RECOVERIES_WITHOUT_PROGRESS`]).
    recoveries_since_completed: u32,
    /// Reconfiguration requests started after the latest completed checkpoint started, oldest
    /// first, up to the running checkpoint's start: a recovery runs them again.
    redo: Vec<koala_protocol::ReconfigRequest>,
    /// The job's config as TOML, for each checkpoint's metadata (`crate::resume`).
    config_text: String,
    /// The job's elapsed time at its (re)start, ms: 0, or a resumed checkpoint's.
    elapsed_base_ms: u64,
}

/// A checkpoint whose barriers are out.
struct RunningCheckpoint {
    id: CheckpointId,
    /// When it started (unix ms).
    started_ms: u64,
    /// The deployment it covers.
    deployment: Deployment,
    /// Requests queued (not started) at its start.
    pending: Vec<koala_protocol::ReconfigRequest>,
    /// The job's elapsed time at its start, ms.
    elapsed_ms: u64,
}

impl Checkpoints {
    /// Checkpoints of a job deployed as `initial`, if its config turns them on; `resumed`: the
    /// checkpoint a resumed job started from (`koala run --resume`). A fresh job clears the
    /// checkpoints directory; a resumed one removes the checkpoints after its own (started, never
    /// completed: their parts must not mix with the new ones').
    pub(crate) fn new(
        config: &crate::config::JobConfig,
        initial: &Deployment,
        resumed: Option<&CheckpointMetadata>,
    ) -> Result<Option<Self>, CoordinatorError> {
        let (Some(ms), Some(dir)) = (config.checkpoint_interval_ms, config.checkpoint_dir()) else {
            return Ok(None);
        };
        let interval = Duration::from_millis(ms);
        let after = resumed.map_or(0, |m| m.point.id);
        if let Ok(listing) = std::fs::read_dir(&dir) {
            for entry in listing.filter_map(Result::ok) {
                let id = entry.file_name().to_str().and_then(|n| n.parse::<CheckpointId>().ok());
                if id.is_some_and(|id| resumed.is_none() || id > after) {
                    let path = entry.path();
                    std::fs::remove_dir_all(&path)
                        .map_err(crate::error::io(format!("clearing {}", path.display())))?;
                }
            }
        }
        Ok(Some(Self {
            core: CheckpointCore::new(config.checkpoints_retained, after),
            interval,
            dir,
            next_due: Instant::now() + interval,
            running: None,
            latest: resumed.map(|m| Latest { point: m.point.clone(), deployment: m.deployment.clone() }),
            initial: initial.clone(),
            completed: Vec::new(),
            skipped: 0,
            recoveries: Vec::new(),
            recoveries_since_completed: 0,
            redo: Vec::new(),
            config_text: toml::to_string(config).unwrap_or_default(),
            elapsed_base_ms: resumed.map_or(0, |m| m.elapsed_ms),
        }))
    }

    /// Starts a checkpoint if one is due and the job allows it now.
    pub(crate) fn tick(&mut self, state: &mut JobState) -> Result<(), CoordinatorError> {
        let now = Instant::now();
        if now < self.next_due {
            return Ok(());
        }
        if let Some(running) = self.core.running() {
            // Still being written when the next is due: skipped and counted, not queued — a
            // queued barrier would follow the slow one at once and keep the writers busy.
            self.skip(state, now, running)?;
            return Ok(());
        }
        // Not during a reconfiguration, nor while lazy Koala state sits at a cancelled task.
        let retired = state.graph.operators.iter().any(|o| !state.engine.retired(o.id).is_empty());
        if state.engine.running().is_some() || retired {
            return Ok(());
        }
        self.next_due = now + self.interval;
        let d = state.engine.deployment();
        let is_source = |t: &TaskId| state.graph.operator(t.operator).is_some_and(|o| o.is_source());
        let all: BTreeSet<TaskId> = d.placement.keys().copied().collect();
        let live: BTreeSet<TaskId> = all.difference(&d.finished).copied().collect();
        let sources: BTreeSet<TaskId> = live.iter().copied().filter(is_source).collect();
        let finished: Vec<TaskId> = d.finished.iter().copied().filter(is_source).collect();
        if let Some(CheckpointAction::Inject { id, .. }) = self.core.start(d.epoch, live, sources, finished) {
            let started_ms = unix_ms();
            self.running = Some(RunningCheckpoint {
                id,
                started_ms,
                deployment: d.clone(),
                pending: state.queue.iter().map(|q| q.request.clone()).collect(),
                elapsed_ms: self.elapsed_base_ms + started_ms.saturating_sub(state.start_ms),
            });
            state.checkpoint_running = true;
            // What started before this checkpoint is in its deployment once it completes.
            self.redo.append(&mut state.started_requests);
            tracing::info!(id, "checkpoint {id} started");
            state.workers.broadcast_to_reachable(&CoordinatorMessage::Checkpoint { id });
        }
        Ok(())
    }

    /// The checkpoint due now is skipped: `running` is still being written. The next is due a
    /// whole interval after the skipped one (the schedule keeps its grid).
    fn skip(
        &mut self,
        state: &mut JobState,
        now: Instant,
        running: CheckpointId,
    ) -> Result<(), CoordinatorError> {
        let late = now.duration_since(self.next_due);
        let due_ms = unix_ms().saturating_sub(late.as_millis() as u64);
        let intervals = (late.as_nanos() / self.interval.as_nanos().max(1)) as u32 + 1;
        self.next_due += self.interval * intervals;
        self.skipped += 1;
        tracing::info!(
            running,
            skipped = self.skipped,
            "checkpoint skipped: checkpoint {running} is still running"
        );
        state.store.checkpoint_skipped(state.run, due_ms, running)?;
        Ok(())
    }

    /// A task's acknowledgement.
    pub(crate) fn on_ack(
        &mut self,
        state: &mut JobState,
        task: TaskId,
        id: CheckpointId,
        ack: TaskCheckpoint,
    ) -> Result<(), CoordinatorError> {
        match self.core.on_ack(task, id, ack) {
            Ok(action) => self.execute(state, action),
            Err(e) => Err(CoordinatorError::Protocol {
                epoch: state.epoch,
                source_task: state.name(task),
                error: e.to_string(),
            }),
        }
    }

    /// A task finished: the running checkpoint no longer waits for it.
    pub(crate) fn on_finished(&mut self, state: &mut JobState, task: TaskId) -> Result<(), CoordinatorError> {
        let action = self.core.on_finished(task);
        self.execute(state, action)
    }

    fn execute(
        &mut self,
        state: &mut JobState,
        action: Option<CheckpointAction>,
    ) -> Result<(), CoordinatorError> {
        let Some(CheckpointAction::Completed { checkpoint, discard }) = action else { return Ok(()) };
        let id = checkpoint.id;
        let Some(running) = self.running.take().filter(|r| r.id == id) else {
            return Ok(());
        };
        let started_ms = running.started_ms;
        let deployment = running.deployment;
        let completed_ms = unix_ms();
        let parts = checkpoint.tasks.values();
        let bytes: u64 = parts.clone().map(|t| t.bytes).sum();
        let path = self.dir.join(id.to_string());
        let mut record = CheckpointRecord {
            id,
            epoch: checkpoint.epoch,
            started_ms,
            completed_ms,
            bytes,
            written_bytes: Some(parts.clone().map(|t| t.written_bytes).sum()),
            entries: parts.clone().map(|t| t.entries).sum(),
            alignment_ms: parts.map(|t| t.alignment_ms).max().unwrap_or(0),
            path: path.to_string_lossy().into_owned(),
            deployment: koala_types::encode(&deployment).unwrap_or_default(),
        };
        state.store.checkpoint_completed(state.run, &record)?;
        record.deployment = Vec::new();
        self.completed.push(record);
        let positions =
            checkpoint.tasks.iter().filter_map(|(t, part)| Some((*t, part.position.clone()?))).collect();
        let event_times =
            checkpoint.tasks.iter().filter_map(|(t, part)| Some((*t, part.event_time?))).collect();
        // A source that finished before the barrier acknowledged nothing: its count is its last.
        let records = checkpoint
            .tasks
            .iter()
            .map(|(t, part)| match part.position {
                Some(koala_types::SourcePosition::Finished) => {
                    (*t, state.totals.latest_total(*t).unwrap_or(0))
                }
                _ => (*t, part.records),
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        let point = RestorePoint { id, positions, event_times, records };
        // Durable before any sink commits: every committed part belongs to a checkpoint a
        // resume finds.
        let meta = CheckpointMetadata {
            point: point.clone(),
            deployment: deployment.clone(),
            pending: running.pending,
            elapsed_ms: running.elapsed_ms,
            config: self.config_text.clone(),
        };
        crate::resume::write(&path, &meta)?;
        tracing::info!(id, bytes, ms = completed_ms.saturating_sub(started_ms), "checkpoint {id} completed");
        state.workers.broadcast_to_reachable(&CoordinatorMessage::CheckpointCommitted { id });
        self.latest = Some(Latest { point, deployment });
        self.recoveries_since_completed = 0;
        self.redo.clear();
        for old in discard {
            let dir = self.dir.join(old.to_string());
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(error = %e, dir = %dir.display(), "could not delete an old checkpoint");
            }
        }
        state.checkpoint_running = false;
        state.start_next()
    }

    /// Whether a failure may still be recovered from (see [`MAX_RECOVERIES_WITHOUT_PROGRESS`]).
    pub(crate) fn may_recover(&self) -> bool {
        self.recoveries_since_completed < MAX_RECOVERIES_WITHOUT_PROGRESS
    }

    /// Recovery after `lost` (a lost or silent worker, or a failed task): every other worker restarts; the job is deployed again from the
    /// latest completed checkpoint (or from its start when none completed) over the workers that
    /// register, and started. Returns the new workers' ids.
    pub(crate) fn recover(
        &mut self,
        state: &mut JobState,
        registrations: &mut Registrations,
        events: &Receiver<Event>,
        lost: &CoordinatorError,
    ) -> Result<Vec<WorkerId>, CoordinatorError> {
        let detected_ms = unix_ms();
        let began = Instant::now();
        tracing::warn!(%lost, "recovering from the last completed checkpoint");
        if self.core.abandon().is_some() {
            self.running = None;
            state.checkpoint_running = false;
        }
        // The restored deployment predates these: they run again, in order, before any queued.
        let mut redo = std::mem::take(&mut self.redo);
        redo.append(&mut state.started_requests);
        if let Some(plan) = state.engine.running() {
            tracing::warn!(
                epoch = plan.epoch,
                "a reconfiguration was running at the loss; it runs again after the recovery"
            );
        }
        for request in redo.into_iter().rev() {
            state.queue.push_front(crate::job::Queued { request, reply: None, came_ms: unix_ms() });
        }
        self.recoveries_since_completed += 1;
        let lost_worker = match lost {
            CoordinatorError::WorkerLost(w) => Some(*w),
            CoordinatorError::WorkerSilent { worker, .. } => Some(*worker),
            _ => None,
        };
        // Every worker that hears it restarts its process; the lost one is not told, and one
        // whose connection is gone (a failed task's peer, dead before its loss was noticed) does
        // not hear it.
        let mut restarting = 0u32;
        for w in state.workers.ids() {
            if Some(w) != lost_worker
                && state.workers.send(w.0 as usize, &CoordinatorMessage::Restart).is_ok()
            {
                restarting += 1;
            }
        }
        let expected = restarting.max(1);
        let workers = registrations.collect(expected, STARTUP_TIMEOUT)?;
        let (point, mut d) = match &self.latest {
            Some(l) => (Some(l.point.clone()), l.deployment.clone()),
            None => (None, self.initial.clone()),
        };
        // The same tasks, placed over the workers there are now (old ids in order, round-robin).
        let new = workers.ids();
        if let Some(point) = &point {
            crate::resume::log_positions(point);
        }
        crate::resume::place(&mut d, &workers.addrs);
        d.options.checkpoint.restore = point.clone();
        state.totals.rewound(&point.as_ref().map(|p| p.records.clone()).unwrap_or_default());
        state.workers = workers;
        state
            .workers
            .broadcast(&CoordinatorMessage::Deploy(Box::new(d.clone()), state.config.state_options()))?;
        let mut deployed = BTreeSet::new();
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while deployed.len() < new.len() {
            let event = events.recv_deadline(deadline).map_err(|_| {
                CoordinatorError::Timeout(format!(
                    "workers did not acknowledge the recovery within {} s",
                    STARTUP_TIMEOUT.as_secs()
                ))
            })?;
            match event {
                Event::Worker(w, _) if !state.workers.contains(w) => {}
                Event::Worker(w, Some(WorkerMessage::Deployed)) => {
                    deployed.insert(w);
                }
                Event::Worker(worker, Some(WorkerMessage::DeployFailed { error })) => {
                    return Err(CoordinatorError::Deploy { worker, error });
                }
                Event::Worker(w, None) => return Err(CoordinatorError::WorkerLost(w)),
                Event::Worker(_, Some(_)) => {}
                Event::Client(_, reply) => {
                    let _ = reply.send(ClientReply::Rejected {
                        error: "the job is recovering from a lost worker; submit again once it runs".into(),
                    });
                }
            }
        }
        // The restored job starts now: a sink may write before this thread goes on.
        let restarted_ms = unix_ms();
        state.workers.broadcast(&CoordinatorMessage::Start)?;
        // The restore point belongs to the Deploy above: tasks a later reconfiguration creates
        // (the redone request's first) start empty, never from the checkpoint.
        d.options.checkpoint.restore = None;
        let mut engine = Engine::new(d, operator_inputs(state.graph)).map_err(|e| {
            CoordinatorError::Protocol { epoch: 0, source_task: "coordinator".into(), error: e.to_string() }
        })?;
        engine.set_drrs_options(state.config.drrs);
        state.engine = engine;
        state.timing = None;
        state.ended_ms.clear();
        let checkpoint = point.as_ref().map_or(0, |p| p.id);
        let record = RecoveryRecord {
            lost: lost.to_string(),
            detected_ms,
            restarted_ms,
            first_output_ms: None,
            checkpoint,
        };
        state.store.recovered(state.run, &record)?;
        // One figure wherever it is printed: from the loss's detection to the restarted job.
        let ms = restarted_ms.saturating_sub(detected_ms);
        tracing::info!(
            checkpoint,
            ms,
            workers = new.len(),
            setup_ms = began.elapsed().as_millis() as u64,
            "recovered: the job restarted from checkpoint {checkpoint}"
        );
        state.say(ProgressEvent::Recovered {
            second: state.second_of(restarted_ms),
            lost: lost.to_string(),
            checkpoint,
            ms,
        });
        self.recoveries.push(record);
        self.next_due = Instant::now() + self.interval;
        state.start_next()?;
        Ok(new)
    }

    /// A sink of the restored job wrote its first records at `unix_ms`: the latest recovery's
    /// first output, if it has none yet (the first sink to write decides).
    pub(crate) fn on_first_output(
        &mut self,
        state: &mut JobState,
        unix_ms: u64,
    ) -> Result<(), CoordinatorError> {
        let Some(last) = self.recoveries.last_mut().filter(|r| r.first_output_ms.is_none()) else {
            return Ok(());
        };
        last.first_output_ms = Some(unix_ms);
        state.store.recovery_first_output(state.run, last.detected_ms, unix_ms)?;
        tracing::info!(
            restart_ms = last.restart_ms(),
            first_output_ms = unix_ms.saturating_sub(last.detected_ms),
            "recovery: records flow again {} ms after the loss was detected",
            unix_ms.saturating_sub(last.detected_ms)
        );
        Ok(())
    }
}
