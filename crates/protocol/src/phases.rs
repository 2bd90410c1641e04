//! The coordinator's phase driver (docs/protocols.md §2, §7), sans-IO like every protocol core:
//! acks in, the next broadcast out. Every protocol starts with **Prepare** (new tasks start, every
//! task that may still be asked for state learns the new placement, consumers open channels to
//! new tasks). **Stop-and-restart** then runs **Drain** (upstreams send a marker and pause;
//! target tasks that saw every marker send the moved buckets and their timers and delete them)
//! → **Resume** (upstreams switch routing and resume). **Koala** switches a stateless operator's
//! upstreams with markers, and hands a keyed operator's epoch to its coordinator core
//! ([`crate::koala::KoalaCoordinator`]) once every task is prepared ([`Phase::Delegated`]).
//!
//! ```
//! use std::collections::BTreeMap;
//! use koala_protocol::phases::{Participants, Phase, Reconfiguring};
//! use koala_protocol::{CoordinatorMessage, Deployment, Protocol, ReconfigPlan, RuntimeOptions, TaskAck};
//! use koala_types::{OperatorId, TaskId};
//!
//! let (op, up) = (OperatorId(1), TaskId::new(OperatorId(0), 0));
//! let options = RuntimeOptions {
//!     batch_records: 1,
//!     linger_ms: 0,
//!     channel_capacity: 1,
//!     sink_dir: ".".into(),
//!     capacity: Default::default(),
//!     max_queued_records: 1024,
//!     checkpoint: Default::default(),
//! };
//! let deployment = Deployment {
//!     run: "r".into(), query: "q".into(), query_params: String::new(), workers: BTreeMap::new(),
//!     placement: BTreeMap::new(), tasks: BTreeMap::from([(op, vec![0, 1])]), epoch: 1,
//!     routing: BTreeMap::new(), num_buckets: 4, options, protocol: Protocol::StopAndRestart,
//!     extra_keys: 0, drain_keys_per_sec: 0, finished: Default::default(),
//! };
//! let (t0, t1) = (TaskId::new(op, 0), TaskId::new(op, 1));
//! let plan = ReconfigPlan {
//!     epoch: 1, operator: op, deployment, moves: BTreeMap::from([((t0, t1), vec![3])]),
//!     upstreams: vec![up], created: vec![1], cancelled: vec![], retired: vec![],
//! };
//! let who = Participants { stateful: true, old_targets: vec![t0], consumers: vec![] };
//! let (mut d, first) = Reconfiguring::start(plan, who);
//! assert!(matches!(first, CoordinatorMessage::Prepare(_)));
//! assert_eq!(d.on_ack(t0, &TaskAck::Prepared), Ok(None));
//! assert!(matches!(d.on_ack(t1, &TaskAck::Prepared), Ok(Some(CoordinatorMessage::Drain { epoch: 1 }))));
//! assert!(d.on_ack(t1, &TaskAck::Resumed).is_err(), "an ack nobody waits for is an error");
//! d.on_ack(up, &TaskAck::Paused).unwrap();
//! d.on_ack(t0, &TaskAck::StateSent { bytes: 10, entries: 1 }).unwrap();
//! let resume = d.on_ack(t1, &TaskAck::StateReceived).unwrap();
//! assert!(matches!(resume, Some(CoordinatorMessage::Resume { epoch: 1 })));
//! d.on_ack(up, &TaskAck::Resumed).unwrap();
//! assert_eq!((d.phase(), d.bytes_moved), (Phase::Complete, 10));
//! ```

use std::collections::HashSet;

use koala_types::TaskId;

use crate::control::{CoordinatorMessage, Protocol, ReconfigPlan, TaskAck};

/// Who takes part in a reconfiguration besides what the plan says (the coordinator derives it
/// from the job graph).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Participants {
    /// Whether the operator holds keyed state (a stateless one only switches routing).
    pub stateful: bool,
    /// The operator's live tasks before the reconfiguration.
    pub old_targets: Vec<TaskId>,
    /// The live, unfinished tasks that consume the operator's output (they open channels to the
    /// new tasks).
    pub consumers: Vec<TaskId>,
}

/// An ack the running reconfiguration does not wait for: a protocol bug, never ignored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unexpected ack {ack:?} from {task} in phase {phase:?}")]
pub struct PhaseError {
    /// Who sent it.
    pub task: TaskId,
    /// The ack.
    pub ack: TaskAck,
    /// The phase it arrived in.
    pub phase: Phase,
}

/// The acks a phase waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Expect {
    Prepared,
    Paused,
    StateSent,
    StateReceived,
    Resumed,
    Switched,
}

impl Expect {
    fn of(ack: &TaskAck) -> Option<Self> {
        Some(match ack {
            TaskAck::Prepared => Self::Prepared,
            TaskAck::Paused => Self::Paused,
            TaskAck::StateSent { .. } => Self::StateSent,
            TaskAck::StateReceived => Self::StateReceived,
            TaskAck::Resumed => Self::Resumed,
            TaskAck::Switched => Self::Switched,
            TaskAck::PeerReady
            | TaskAck::Done
            | TaskAck::LocationDrained { .. }
            | TaskAck::InputsEnded
            | TaskAck::ProtocolError { .. } => return None,
        })
    }
}

/// Where a running reconfiguration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for `Prepared`.
    Preparing,
    /// Stop-and-restart: waiting for `Paused`, `StateSent`, `StateReceived`.
    Draining,
    /// Stop-and-restart: waiting for `Resumed`.
    Resuming,
    /// Koala, stateless operator: waiting for `Switched` from upstreams and `StateSent` from the
    /// old tasks (they passed every marker).
    Switching,
    /// Koala or DRRS, keyed operator: every task is prepared; the protocol's coordinator core
    /// (`koala_protocol::koala::KoalaCoordinator` or `koala_protocol::drrs::DrrsCoordinator`,
    /// the ones the simulator checks) drives the epoch from here to its completion.
    Delegated,
    /// Finished.
    Complete,
}

/// Drives one reconfiguration from acks (no I/O: it returns what to send). Every protocol
/// starts with Prepare (new tasks start, every task that may be asked for state learns the new
/// placement, consumers open channels to new tasks). Stop-and-restart then runs Drain → Resume;
/// Koala hands a keyed operator's epoch to its coordinator core ([`Phase::Delegated`]) and
/// switches a stateless operator's upstreams with markers.
pub struct Reconfiguring {
    protocol: Protocol,
    /// Whether the operator holds keyed state (a stateless one only switches routing).
    stateful: bool,
    /// The plan.
    pub plan: ReconfigPlan,
    phase: Phase,
    waiting: HashSet<(TaskId, Expect)>,
    /// State bytes the target tasks reported sending.
    pub bytes_moved: u64,
    upstream: Vec<TaskId>,
    old_targets: Vec<TaskId>,
    receivers: Vec<TaskId>,
}

impl Reconfiguring {
    /// Starts: returns the driver and the message to broadcast (`Prepare`).
    pub fn start(plan: ReconfigPlan, who: Participants) -> (Self, CoordinatorMessage) {
        let protocol = plan.deployment.protocol;
        let op = plan.operator;
        let stateful = who.stateful;
        let d = &plan.deployment;
        let upstream = plan.upstreams.clone();
        let old_targets = who.old_targets;
        let mut receivers: Vec<TaskId> = plan.moves.keys().map(|(_, to)| *to).collect();
        receivers.sort_unstable();
        receivers.dedup();
        let mut waiting = HashSet::new();
        let targets =
            d.tasks.get(&op).into_iter().flatten().chain(&plan.cancelled).chain(&plan.retired).copied();
        let consumers = who.consumers.into_iter();
        for task in targets.map(|i| TaskId::new(op, i)).chain(consumers) {
            if !d.finished.contains(&task) {
                waiting.insert((task, Expect::Prepared));
            }
        }
        let msg = CoordinatorMessage::Prepare(Box::new(plan.clone()));
        let me = Self {
            protocol,
            stateful,
            plan,
            phase: Phase::Preparing,
            waiting,
            bytes_moved: 0,
            upstream,
            old_targets,
            receivers,
        };
        (me, msg)
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Applies an ack; returns the message to broadcast when a phase completes. An ack this
    /// reconfiguration does not wait for is an error (a protocol bug, never ignored).
    pub fn on_ack(&mut self, task: TaskId, ack: &TaskAck) -> Result<Option<CoordinatorMessage>, PhaseError> {
        if let TaskAck::StateSent { bytes, .. } = ack {
            self.bytes_moved += bytes;
        }
        let expected = Expect::of(ack).is_some_and(|e| self.waiting.remove(&(task, e)));
        if !expected {
            return Err(PhaseError { task, ack: ack.clone(), phase: self.phase });
        }
        if !self.waiting.is_empty() {
            return Ok(None);
        }
        self.advance()
    }

    /// Every ack of the phase arrived: moves to the next phase; returns what to broadcast.
    fn advance(&mut self) -> Result<Option<CoordinatorMessage>, PhaseError> {
        let epoch = self.plan.epoch;
        let next = match self.phase {
            Phase::Preparing if self.protocol.keeps_processing() && !self.stateful => {
                // A stateless operator under Koala: nothing to hand over; upstreams switch with
                // markers, and the old tasks are done once they passed every marker.
                self.phase = Phase::Switching;
                self.waiting.extend(self.upstream.iter().map(|t| (*t, Expect::Switched)));
                self.waiting.extend(self.old_targets.iter().map(|t| (*t, Expect::StateSent)));
                Some(CoordinatorMessage::Switch { epoch })
            }
            Phase::Preparing if self.protocol.keeps_processing() => {
                self.phase = Phase::Delegated;
                None
            }
            Phase::Preparing => {
                self.phase = Phase::Draining;
                self.waiting.extend(self.upstream.iter().map(|t| (*t, Expect::Paused)));
                self.waiting.extend(self.old_targets.iter().map(|t| (*t, Expect::StateSent)));
                self.waiting.extend(self.receivers.iter().map(|t| (*t, Expect::StateReceived)));
                Some(CoordinatorMessage::Drain { epoch })
            }
            Phase::Draining => {
                self.phase = Phase::Resuming;
                self.waiting.extend(self.upstream.iter().map(|t| (*t, Expect::Resumed)));
                Some(CoordinatorMessage::Resume { epoch })
            }
            Phase::Resuming | Phase::Switching | Phase::Delegated | Phase::Complete => {
                self.phase = Phase::Complete;
                None
            }
        };
        if self.waiting.is_empty()
            && matches!(self.phase, Phase::Draining | Phase::Resuming | Phase::Switching)
        {
            // Every upstream finished: nobody is left to pause or switch (and, draining, no
            // task of the operator moves state).
            self.phase = Phase::Complete;
        }
        Ok(next)
    }

    /// Whether this driver waits for `ack` from `task` (acks it does not wait for belong to the
    /// Koala core or are not an error in this phase).
    pub fn waits_for(&self, task: TaskId, ack: &TaskAck) -> bool {
        Expect::of(ack).is_some_and(|e| self.waiting.contains(&(task, e)))
    }

    /// Whether any ack of `task` is still awaited.
    pub fn awaits_any(&self, task: TaskId) -> bool {
        self.waiting.iter().any(|(t, _)| *t == task)
    }

    /// A task finished (an upstream before it switched, a consumer before it prepared): it will
    /// not ack this reconfiguration.
    pub fn forget(&mut self, task: TaskId) -> Result<Option<CoordinatorMessage>, PhaseError> {
        self.upstream.retain(|t| *t != task);
        let before = self.waiting.len();
        self.waiting.retain(|(t, _)| *t != task);
        if self.waiting.is_empty() && before > 0 {
            // The upstream's ack was the last one this phase waited for.
            return self.advance();
        }
        Ok(None)
    }

    /// Tasks whose acks are still awaited (for timeouts and error messages).
    pub fn waiting_for(&self) -> Vec<(TaskId, String)> {
        let mut v: Vec<(TaskId, String)> = self.waiting.iter().map(|(t, e)| (*t, format!("{e:?}"))).collect();
        v.sort();
        v
    }

    /// Upstream tasks of the reconfigured operator (they must still be running to start).
    pub fn upstream(&self) -> &[TaskId] {
        &self.upstream
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use koala_types::OperatorId;

    use super::*;
    use crate::control::Deployment;

    fn plan(upstreams: Vec<TaskId>) -> ReconfigPlan {
        let op = OperatorId(1);
        let mut deployment = Deployment::for_tests(
            BTreeMap::from([(op, vec![0, 1])]),
            BTreeMap::new(),
            4,
            Protocol::StopAndRestart,
        );
        deployment.epoch = 1;
        ReconfigPlan {
            epoch: 1,
            operator: op,
            deployment,
            moves: BTreeMap::from([((TaskId::new(op, 0), TaskId::new(op, 1)), vec![3])]),
            upstreams,
            created: vec![1],
            cancelled: vec![],
            retired: vec![],
        }
    }

    /// An upstream that finishes before it paused is no longer waited for; when it was the only
    /// one, the reconfiguration completes without a Resume ack.
    #[test]
    fn a_finished_upstream_is_not_waited_for() {
        let op = OperatorId(1);
        let (t0, t1) = (TaskId::new(op, 0), TaskId::new(op, 1));
        let (u0, u1) = (TaskId::new(OperatorId(0), 0), TaskId::new(OperatorId(0), 1));
        let who = Participants { stateful: true, old_targets: vec![t0], consumers: vec![] };
        let (mut d, _) = Reconfiguring::start(plan(vec![u0, u1]), who.clone());
        d.on_ack(t0, &TaskAck::Prepared).expect("an awaited ack");
        assert!(matches!(d.on_ack(t1, &TaskAck::Prepared), Ok(Some(CoordinatorMessage::Drain { .. }))));
        d.on_ack(u0, &TaskAck::Paused).expect("an awaited ack");
        assert_eq!(d.forget(u1), Ok(None));
        d.on_ack(t0, &TaskAck::StateSent { bytes: 0, entries: 0 }).expect("an awaited ack");
        assert!(matches!(d.on_ack(t1, &TaskAck::StateReceived), Ok(Some(CoordinatorMessage::Resume { .. }))));
        assert!(d.on_ack(u1, &TaskAck::Resumed).is_err(), "a forgotten upstream is not waited for");
        d.on_ack(u0, &TaskAck::Resumed).expect("an awaited ack");
        assert_eq!(d.phase(), Phase::Complete);

        // The only upstream finished before it paused: nobody is left to resume.
        let (mut d, _) = Reconfiguring::start(plan(vec![u0]), who);
        d.on_ack(t0, &TaskAck::Prepared).expect("an awaited ack");
        d.on_ack(t1, &TaskAck::Prepared).expect("an awaited ack");
        assert_eq!(d.forget(u0), Ok(None));
        d.on_ack(t0, &TaskAck::StateSent { bytes: 0, entries: 0 }).expect("an awaited ack");
        assert!(matches!(d.on_ack(t1, &TaskAck::StateReceived), Ok(Some(CoordinatorMessage::Resume { .. }))));
        assert_eq!(d.phase(), Phase::Complete);
    }
}
