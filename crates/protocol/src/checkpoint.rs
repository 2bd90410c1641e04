//! Aligned checkpoint barriers (asynchronous barrier snapshots, as in Flink; docs/architecture.md
//! §10), sans-IO: the rule a task applies to barriers on its input channels
//! ([`BarrierAligner`]) and the coordinator's side ([`CheckpointCore`]): which checkpoint to start,
//! whom it waits for, and when it is complete. The runtime and the coordinator execute what these
//! decide; the simulator (`crate::sim::checkpoint`) drives the same types.
//!
//! The rule: a source injects `Barrier(id)` into every output channel between two batches and
//! records its position. A task that receives `Barrier(id)` on an input channel holds that
//! channel (its later messages wait, in order) until the barrier arrived on every live input;
//! a channel that ends counts as arrived. Then the task snapshots, forwards the barrier on every
//! output and acknowledges, and takes the held messages in order. So a task's snapshot reflects
//! exactly the records its upstreams sent before their own snapshots: the cut is consistent.
//!
//! ```
//! use koala_protocol::checkpoint::BarrierAligner;
//! let mut a = BarrierAligner::new(["left", "right"]);
//! assert_eq!(a.on_barrier("left", 1), Ok(None));
//! assert!(a.holds(&"left") && !a.holds(&"right"));
//! assert_eq!(a.on_barrier("right", 1), Ok(Some(1)));
//! assert!(!a.holds(&"left"));
//! ```

use std::collections::{BTreeMap, BTreeSet};

use koala_types::{CheckpointId, Epoch, SourcePosition, TaskId};
use serde::{Deserialize, Serialize};

/// A barrier that breaks the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BarrierError {
    /// A barrier of another checkpoint while one is being aligned (checkpoints do not overlap).
    #[error("barrier of checkpoint {got} while checkpoint {aligning} is being aligned")]
    Overlapping {
        /// The checkpoint being aligned.
        aligning: CheckpointId,
        /// The barrier's checkpoint.
        got: CheckpointId,
    },
    /// A second barrier on a channel already held.
    #[error("a second barrier of checkpoint {0} on one channel")]
    Duplicate(CheckpointId),
    /// A barrier on a channel the task does not read (or that ended).
    #[error("a barrier of checkpoint {0} on a channel that is not a live input")]
    UnknownChannel(CheckpointId),
}

/// One task's barrier alignment over its live input channels.
#[derive(Clone, Debug)]
pub struct BarrierAligner<C: Ord + Clone> {
    live: BTreeSet<C>,
    /// The checkpoint being aligned and the channels its barrier arrived on.
    aligning: Option<(CheckpointId, BTreeSet<C>)>,
}

impl<C: Ord + Clone> BarrierAligner<C> {
    /// An aligner over these input channels.
    pub fn new(channels: impl IntoIterator<Item = C>) -> Self {
        Self { live: channels.into_iter().collect(), aligning: None }
    }

    /// One more input channel (a reconfiguration added it).
    pub fn add_channel(&mut self, channel: C) {
        self.live.insert(channel);
    }

    /// Whether messages of `channel` must wait: its barrier arrived, others' not yet.
    pub fn holds(&self, channel: &C) -> bool {
        self.aligning.as_ref().is_some_and(|(_, arrived)| arrived.contains(channel))
    }

    /// Input channels still open.
    pub fn live_channels(&self) -> usize {
        self.live.len()
    }

    /// The checkpoint being aligned, if any.
    pub fn aligning(&self) -> Option<CheckpointId> {
        self.aligning.as_ref().map(|(id, _)| *id)
    }

    /// A barrier arrived on `channel`: `Some(id)` when checkpoint `id` is now aligned (the task
    /// snapshots, forwards the barrier, acknowledges, then takes its held messages).
    pub fn on_barrier(&mut self, channel: C, id: CheckpointId) -> Result<Option<CheckpointId>, BarrierError> {
        if !self.live.contains(&channel) {
            return Err(BarrierError::UnknownChannel(id));
        }
        let (aligning, arrived) = self.aligning.get_or_insert_with(|| (id, BTreeSet::new()));
        if *aligning != id {
            return Err(BarrierError::Overlapping { aligning: *aligning, got: id });
        }
        if !arrived.insert(channel) {
            return Err(BarrierError::Duplicate(id));
        }
        Ok(self.complete())
    }

    /// `channel` ended: it no longer takes part; `Some(id)` if that aligned checkpoint `id`.
    pub fn on_end(&mut self, channel: &C) -> Option<CheckpointId> {
        self.live.remove(channel);
        if let Some((_, arrived)) = self.aligning.as_mut() {
            arrived.remove(channel);
        }
        self.complete()
    }

    fn complete(&mut self) -> Option<CheckpointId> {
        let (id, arrived) = self.aligning.as_ref()?;
        if self.live.iter().all(|c| arrived.contains(c)) {
            let id = *id;
            self.aligning = None;
            return Some(id);
        }
        None
    }
}

/// What a task reports when its snapshot of a checkpoint is written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCheckpoint {
    /// Sources: where the source was at the barrier, as it needs it to resume exactly (the
    /// records a generator emitted, a Kafka source's partition offsets), or
    /// [`SourcePosition::Finished`].
    pub position: Option<SourcePosition>,
    /// Sources: the largest event time among the records emitted before the barrier.
    pub event_time: Option<koala_types::Timestamp>,
    /// Sources and sinks: records emitted or written since the job's start before the barrier
    /// (`koala_types::metric::RECORDS_TOTAL`), so a restored task counts on from there.
    pub records: u64,
    /// State entries written.
    pub entries: u64,
    /// Bytes of the part (state, timers, watermarks), written now or shared with the task's
    /// previous part.
    pub bytes: u64,
    /// Bytes written anew: the rest is shared with the task's previous part.
    pub written_bytes: u64,
    /// Milliseconds from the first barrier to the last on this task's inputs.
    pub alignment_ms: u64,
}

/// A checkpoint every task acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletedCheckpoint {
    /// Its number.
    pub id: CheckpointId,
    /// The deployment's epoch it was taken at.
    pub epoch: Epoch,
    /// Every task's part (finished tasks have none; finished sources have
    /// [`SourcePosition::Finished`]).
    pub tasks: BTreeMap<TaskId, TaskCheckpoint>,
}

/// What the coordinator does for checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointAction {
    /// Tell these sources to inject `Barrier(id)`.
    Inject {
        /// The checkpoint.
        id: CheckpointId,
        /// Its live sources.
        sources: Vec<TaskId>,
    },
    /// Every task acknowledged: record it, tell the sinks to commit, then drop `discard`.
    Completed {
        /// The checkpoint.
        checkpoint: CompletedCheckpoint,
        /// Older checkpoints beyond the retained number, to delete.
        discard: Vec<CheckpointId>,
    },
}

/// Why the coordinator's core refused an event.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// An acknowledgement of a checkpoint that is not running.
    #[error("{task} acknowledged checkpoint {id}, which is not running")]
    UnknownCheckpoint {
        /// The task.
        task: TaskId,
        /// The checkpoint it named.
        id: CheckpointId,
    },
    /// An acknowledgement from a task the checkpoint does not wait for.
    #[error("{task} acknowledged checkpoint {id} twice or without taking part")]
    UnexpectedAck {
        /// The task.
        task: TaskId,
        /// The checkpoint.
        id: CheckpointId,
    },
}

struct Running {
    id: CheckpointId,
    epoch: Epoch,
    waiting: BTreeSet<TaskId>,
    sources: BTreeSet<TaskId>,
    acks: BTreeMap<TaskId, TaskCheckpoint>,
}

/// The coordinator's checkpoint core: one checkpoint at a time, completed when every task that
/// was live at its start acknowledged (a task that finishes first is excused: its outputs
/// preceded its end of stream, which counts as a barrier downstream).
pub struct CheckpointCore {
    next: CheckpointId,
    running: Option<Running>,
    retained: usize,
    completed: Vec<CheckpointId>,
}

impl CheckpointCore {
    /// A core that keeps the last `retained` (at least 1) completed checkpoints; ids start
    /// after `last_id` (so a recovered job never reuses one).
    pub fn new(retained: usize, last_id: CheckpointId) -> Self {
        Self { next: last_id + 1, running: None, retained: retained.max(1), completed: Vec::new() }
    }

    /// The running checkpoint.
    pub fn running(&self) -> Option<CheckpointId> {
        self.running.as_ref().map(|r| r.id)
    }

    /// The latest id handed out (0 if none).
    pub fn last_id(&self) -> CheckpointId {
        self.next - 1
    }

    /// Starts a checkpoint of the deployment at `epoch` over `live` tasks (`sources` among
    /// them; `finished_sources` recorded as [`SourcePosition::Finished`]). None while one runs or nothing is live.
    pub fn start(
        &mut self,
        epoch: Epoch,
        live: BTreeSet<TaskId>,
        sources: BTreeSet<TaskId>,
        finished_sources: impl IntoIterator<Item = TaskId>,
    ) -> Option<CheckpointAction> {
        if self.running.is_some() || sources.is_empty() {
            return None;
        }
        let id = self.next;
        self.next += 1;
        let acks = finished_sources
            .into_iter()
            .map(|t| {
                (t, TaskCheckpoint { position: Some(SourcePosition::Finished), ..TaskCheckpoint::default() })
            })
            .collect();
        let inject: Vec<TaskId> = sources.iter().copied().collect();
        self.running = Some(Running { id, epoch, waiting: live, sources, acks });
        Some(CheckpointAction::Inject { id, sources: inject })
    }

    /// A task acknowledged checkpoint `id`.
    pub fn on_ack(
        &mut self,
        task: TaskId,
        id: CheckpointId,
        ack: TaskCheckpoint,
    ) -> Result<Option<CheckpointAction>, CheckpointError> {
        let Some(running) = self.running.as_mut().filter(|r| r.id == id) else {
            return Err(CheckpointError::UnknownCheckpoint { task, id });
        };
        if !running.waiting.remove(&task) {
            return Err(CheckpointError::UnexpectedAck { task, id });
        }
        running.acks.insert(task, ack);
        Ok(self.complete())
    }

    /// A task finished: the running checkpoint no longer waits for it (a source is recorded as
    /// [`SourcePosition::Finished`]).
    pub fn on_finished(&mut self, task: TaskId) -> Option<CheckpointAction> {
        let running = self.running.as_mut()?;
        if running.waiting.remove(&task) && running.sources.contains(&task) {
            running.acks.insert(
                task,
                TaskCheckpoint { position: Some(SourcePosition::Finished), ..TaskCheckpoint::default() },
            );
        }
        self.complete()
    }

    fn complete(&mut self) -> Option<CheckpointAction> {
        if !self.running.as_ref()?.waiting.is_empty() {
            return None;
        }
        let r = self.running.take()?;
        self.completed.push(r.id);
        let excess = self.completed.len().saturating_sub(self.retained);
        let discard = self.completed.drain(..excess).collect();
        Some(CheckpointAction::Completed {
            checkpoint: CompletedCheckpoint { id: r.id, epoch: r.epoch, tasks: r.acks },
            discard,
        })
    }

    /// The job restarts: the running checkpoint (if any) is abandoned.
    pub fn abandon(&mut self) -> Option<CheckpointId> {
        self.running.take().map(|r| r.id)
    }
}

#[cfg(test)]
mod tests {
    use koala_types::OperatorId;

    use super::*;

    fn t(op: u32, i: u32) -> TaskId {
        TaskId::new(OperatorId(op), i)
    }

    #[test]
    fn an_ended_channel_counts_as_arrived_and_a_held_channel_is_released() {
        let mut a = BarrierAligner::new([1, 2, 3]);
        assert_eq!(a.on_barrier(1, 7), Ok(None));
        assert_eq!(a.on_barrier(1, 7), Err(BarrierError::Duplicate(7)));
        assert_eq!(a.on_barrier(2, 8), Err(BarrierError::Overlapping { aligning: 7, got: 8 }));
        assert_eq!(a.on_end(&3), None);
        assert!(a.holds(&1) && !a.holds(&2));
        assert_eq!(a.on_barrier(2, 7), Ok(Some(7)));
        assert_eq!(a.aligning(), None);
        assert_eq!(a.on_barrier(3, 8), Err(BarrierError::UnknownChannel(8)));
        // The last live channel ending completes an alignment.
        assert_eq!(a.on_barrier(1, 8), Ok(None));
        assert_eq!(a.on_end(&2), Some(8));
    }

    #[test]
    fn a_checkpoint_completes_when_every_live_task_acked_or_finished_and_old_ones_are_discarded() {
        let mut core = CheckpointCore::new(2, 0);
        let live: BTreeSet<TaskId> = [t(0, 0), t(0, 1), t(1, 0)].into();
        let sources: BTreeSet<TaskId> = [t(0, 0), t(0, 1)].into();
        for id in 1..=3 {
            let inject = core.start(0, live.clone(), sources.clone(), []);
            assert_eq!(inject, Some(CheckpointAction::Inject { id, sources: vec![t(0, 0), t(0, 1)] }));
            assert_eq!(core.start(0, live.clone(), sources.clone(), []), None, "one at a time");
            let ack = |p| TaskCheckpoint {
                position: Some(SourcePosition::Records(p)),
                ..TaskCheckpoint::default()
            };
            assert_eq!(core.on_ack(t(0, 0), id, ack(10 * id)), Ok(None));
            assert_eq!(
                core.on_ack(t(0, 0), id, ack(1)),
                Err(CheckpointError::UnexpectedAck { task: t(0, 0), id })
            );
            assert_eq!(core.on_finished(t(0, 1)), None);
            let Ok(Some(CheckpointAction::Completed { checkpoint, discard })) =
                core.on_ack(t(1, 0), id, TaskCheckpoint::default())
            else {
                panic!("checkpoint {id} did not complete");
            };
            assert_eq!(checkpoint.tasks[&t(0, 0)].position, Some(SourcePosition::Records(10 * id)));
            assert_eq!(checkpoint.tasks[&t(0, 1)].position, Some(SourcePosition::Finished));
            assert_eq!(discard, if id == 3 { vec![1] } else { vec![] });
        }
        assert_eq!(
            core.on_ack(t(1, 0), 3, TaskCheckpoint::default()),
            Err(CheckpointError::UnknownCheckpoint { task: t(1, 0), id: 3 })
        );
        assert_eq!(CheckpointCore::new(3, 9).start(0, live, sources, []).map(|_| ()), Some(()));
    }
}
