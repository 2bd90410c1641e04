//! What keeps a job from ending, as far as the engine knows: for every task that has not
//! finished, what it still waits for. The job's coordinator names these when its input ended but
//! its tasks do not finish (`[runtime] end_timeout_s`), so a hang says where it is.

use std::collections::BTreeSet;

use koala_types::{Epoch, TaskId};

use super::Engine;
use crate::control::{Deployment, Protocol};

/// What an unfinished task waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// The running reconfiguration waits for its ack (`what`: `Prepared`, `Done`, …).
    Reconfiguration {
        /// The running epoch.
        epoch: Epoch,
        /// The ack awaited.
        what: String,
    },
    /// End of stream from these upstream tasks, whose outputs have not ended.
    Inputs {
        /// The upstream tasks.
        from: Vec<TaskId>,
    },
    /// Every upstream's outputs ended, yet the task has not reported its inputs ended: it still
    /// holds records, awaits fetched state or a membership filter, or takes part in a
    /// reconfiguration (the task knows which; the engine does not).
    ReportInputsEnded,
    /// Koala: a retired task (it serves state) whose inputs ended, released once every live task
    /// of its operator reported it drained for the last epoch; these have not.
    Drained {
        /// The live tasks whose report is missing.
        by: Vec<TaskId>,
    },
    /// It reported its inputs ended; its release waits for these tasks of its operator to report
    /// theirs (and for the running reconfiguration, if any, to complete).
    Release {
        /// Tasks of the operator that have not reported their inputs ended.
        not_ended: Vec<TaskId>,
        /// The running reconfiguration, if any.
        reconfiguring: Option<Epoch>,
    },
    /// Released: it exits once nothing it sends waits for room.
    Exit,
}

impl Waiting {
    /// The wait in words, with tasks named by `name`.
    pub fn describe(&self, name: impl Fn(TaskId) -> String) -> String {
        let list = |tasks: &[TaskId]| tasks.iter().map(|t| name(*t)).collect::<Vec<_>>().join(", ");
        match self {
            Self::Reconfiguration { epoch, what } => format!("reconfiguration {epoch} waits for its {what}"),
            Self::Inputs { from } => format!("waits for end of stream from {}", list(from)),
            Self::ReportInputsEnded => "its upstreams all ended, but it has not reported its inputs ended \
                 (it still holds records, awaits fetched state or a filter, or is in a reconfiguration)"
                .into(),
            Self::Drained { by } => {
                format!("retired; released once every live task reported it drained, not yet {}", list(by))
            }
            Self::Release { not_ended, reconfiguring } => {
                let mut s = "reported its inputs ended; waits for its release".to_string();
                if !not_ended.is_empty() {
                    s += &format!(", which waits for {} to report theirs", list(not_ended));
                }
                if let Some(epoch) = reconfiguring {
                    s += &format!(" and for reconfiguration {epoch} to complete");
                }
                s
            }
            Self::Exit => "released; has not exited".into(),
        }
    }
}

impl Engine {
    /// Every task placed (the running reconfiguration's new ones included) that has not finished,
    /// with what it waits for, in task order.
    pub fn unfinished(&self) -> Vec<(TaskId, Waiting)> {
        let mut tasks = placed(&self.deployment);
        tasks.extend(self.running().map(|p| placed(&p.deployment)).unwrap_or_default());
        tasks.retain(|t| !self.deployment.finished.contains(t));
        let reconfiguration: Vec<(TaskId, String)> = self.waiting_for();
        tasks.into_iter().map(|t| (t, self.waiting(t, &reconfiguration))).collect()
    }

    fn waiting(&self, task: TaskId, reconfiguration: &[(TaskId, String)]) -> Waiting {
        let op = task.operator;
        let running = self.running().map(|p| p.epoch);
        if let (Some(epoch), Some((_, what))) = (running, reconfiguration.iter().find(|(t, _)| *t == task)) {
            return Waiting::Reconfiguration { epoch, what: what.clone() };
        }
        if self.released.contains(&task) {
            return Waiting::Exit;
        }
        let ended = self.inputs_ended.get(&op);
        if ended.is_some_and(|e| e.contains(&task.index)) {
            if self.koala.retired(op).contains(&task) {
                return Waiting::Drained { by: self.koala.undrained(task) };
            }
            let live = self.deployment.tasks.get(&op).into_iter().flatten().copied();
            let mut all: BTreeSet<u32> = live.collect();
            if self.deployment.protocol == Protocol::Koala && self.deployment.routing.contains_key(&op) {
                all.extend(self.koala.retired(op).into_iter().map(|t| t.index));
            }
            let not_ended = all
                .into_iter()
                .filter(|i| !ended.is_some_and(|e| e.contains(i)))
                .map(|i| TaskId::new(op, i))
                .filter(|t| !self.deployment.finished.contains(t))
                .collect();
            return Waiting::Release { not_ended, reconfiguring: running };
        }
        let ups = self.inputs.get(&op).cloned().unwrap_or_default();
        let from: Vec<TaskId> = placed(&self.deployment)
            .into_iter()
            .filter(|t| ups.contains(&t.operator))
            .filter(|t| !self.deployment.finished.contains(t) && !self.outputs_ended.contains(t))
            .collect();
        if !from.is_empty() {
            return Waiting::Inputs { from };
        }
        Waiting::ReportInputsEnded
    }

    /// A mark that changes whenever the job gets closer to its end: a task finished, reported its
    /// inputs ended or was released, or a reconfiguration completed. A watchdog that sees it
    /// unchanged for long knows nothing moved.
    pub fn end_progress(&self) -> (usize, usize, usize, Epoch) {
        let ended = self.inputs_ended.values().map(BTreeSet::len).sum::<usize>() + self.outputs_ended.len();
        (self.deployment.finished.len(), ended, self.released.len(), self.deployment.epoch)
    }
}

/// Every task `d` places or runs: the live ones and the ones placed before (cancelled tasks that
/// may still serve state or hold an open channel).
fn placed(d: &Deployment) -> BTreeSet<TaskId> {
    let live = d.tasks.iter().flat_map(|(op, tasks)| tasks.iter().map(|i| TaskId::new(*op, *i)));
    live.chain(d.placement.keys().copied()).collect()
}
