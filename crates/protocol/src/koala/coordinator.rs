//! The coordinator's side of Koala (paper §3.1, §3.3, §3.4, Appendix D.4): per operator, requests
//! run one at a time in submission order — Init (deploy new tasks, `Start` every task of the old
//! and new configuration) → collect `PeerReady` → `SwitchRouting` at every upstream → collect
//! `Done` → complete. Operators are independent, so reconfigurations of two operators overlap.
//! A cancelled task stays as a state server until every live task reported it `Drained`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use koala_types::{Epoch, OperatorId, TaskId};

use super::messages::Reconfiguration;
use crate::common::error::ProtocolError;
use crate::control::TaskAck;
use crate::fault::FaultSwitch;
use crate::moves::moves_between;

/// A keyed operator the coordinator reconfigures.
#[derive(Clone, Debug)]
pub struct KeyedOperator {
    /// The operator.
    pub operator: OperatorId,
    /// Its current assignment (bucket → task).
    pub assignment: Vec<TaskId>,
    /// Its upstream tasks.
    pub upstreams: BTreeSet<TaskId>,
}

/// A request to move an operator to a new assignment (from a partition policy, docs/architecture.md §6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewAssignment {
    /// The operator.
    pub operator: OperatorId,
    /// The assignment after the reconfiguration (bucket → task).
    pub assignment: Vec<TaskId>,
    /// Progressive migration knob N for state left on cancelled tasks (0 = fetch on demand only).
    pub extra_keys: usize,
    /// Background drain of other old locations, keys per second per location (0 = off).
    pub drain_keys_per_sec: u64,
    /// The epoch the caller numbers this reconfiguration with (the job's coordinator numbers
    /// every reconfiguration of every protocol); above every epoch this operator started before.
    pub epoch: Epoch,
}

/// Input of the [`KoalaCoordinator`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorEvent {
    /// Queue a reconfiguration.
    Request(NewAssignment),
    /// An ack from a target task.
    Ack {
        /// The task.
        from: TaskId,
        /// The epoch it belongs to.
        epoch: Epoch,
        /// The ack.
        ack: TaskAck,
    },
    /// A target task reported a protocol error.
    Failed {
        /// The task.
        from: TaskId,
        /// The error.
        error: ProtocolError,
    },
}

/// Output of the [`KoalaCoordinator`], executed in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorAction {
    /// Deploy a new task (no buckets, no upstream channels yet) before its `Start`.
    DeployTask {
        /// The task.
        task: TaskId,
    },
    /// Send the reconfiguration to a target task.
    Start {
        /// The task.
        to: TaskId,
        /// The reconfiguration.
        reconfiguration: Arc<Reconfiguration>,
    },
    /// Tell an upstream task to switch its routing table and inject markers.
    SwitchRouting {
        /// The upstream task.
        to: TaskId,
        /// The epoch.
        epoch: Epoch,
        /// The new routing table.
        assignment: Vec<TaskId>,
    },
    /// The epoch completed (state may still move lazily).
    Completed {
        /// The operator.
        operator: OperatorId,
        /// The epoch.
        epoch: Epoch,
    },
    /// A cancelled task holds no state any more: stop it.
    ReleaseTask {
        /// The task.
        task: TaskId,
    },
    /// The running epoch failed; recover the operator from the last checkpoint.
    Aborted {
        /// The operator.
        operator: OperatorId,
        /// The epoch.
        epoch: Epoch,
        /// Why.
        error: ProtocolError,
    },
    /// A request or ack was refused.
    Error(ProtocolError),
}

#[derive(Clone, Debug)]
enum Phase {
    Idle,
    /// `done`: tasks that finished the epoch before every `PeerReady` arrived — possible for a
    /// task none of whose upstreams is left to send a marker (their input ended).
    AwaitReady {
        reconf: Arc<Reconfiguration>,
        target: Vec<TaskId>,
        pending: BTreeSet<TaskId>,
        done: BTreeSet<TaskId>,
    },
    AwaitDone {
        reconf: Arc<Reconfiguration>,
        target: Vec<TaskId>,
        pending: BTreeSet<TaskId>,
    },
}

#[derive(Clone, Debug)]
struct OperatorState {
    assignment: Vec<TaskId>,
    upstreams: BTreeSet<TaskId>,
    ever: BTreeSet<TaskId>,
    retired: BTreeSet<TaskId>,
    drained: BTreeMap<TaskId, BTreeMap<TaskId, Epoch>>,
    /// The last completed epoch (drain reports count only if they are of it).
    last_epoch: Epoch,
    /// The last started epoch (requests must number above it).
    started_epoch: Epoch,
    phase: Phase,
    queue: VecDeque<NewAssignment>,
}

/// Drives Koala reconfigurations of every keyed operator of a job.
#[derive(Clone, Debug, Default)]
pub struct KoalaCoordinator {
    operators: BTreeMap<OperatorId, OperatorState>,
    /// Fault injection (simulator's negative test): release on drain reports of any epoch.
    release_without_epoch: FaultSwitch,
}

impl KoalaCoordinator {
    /// A coordinator with no operators.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers an operator with its deployed assignment.
    pub fn register(&mut self, spec: KeyedOperator) -> Result<(), ProtocolError> {
        if spec.assignment.is_empty() || spec.assignment.iter().any(|t| t.operator != spec.operator) {
            return Err(ProtocolError::InvalidAssignment {
                reason: format!("bad assignment of {}", spec.operator),
            });
        }
        let ever = spec.assignment.iter().copied().collect();
        self.operators.insert(
            spec.operator,
            OperatorState {
                assignment: spec.assignment,
                upstreams: spec.upstreams,
                ever,
                retired: BTreeSet::new(),
                drained: BTreeMap::new(),
                last_epoch: 0,
                started_epoch: 0,
                phase: Phase::Idle,
                queue: VecDeque::new(),
            },
        );
        Ok(())
    }

    /// The current assignment of `operator`.
    pub fn assignment(&self, operator: OperatorId) -> Option<&[TaskId]> {
        self.operators.get(&operator).map(|o| o.assignment.as_slice())
    }

    /// Whether `operator` has no reconfiguration running or queued.
    pub fn is_idle(&self, operator: OperatorId) -> bool {
        self.operators.get(&operator).is_none_or(|o| matches!(o.phase, Phase::Idle) && o.queue.is_empty())
    }

    /// Cancelled tasks of `operator` not yet released.
    pub fn retired(&self, operator: OperatorId) -> BTreeSet<TaskId> {
        self.operators.get(&operator).map(|o| o.retired.clone()).unwrap_or_default()
    }

    /// Live tasks of `location`'s operator that have not reported it drained for the last epoch
    /// (its release waits for them).
    pub fn undrained(&self, location: TaskId) -> Vec<TaskId> {
        let Some(op) = self.operators.get(&location.operator) else { return Vec::new() };
        let reports = op.drained.get(&location);
        let live: BTreeSet<TaskId> = op.assignment.iter().copied().collect();
        live.into_iter().filter(|t| reports.and_then(|m| m.get(t)) != Some(&op.last_epoch)).collect()
    }

    /// The upstream tasks of `operator` changed (an upstream operator was reconfigured); they
    /// switch routing in the next epoch.
    pub fn set_upstreams(&mut self, operator: OperatorId, upstreams: BTreeSet<TaskId>) {
        if let Some(op) = self.operators.get_mut(&operator) {
            op.upstreams = upstreams;
        }
    }

    /// Fault injection for the simulator's negative tests: release a retired task on drain
    /// reports of any epoch (the bookkeeping the job's coordinator had before it ran this core).
    #[cfg(any(test, feature = "sim"))]
    #[doc(hidden)]
    pub fn inject_fault_release_without_epoch(&mut self) {
        self.release_without_epoch.set();
    }

    /// The running epoch of `operator`, if any.
    pub fn running(&self, operator: OperatorId) -> Option<Arc<Reconfiguration>> {
        match self.operators.get(&operator).map(|o| &o.phase) {
            Some(Phase::AwaitReady { reconf, .. } | Phase::AwaitDone { reconf, .. }) => Some(reconf.clone()),
            _ => None,
        }
    }

    /// Tasks whose ack the running epoch of `operator` still waits for, with what it waits for.
    pub fn waiting_for(&self, operator: OperatorId) -> Vec<(TaskId, &'static str)> {
        match self.operators.get(&operator).map(|o| &o.phase) {
            Some(Phase::AwaitReady { pending, .. }) => pending.iter().map(|t| (*t, "PeerReady")).collect(),
            Some(Phase::AwaitDone { pending, .. }) => pending.iter().map(|t| (*t, "Done")).collect(),
            _ => Vec::new(),
        }
    }

    /// Feeds one event; returns the actions to execute, in order.
    pub fn on(&mut self, event: CoordinatorEvent) -> Vec<CoordinatorAction> {
        let mut out = Vec::new();
        match event {
            CoordinatorEvent::Request(request) => {
                let Some(op) = self.operators.get_mut(&request.operator) else {
                    let reason = format!("unknown operator {}", request.operator);
                    return vec![CoordinatorAction::Error(ProtocolError::InvalidAssignment { reason })];
                };
                op.queue.push_back(request.clone());
                self.start_next(request.operator, &mut out);
            }
            CoordinatorEvent::Ack { from, epoch, ack } => self.on_ack(from, epoch, ack, &mut out),
            CoordinatorEvent::Failed { from, error } => {
                if let Some(op) = self.operators.get_mut(&from.operator) {
                    let phase = std::mem::replace(&mut op.phase, Phase::Idle);
                    if let Phase::AwaitReady { reconf, .. } | Phase::AwaitDone { reconf, .. } = phase {
                        out.push(CoordinatorAction::Aborted {
                            operator: from.operator,
                            epoch: reconf.epoch,
                            error,
                        });
                        self.start_next(from.operator, &mut out);
                    }
                }
            }
        }
        out
    }

    /// Applies an ack; an ack the operator's epoch does not expect is refused with what the
    /// epoch was waiting for (a refused ack changes nothing, so the state is read afterwards).
    fn on_ack(&mut self, from: TaskId, epoch: Epoch, ack: TaskAck, out: &mut Vec<CoordinatorAction>) {
        if self.apply_ack(from, epoch, &ack, out) {
            return;
        }
        let state = match self.operators.get(&from.operator).map(|o| &o.phase) {
            None => "unknown operator".to_string(),
            Some(Phase::Idle) => "no epoch running".to_string(),
            Some(Phase::AwaitReady { reconf, pending, .. }) => {
                format!("epoch {} awaits PeerReady from {pending:?}", reconf.epoch)
            }
            Some(Phase::AwaitDone { reconf, pending, .. }) => {
                format!("epoch {} awaits Done from {pending:?}", reconf.epoch)
            }
        };
        let ack = format!("{ack:?}");
        out.push(CoordinatorAction::Error(ProtocolError::UnexpectedAck { from, epoch, ack, state }));
    }

    /// Applies an ack the running epoch expects; false (and no change) if it does not.
    fn apply_ack(
        &mut self,
        from: TaskId,
        epoch: Epoch,
        ack: &TaskAck,
        out: &mut Vec<CoordinatorAction>,
    ) -> bool {
        let operator = from.operator;
        let Some(op) = self.operators.get_mut(&operator) else {
            return false;
        };
        match ack {
            TaskAck::LocationDrained { location } => {
                // Kept even before `location` retires: the report may overtake the epoch's end.
                op.drained.entry(*location).or_default().insert(from, epoch);
                Self::release(op, self.release_without_epoch.on(), out);
            }
            TaskAck::PeerReady => {
                let Phase::AwaitReady { reconf, target, pending, done } = &mut op.phase else {
                    return false;
                };
                if reconf.epoch != epoch || !pending.remove(&from) {
                    return false;
                }
                if pending.is_empty() {
                    for &to in &op.upstreams {
                        out.push(CoordinatorAction::SwitchRouting { to, epoch, assignment: target.clone() });
                    }
                    let (reconf, target, done) = (reconf.clone(), target.clone(), std::mem::take(done));
                    let pending: BTreeSet<TaskId> =
                        participants(&op.assignment, &target).difference(&done).copied().collect();
                    op.phase = Phase::AwaitDone { reconf, target, pending };
                    self.complete_if_done(operator, epoch, out);
                }
            }
            TaskAck::Done => match &mut op.phase {
                // Done before the last PeerReady: the task had sent its own PeerReady already.
                Phase::AwaitReady { reconf, pending, done, target } => {
                    let known = participants(&op.assignment, target).contains(&from);
                    return reconf.epoch == epoch && known && !pending.contains(&from) && done.insert(from);
                }
                Phase::AwaitDone { reconf, pending, .. } => {
                    if reconf.epoch != epoch || !pending.remove(&from) {
                        return false;
                    }
                    self.complete_if_done(operator, epoch, out);
                }
                Phase::Idle => return false,
            },
            _ => return false,
        }
        true
    }

    /// Completes the running epoch of `operator` once every participant is done.
    fn complete_if_done(&mut self, operator: OperatorId, epoch: Epoch, out: &mut Vec<CoordinatorAction>) {
        let Some(op) = self.operators.get_mut(&operator) else { return };
        let Phase::AwaitDone { reconf, target, pending } = &mut op.phase else { return };
        if !pending.is_empty() {
            return;
        }
        op.assignment = std::mem::take(target);
        op.retired.extend(reconf.cancelled.iter().copied());
        op.last_epoch = epoch;
        op.phase = Phase::Idle;
        out.push(CoordinatorAction::Completed { operator, epoch });
        Self::release(op, self.release_without_epoch.on(), out);
        self.start_next(operator, out);
    }

    /// Releases every retired task no live task points at any more (only between epochs).
    fn release(op: &mut OperatorState, any_epoch: bool, out: &mut Vec<CoordinatorAction>) {
        if !matches!(op.phase, Phase::Idle) {
            return;
        }
        let live: BTreeSet<TaskId> = op.assignment.iter().copied().collect();
        let released: Vec<TaskId> = op
            .retired
            .iter()
            .copied()
            .filter(|r| {
                let reports = op.drained.get(r);
                live.iter()
                    .all(|t| reports.and_then(|m| m.get(t)).is_some_and(|e| any_epoch || *e == op.last_epoch))
            })
            .collect();
        for task in released {
            op.retired.remove(&task);
            op.drained.remove(&task);
            out.push(CoordinatorAction::ReleaseTask { task });
        }
    }

    fn start_next(&mut self, operator: OperatorId, out: &mut Vec<CoordinatorAction>) {
        let Some(op) = self.operators.get_mut(&operator) else {
            return;
        };
        while matches!(op.phase, Phase::Idle) {
            let Some(request) = op.queue.pop_front() else {
                return;
            };
            match plan(op, &request) {
                Ok(reconf) => {
                    op.started_epoch = reconf.epoch;
                    let reconf = Arc::new(reconf);
                    for &task in &reconf.new_tasks {
                        op.ever.insert(task);
                        out.push(CoordinatorAction::DeployTask { task });
                    }
                    let pending = participants(&op.assignment, &request.assignment);
                    for &to in &pending {
                        out.push(CoordinatorAction::Start { to, reconfiguration: reconf.clone() });
                    }
                    op.phase = Phase::AwaitReady {
                        reconf,
                        target: request.assignment,
                        pending,
                        done: BTreeSet::new(),
                    };
                }
                Err(e) => out.push(CoordinatorAction::Error(e)),
            }
        }
    }
}

/// Tasks that own buckets before or after: every one gets `Start` and a marker from each upstream.
fn participants(old: &[TaskId], new: &[TaskId]) -> BTreeSet<TaskId> {
    old.iter().chain(new).copied().collect()
}

fn plan(op: &OperatorState, request: &NewAssignment) -> Result<Reconfiguration, ProtocolError> {
    let epoch = request.epoch;
    let moves = moves_between(&op.assignment, &request.assignment)
        .map_err(|e| ProtocolError::InvalidAssignment { reason: e.to_string() })?;
    let bad = |reason: String| ProtocolError::InvalidAssignment { reason };
    if epoch <= op.started_epoch {
        return Err(bad(format!("epoch {epoch} is not above {}, the last one started", op.started_epoch)));
    }
    if moves.is_empty() {
        return Err(bad("the request changes nothing".into()));
    }
    if let Some(t) =
        request.assignment.iter().find(|t| t.operator != request.operator || op.retired.contains(t))
    {
        return Err(bad(format!("{t} cannot own buckets of {}", request.operator)));
    }
    let old: BTreeSet<TaskId> = op.assignment.iter().copied().collect();
    let new: BTreeSet<TaskId> = request.assignment.iter().copied().collect();
    if let Some(t) = new.iter().find(|t| !old.contains(t) && op.ever.contains(t)) {
        return Err(bad(format!("{t} was cancelled before; task indices are not reused")));
    }
    let cancelled: BTreeSet<TaskId> = old.difference(&new).copied().collect();
    Ok(Reconfiguration {
        operator: request.operator,
        epoch,
        moves,
        upstreams: op.upstreams.clone(),
        new_tasks: new.difference(&op.ever).copied().collect(),
        retired: op.retired.union(&cancelled).copied().collect(),
        cancelled,
        extra_keys: request.extra_keys,
        drain_keys_per_sec: request.drain_keys_per_sec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(op: u32, i: u32) -> TaskId {
        TaskId::new(OperatorId(op), i)
    }

    fn starts(out: &[CoordinatorAction]) -> Vec<(TaskId, Epoch)> {
        out.iter()
            .filter_map(|a| match a {
                CoordinatorAction::Start { to, reconfiguration } => Some((*to, reconfiguration.epoch)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn two_operators_overlap_and_requests_queue_in_order() {
        let mut c = KoalaCoordinator::new();
        let up = BTreeSet::from([t(0, 0)]);
        for op in [1, 2] {
            let spec = KeyedOperator {
                operator: OperatorId(op),
                assignment: vec![t(op, 0); 4],
                upstreams: up.clone(),
            };
            c.register(spec).expect("register");
        }
        let req = |op, a: Vec<TaskId>, epoch| {
            CoordinatorEvent::Request(NewAssignment {
                operator: OperatorId(op),
                assignment: a,
                extra_keys: 0,
                drain_keys_per_sec: 0,
                epoch,
            })
        };
        let out1 = c.on(req(1, vec![t(1, 0), t(1, 0), t(1, 1), t(1, 1)], 1));
        assert!(out1.contains(&CoordinatorAction::DeployTask { task: t(1, 1) }));
        assert_eq!(starts(&out1), vec![(t(1, 0), 1), (t(1, 1), 1)]);
        // A second request for operator 1 waits; operator 2 starts right away (overlap).
        assert!(starts(&c.on(req(1, vec![t(1, 0), t(1, 2), t(1, 1), t(1, 1)], 3))).is_empty());
        assert_eq!(starts(&c.on(req(2, vec![t(2, 1); 4], 2))), vec![(t(2, 0), 2), (t(2, 1), 2)]);
        let ack = |from, (epoch, ack)| CoordinatorEvent::Ack { from, epoch, ack };
        assert!(c.on(ack(t(1, 0), (1, TaskAck::PeerReady))).is_empty());
        let out = c.on(ack(t(1, 1), (1, TaskAck::PeerReady)));
        assert!(matches!(&out[..], [CoordinatorAction::SwitchRouting { epoch: 1, .. }]));
        assert!(matches!(&c.on(ack(t(1, 1), (2, TaskAck::Done)))[..], [CoordinatorAction::Error(_)]));
        c.on(ack(t(1, 0), (1, TaskAck::Done)));
        let out = c.on(ack(t(1, 1), (1, TaskAck::Done)));
        assert_eq!(out[0], CoordinatorAction::Completed { operator: OperatorId(1), epoch: 1 });
        assert_eq!(starts(&out), vec![(t(1, 0), 3), (t(1, 1), 3), (t(1, 2), 3)]);
        // Operator 2 cancelled t(2,0): released once the live task drained it after epoch 2.
        c.on(ack(t(2, 0), (2, TaskAck::PeerReady)));
        c.on(ack(t(2, 1), (2, TaskAck::PeerReady)));
        c.on(ack(t(2, 0), (2, TaskAck::Done)));
        c.on(ack(t(2, 1), (2, TaskAck::Done)));
        assert_eq!(c.retired(OperatorId(2)), BTreeSet::from([t(2, 0)]));
        let out = c.on(ack(t(2, 1), (2, TaskAck::LocationDrained { location: t(2, 0) })));
        assert_eq!(out, vec![CoordinatorAction::ReleaseTask { task: t(2, 0) }]);
    }

    /// A task whose upstreams all ended has no marker to wait for: its `Done` may overtake
    /// another task's `PeerReady`. It counts, and the epoch completes once every task is done.
    /// A coordinator with operator 1 on one task (4 buckets, no upstreams).
    fn one_task_operator() -> KoalaCoordinator {
        let mut c = KoalaCoordinator::new();
        let spec = KeyedOperator {
            operator: OperatorId(1),
            assignment: vec![t(1, 0); 4],
            upstreams: BTreeSet::new(),
        };
        c.register(spec).expect("register");
        c
    }

    #[test]
    fn done_before_the_last_peer_ready_counts() {
        let mut c = one_task_operator();
        let request = NewAssignment {
            operator: OperatorId(1),
            assignment: vec![t(1, 0), t(1, 0), t(1, 1), t(1, 1)],
            extra_keys: 0,
            drain_keys_per_sec: 0,
            epoch: 1,
        };
        c.on(CoordinatorEvent::Request(request));
        let ack = |from, ack| CoordinatorEvent::Ack { from, epoch: 1, ack };
        assert!(c.on(ack(t(1, 0), TaskAck::PeerReady)).is_empty());
        assert!(c.on(ack(t(1, 0), TaskAck::Done)).is_empty(), "an early Done is kept, not refused");
        assert!(
            matches!(&c.on(ack(t(1, 1), TaskAck::Done))[..], [CoordinatorAction::Error(_)]),
            "Done before PeerReady"
        );
        c.on(ack(t(1, 1), TaskAck::PeerReady));
        let out = c.on(ack(t(1, 1), TaskAck::Done));
        assert_eq!(out, vec![CoordinatorAction::Completed { operator: OperatorId(1), epoch: 1 }]);
    }

    #[test]
    fn bad_requests_are_refused_not_panicked() {
        let mut c = one_task_operator();
        for a in [vec![t(1, 0); 3], vec![t(1, 0); 4], vec![t(2, 0); 4]] {
            let out = c.on(CoordinatorEvent::Request(NewAssignment {
                operator: OperatorId(1),
                assignment: a,
                extra_keys: 0,
                drain_keys_per_sec: 0,
                epoch: 1,
            }));
            assert!(matches!(&out[..], [CoordinatorAction::Error(_)]), "{out:?}");
        }
        assert!(c.is_idle(OperatorId(1)));
    }
}
