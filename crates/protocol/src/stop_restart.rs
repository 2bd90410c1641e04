//! Stop-and-restart, the task side (docs/protocols.md §7; the optimised baseline of paper §5.1.2),
//! as two sans-IO cores: [`TargetCore`] for each task of the reconfigured operator and
//! [`UpstreamCore`] for each task feeding it. The coordinator side is the phase driver
//! ([`crate::phases::Reconfiguring`]). Each core consumes events and returns actions; the runtime
//! (or a simulator) moves the bytes: it scans, sends and deletes the moved state, installs what
//! arrives, broadcasts markers and switches routing.
//!
//! A target task learns its part at `Prepare`: a task the plan created awaits no marker (it only
//! receives); any other task awaits a marker — or the end of stream — on every live input
//! channel. Once all arrived — and the coordinator's `Drain` did, which comes once every task of
//! the reconfiguration is prepared, so no state reaches a receiver that has not seen `Prepare` —
//! nothing routed by the old table is still on its way, so it sends the buckets it gives away ([`TargetAction::SendState`]; the executor then acks `StateSent`
//! with what it sent, even when nothing moves — the phase driver waits for `StateSent` from every
//! old task). A receiver acks `StateReceived` once every sender's `StateEnd` arrived. Anything the
//! protocol does not allow — state from a task that is not a sender or outside a
//! reconfiguration, a second marker of the running epoch, a `Resume` without `Drain` — comes back
//! as [`TargetAction::Error`] / [`UpstreamAction::Error`] and leaves the core unchanged: the task
//! must fail rather than lose state. Markers of other epochs pass through (they belong to other
//! operators' reconfigurations, or are the switch markers of an epoch this task is done with).
//!
//! **Remote mode** ([`TargetCore::new_remote`], the `remote` protocol, docs/protocols.md §7.1):
//! the same phases over state servers shared by every task of the operator, where ownership
//! moves and state does not. Where a sender would send state it gets [`TargetAction::Flush`]:
//! write back everything it buffered for the moved buckets (its cache's dirty entries) to the
//! servers, forget its copies, send the buckets' timers, then `StateEnd`, which in this mode means
//! "flushed". A `State` chunk is an error (state never moves); timers still do
//! ([`TargetEvent::TimersChunk`]). In both modes a receiver may not read an incoming bucket
//! until its sender's `StateEnd` arrived ([`TargetCore::may_read`]); the phase driver resumes
//! the upstreams only after every receiver acked `StateReceived`, i.e. after every flush.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::Arc;
//! use koala_protocol::stop_restart::{
//!     TargetAction, TargetCore, TargetEvent, UpstreamAction, UpstreamCore, UpstreamEvent,
//! };
//! use koala_protocol::{Deployment, Protocol, ReconfigPlan, RuntimeOptions, TaskAck};
//! use koala_types::{OperatorId, TaskId};
//!
//! // Operator 1 scales out from one task to two: task 0 gives bucket 3 to the new task 1.
//! let (op, up) = (OperatorId(1), TaskId::new(OperatorId(0), 0));
//! let (t0, t1) = (TaskId::new(op, 0), TaskId::new(op, 1));
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
//! let plan = Arc::new(ReconfigPlan {
//!     epoch: 1, operator: op, deployment, moves: BTreeMap::from([((t0, t1), vec![3])]),
//!     upstreams: vec![up], created: vec![1], cancelled: vec![], retired: vec![],
//! });
//! let prepared = TargetAction::Ack { epoch: 1, ack: TaskAck::Prepared };
//!
//! // The old task awaits the upstream's marker (channels are the executor's own ids: here "u0").
//! let mut sender = TargetCore::new(t0);
//! let actions = sender.on(TargetEvent::Prepare { plan: plan.clone(), inputs: vec!["u0"] });
//! assert_eq!(actions, vec![prepared.clone()]);
//! // The new task awaits no marker, only the state.
//! let mut receiver = TargetCore::<&str>::new(t1);
//! assert_eq!(receiver.on(TargetEvent::Prepare { plan, inputs: vec![] }), vec![prepared]);
//!
//! // Drain: the target tasks hear it (every task is prepared), and the upstream sends its marker
//! // on every output and pauses.
//! assert_eq!(sender.on(TargetEvent::Drain { epoch: 1 }), vec![]);
//! assert_eq!(receiver.on(TargetEvent::Drain { epoch: 1 }), vec![]);
//! let mut upstream = UpstreamCore::new();
//! let actions = upstream.on(UpstreamEvent::Drain { epoch: 1 });
//! assert_eq!(actions[0], UpstreamAction::MarkAndPause { epoch: 1 });
//! assert_eq!(upstream.paused(), Some(1));
//!
//! // The marker arrives: the old task sends bucket 3 (and then acks StateSent itself).
//! let actions = sender.on(TargetEvent::Marker { channel: "u0", epoch: 1 });
//! assert_eq!(actions, vec![TargetAction::SendState { epoch: 1, moves: vec![(t1, vec![3])] }]);
//! assert!(!sender.busy());
//!
//! // The new task installs the chunks and acks once the sender's StateEnd arrived.
//! assert_eq!(receiver.on(TargetEvent::StateChunk { from: t0, epoch: 1 }), vec![]);
//! let actions = receiver.on(TargetEvent::StateEnd { from: t0, epoch: 1 });
//! assert_eq!(actions, vec![TargetAction::Ack { epoch: 1, ack: TaskAck::StateReceived }]);
//! assert!(!receiver.busy());
//! // State from a task that is not sending (any more) is an error, never written.
//! let late = receiver.on(TargetEvent::StateChunk { from: t0, epoch: 1 });
//! assert!(matches!(late[..], [TargetAction::Error(_)]));
//!
//! // Resume: the upstream switches routing and resumes.
//! let actions = upstream.on(UpstreamEvent::Resume { epoch: 1 });
//! assert_eq!(actions[0], UpstreamAction::SwitchAndResume { epoch: 1 });
//! assert_eq!(upstream.paused(), None);
//! ```

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;

use koala_types::{BucketId, Epoch, OperatorId, TaskId};

use crate::control::{ReconfigPlan, TaskAck};

/// Something the stop-and-restart protocol does not allow. The core that returns it is
/// unchanged; the task must fail (state would otherwise be lost or a phase skipped).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StopRestartError {
    /// A `Prepare` arrived while this task's part of another reconfiguration is still running.
    #[error("Prepare of epoch {got} while epoch {running} is running")]
    PrepareWhileRunning {
        /// The running epoch.
        running: Epoch,
        /// The epoch of the new `Prepare`.
        got: Epoch,
    },
    /// A `Prepare` for an epoch not newer than the last one this task took part in.
    #[error("Prepare of epoch {got}, not newer than epoch {last}")]
    StaleEpoch {
        /// The epoch of the `Prepare`.
        got: Epoch,
        /// The last epoch this task prepared.
        last: Epoch,
    },
    /// A `Prepare` of another operator's reconfiguration.
    #[error("Prepare of epoch {epoch} reconfigures {operator}, not this task's operator")]
    OtherOperator {
        /// The epoch.
        epoch: Epoch,
        /// The operator the plan reconfigures.
        operator: OperatorId,
    },
    /// A marker of the running epoch on a channel whose marker is not awaited (a second one, or
    /// one at a task the plan created).
    #[error("marker of running epoch {epoch} on channel {channel}, which owes none")]
    UnexpectedMarker {
        /// The epoch.
        epoch: Epoch,
        /// The channel (as the executor names it).
        channel: String,
    },
    /// State or `StateEnd` arrived while this task takes part in no reconfiguration.
    #[error("state of epoch {epoch} from {from} outside a reconfiguration")]
    StateOutsideReconfiguration {
        /// The sender.
        from: TaskId,
        /// The epoch the message carries.
        epoch: Epoch,
    },
    /// State or `StateEnd` of an epoch other than the running one.
    #[error("state of epoch {got} from {from} while epoch {running} is running")]
    StateOfOtherEpoch {
        /// The sender.
        from: TaskId,
        /// The epoch the message carries.
        got: Epoch,
        /// The running epoch.
        running: Epoch,
    },
    /// State or `StateEnd` from a task that moves nothing to this one.
    #[error("state of epoch {epoch} from {from}, which moves nothing here")]
    NotASender {
        /// The task.
        from: TaskId,
        /// The epoch.
        epoch: Epoch,
    },
    /// State or `StateEnd` from a sender after its `StateEnd`.
    #[error("state of epoch {epoch} from {from} after its StateEnd")]
    StateAfterEnd {
        /// The sender.
        from: TaskId,
        /// The epoch.
        epoch: Epoch,
    },
    /// A `Drain` while the upstream task is paused.
    #[error("Drain of epoch {got} while paused for epoch {paused}")]
    DrainWhilePaused {
        /// The epoch it is paused for.
        paused: Epoch,
        /// The epoch of the new `Drain`.
        got: Epoch,
    },
    /// A `Drain` for a reconfiguration this task was not prepared for.
    #[error("Drain of epoch {epoch} without its Prepare")]
    DrainWithoutPrepare {
        /// The epoch of the `Drain`.
        epoch: Epoch,
    },
    /// A `Resume` while the upstream task is not paused.
    #[error("Resume of epoch {epoch} without a Drain")]
    ResumeWithoutDrain {
        /// The epoch of the `Resume`.
        epoch: Epoch,
    },
    /// A state chunk under the `remote` protocol, where state never moves (only timers do).
    #[error("state of epoch {epoch} from {from}, but under the remote protocol state does not move")]
    StateUnderRemote {
        /// The sender.
        from: TaskId,
        /// The epoch.
        epoch: Epoch,
    },
    /// A `Resume` of another epoch than the one the upstream task is paused for.
    #[error("Resume of epoch {got} while paused for epoch {paused}")]
    ResumeOfOtherEpoch {
        /// The epoch it is paused for.
        paused: Epoch,
        /// The epoch of the `Resume`.
        got: Epoch,
    },
}

/// Input of a [`TargetCore`]; `C` names an input channel (the runtime's `InputChannel`).
#[derive(Clone, Debug, PartialEq)]
pub enum TargetEvent<C> {
    /// The coordinator's Prepare for this task's operator; `inputs` = its live upstream channels now.
    Prepare {
        /// The plan.
        plan: Arc<ReconfigPlan>,
        /// The task's live upstream channels.
        inputs: Vec<C>,
    },
    /// The coordinator's Drain (every task of the reconfiguration is prepared, so every
    /// receiver knows what to expect): once every awaited marker arrived, send.
    Drain {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// A marker arrived on `channel`.
    Marker {
        /// The channel.
        channel: C,
        /// The marker's epoch.
        epoch: Epoch,
    },
    /// An input channel ended (end of stream, or the coordinator said its upstream finished):
    /// counts as its marker.
    EndOfStream {
        /// The channel.
        channel: C,
    },
    /// A state or timers chunk of `epoch` from `from` arrived (the executor installs it once the
    /// core accepted it): error if not expected.
    StateChunk {
        /// The sender.
        from: TaskId,
        /// The chunk's epoch.
        epoch: Epoch,
    },
    /// A timers chunk of `epoch` from `from` arrived (timers of moved buckets move under both
    /// modes): error if not expected.
    TimersChunk {
        /// The sender.
        from: TaskId,
        /// The chunk's epoch.
        epoch: Epoch,
    },
    /// `from` sent everything it moves to this task in `epoch` (remote mode: it flushed the moved
    /// buckets to the shared store and sent their timers).
    StateEnd {
        /// The sender.
        from: TaskId,
        /// The epoch.
        epoch: Epoch,
    },
}

/// Output of a [`TargetCore`], to execute in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetAction {
    /// Acknowledge to the coordinator (`Prepared`, `StateReceived`).
    Ack {
        /// The reconfiguration.
        epoch: Epoch,
        /// The ack.
        ack: TaskAck,
    },
    /// Every awaited marker arrived: flush outputs, then for each (to, buckets) send the buckets'
    /// state by range scan, their timers, then `StateEnd`; delete them locally; then ack
    /// `StateSent { bytes, entries }` with what was sent (also when `moves` is empty).
    SendState {
        /// The reconfiguration.
        epoch: Epoch,
        /// The buckets to send, per new owner.
        moves: Vec<(TaskId, Vec<BucketId>)>,
    },
    /// Remote mode's `SendState`: every awaited marker arrived; flush outputs, then for each
    /// (to, buckets): release the buckets to the shared store (write back everything buffered
    /// for them, forget local copies — `StateBackend::release_buckets`), send their timers, then
    /// `StateEnd`; then ack `StateSent { bytes: 0, entries: 0 }` (no state moved), also when
    /// `moves` is empty.
    Flush {
        /// The reconfiguration.
        epoch: Epoch,
        /// The buckets given away, per new owner.
        moves: Vec<(TaskId, Vec<BucketId>)>,
    },
    /// The event was refused; the core is unchanged and the task must fail.
    Error(StopRestartError),
}

/// This task's part of the running reconfiguration.
#[derive(Clone, Debug)]
struct Part<C> {
    epoch: Epoch,
    /// Input channels whose marker (or end of stream) has not arrived.
    awaiting: BTreeSet<C>,
    /// What this task sends once `awaiting` is empty; `None` once sent (or for a created task,
    /// which sends nothing).
    moves: Option<Vec<(TaskId, Vec<BucketId>)>>,
    /// Tasks still sending state here.
    senders: BTreeSet<TaskId>,
    /// Buckets arriving here, by sender (`may_read` is false for them until the sender ended).
    incoming: Vec<(TaskId, BucketId)>,
    /// Tasks that sent `StateEnd` (to tell a late chunk from one of a stranger).
    ended: BTreeSet<TaskId>,
    /// Whether the coordinator's `Drain` arrived. Only then is every receiver prepared: a task
    /// whose inputs all ended awaits no marker, and its state must not reach a receiver that has
    /// not seen `Prepare` yet.
    drained: bool,
    /// Whether the plan created this task (it only receives).
    created: bool,
}

impl<C> Part<C> {
    fn busy(&self) -> bool {
        self.moves.is_some() || !self.senders.is_empty()
    }
}

/// The reconfigured operator's task: its part of one reconfiguration at a time.
#[derive(Clone, Debug)]
pub struct TargetCore<C> {
    task: TaskId,
    /// Remote mode (the `remote` protocol): flush instead of sending state.
    remote: bool,
    running: Option<Part<C>>,
    /// The last epoch this task prepared (running or done).
    last: Option<Epoch>,
}

impl<C: Ord + Clone + Debug> TargetCore<C> {
    /// The core of task `task`, in no reconfiguration.
    pub fn new(task: TaskId) -> Self {
        Self { task, remote: false, running: None, last: None }
    }

    /// The core of task `task` under the `remote` protocol (see the module docs), in no
    /// reconfiguration.
    pub fn new_remote(task: TaskId) -> Self {
        Self { task, remote: true, running: None, last: None }
    }

    /// Whether this task may read (or write) the state of `bucket` now: not while the bucket is
    /// arriving from a sender whose `StateEnd` has not (under the remote protocol: whose flush
    /// has not reached the shared store). The executor checks it before processing records.
    pub fn may_read(&self, bucket: BucketId) -> bool {
        self.running.as_ref().is_none_or(|part| {
            !part.incoming.iter().any(|(from, b)| *b == bucket && part.senders.contains(from))
        })
    }

    /// Feeds one event; returns what to do, in order.
    pub fn on(&mut self, event: TargetEvent<C>) -> Vec<TargetAction> {
        let result = match event {
            TargetEvent::Prepare { plan, inputs } => self.prepare(&plan, inputs),
            TargetEvent::Drain { epoch } => self.drain(epoch),
            TargetEvent::Marker { channel, epoch } => self.marker(channel, epoch),
            TargetEvent::EndOfStream { channel } => Ok(self.end_of_stream(&channel)),
            TargetEvent::StateChunk { from, epoch } if self.remote => {
                self.sender_part(from, epoch).and(Err(StopRestartError::StateUnderRemote { from, epoch }))
            }
            TargetEvent::StateChunk { from, epoch } | TargetEvent::TimersChunk { from, epoch } => {
                self.sender_part(from, epoch).map(|_| Vec::new())
            }
            TargetEvent::StateEnd { from, epoch } => self.state_end(from, epoch),
        };
        result.unwrap_or_else(|e| vec![TargetAction::Error(e)])
    }

    /// Whether a reconfiguration part is running (markers awaited or state still arriving): the
    /// task must not exit yet.
    pub fn busy(&self) -> bool {
        self.running.is_some()
    }

    /// The running reconfiguration's epoch (`None` while not [`busy`](Self::busy)).
    pub fn epoch(&self) -> Option<Epoch> {
        self.running.as_ref().map(|p| p.epoch)
    }

    fn prepare(
        &mut self,
        plan: &ReconfigPlan,
        inputs: Vec<C>,
    ) -> Result<Vec<TargetAction>, StopRestartError> {
        let epoch = plan.epoch;
        if let Some(running) = self.epoch() {
            return Err(StopRestartError::PrepareWhileRunning { running, got: epoch });
        }
        if let Some(last) = self.last.filter(|last| *last >= epoch) {
            return Err(StopRestartError::StaleEpoch { got: epoch, last });
        }
        if plan.operator != self.task.operator {
            return Err(StopRestartError::OtherOperator { epoch, operator: plan.operator });
        }
        let created = plan.created.contains(&self.task.index);
        let part = Part {
            epoch,
            // A created task has no routed input yet: nothing of the old table can reach it.
            awaiting: if created { BTreeSet::new() } else { inputs.into_iter().collect() },
            moves: (!created)
                .then(|| plan.outgoing(self.task).map(|(to, buckets)| (to, buckets.clone())).collect()),
            senders: plan.senders_to(self.task),
            incoming: plan
                .moves
                .iter()
                .filter(|((_, to), _)| *to == self.task)
                .flat_map(|((from, _), buckets)| buckets.iter().map(move |b| (*from, *b)))
                .collect(),
            ended: BTreeSet::new(),
            // A created task sends nothing, so it has nothing to hold back until the Drain.
            drained: created,
            created,
        };
        self.last = Some(epoch);
        self.running = Some(part);
        let ack = TargetAction::Ack { epoch, ack: TaskAck::Prepared };
        // A created task nobody sends to has no part beyond its `Prepared`.
        self.finish_if_done();
        Ok(vec![ack])
    }

    /// The coordinator's `Drain` (Koala's stateless `Switch` plays its part): every task of the
    /// reconfiguration is prepared, so state sent now finds its receiver ready.
    fn drain(&mut self, epoch: Epoch) -> Result<Vec<TargetAction>, StopRestartError> {
        match self.running.as_mut() {
            Some(part) if part.epoch == epoch => part.drained = true,
            // Done already: a created task that received everything before the Drain arrived.
            _ if self.last == Some(epoch) => return Ok(Vec::new()),
            _ => return Err(StopRestartError::DrainWithoutPrepare { epoch }),
        }
        // Every input may have ended already: then the state goes at once.
        Ok(self.send_if_drained())
    }

    fn marker(&mut self, channel: C, epoch: Epoch) -> Result<Vec<TargetAction>, StopRestartError> {
        let Some(part) = self.running.as_mut().filter(|p| p.epoch == epoch) else {
            // Another operator's reconfiguration, or the switch marker of an epoch this task is
            // done with: it passes through.
            return Ok(Vec::new());
        };
        if part.created {
            // The routing switch marks every new channel too; a created task awaits none.
            return Ok(Vec::new());
        }
        if !part.awaiting.remove(&channel) {
            return Err(StopRestartError::UnexpectedMarker { epoch, channel: format!("{channel:?}") });
        }
        Ok(self.send_if_drained())
    }

    fn end_of_stream(&mut self, channel: &C) -> Vec<TargetAction> {
        if self.running.as_mut().is_some_and(|part| part.awaiting.remove(channel)) {
            return self.send_if_drained();
        }
        // A channel that owes no marker (or no reconfiguration runs): its end changes nothing here.
        Vec::new()
    }

    /// Checks that `from` may send state of `epoch` now; returns the running part.
    fn sender_part(&mut self, from: TaskId, epoch: Epoch) -> Result<&mut Part<C>, StopRestartError> {
        let part =
            self.running.as_mut().ok_or(StopRestartError::StateOutsideReconfiguration { from, epoch })?;
        if part.epoch != epoch {
            return Err(StopRestartError::StateOfOtherEpoch { from, got: epoch, running: part.epoch });
        }
        if part.ended.contains(&from) {
            return Err(StopRestartError::StateAfterEnd { from, epoch });
        }
        if !part.senders.contains(&from) {
            return Err(StopRestartError::NotASender { from, epoch });
        }
        Ok(part)
    }

    fn state_end(&mut self, from: TaskId, epoch: Epoch) -> Result<Vec<TargetAction>, StopRestartError> {
        let part = self.sender_part(from, epoch)?;
        part.senders.remove(&from);
        part.ended.insert(from);
        let mut actions = Vec::new();
        if part.senders.is_empty() {
            actions.push(TargetAction::Ack { epoch, ack: TaskAck::StateReceived });
        }
        self.finish_if_done();
        Ok(actions)
    }

    /// Sends the moved buckets once no marker is awaited any more.
    fn send_if_drained(&mut self) -> Vec<TargetAction> {
        let mut actions = Vec::new();
        if let Some(part) = self.running.as_mut()
            && part.awaiting.is_empty()
            && part.drained
            && let Some(moves) = part.moves.take()
        {
            let epoch = part.epoch;
            actions.push(if self.remote {
                TargetAction::Flush { epoch, moves }
            } else {
                TargetAction::SendState { epoch, moves }
            });
        }
        self.finish_if_done();
        actions
    }

    fn finish_if_done(&mut self) {
        if self.running.as_ref().is_some_and(|p| !p.busy()) {
            self.running = None;
        }
    }
}

/// Input of an [`UpstreamCore`]: the coordinator's phases, as the worker relays them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamEvent {
    /// Send a marker to the reconfigured operator and pause.
    Drain {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// Switch to the plan's routing and resume.
    Resume {
        /// The reconfiguration.
        epoch: Epoch,
    },
}

/// Output of an [`UpstreamCore`], to execute in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpstreamAction {
    /// Flush outputs and send `Marker(epoch)` on every output channel to the reconfigured
    /// operator (the runtime broadcasts on all outputs), then stop emitting.
    MarkAndPause {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// Switch the edges to the reconfigured operator to the plan's routing and resume emitting.
    SwitchAndResume {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// Acknowledge to the coordinator (`Paused`, `Resumed`).
    Ack {
        /// The reconfiguration.
        epoch: Epoch,
        /// The ack.
        ack: TaskAck,
    },
    /// The event was refused; the core is unchanged and the task must fail.
    Error(StopRestartError),
}

/// An upstream task of the reconfigured operator.
#[derive(Clone, Debug, Default)]
pub struct UpstreamCore {
    paused: Option<Epoch>,
}

impl UpstreamCore {
    /// The core of a task that is not paused.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one event; returns what to do, in order.
    pub fn on(&mut self, event: UpstreamEvent) -> Vec<UpstreamAction> {
        match (event, self.paused) {
            (UpstreamEvent::Drain { epoch: got }, Some(paused)) => {
                vec![UpstreamAction::Error(StopRestartError::DrainWhilePaused { paused, got })]
            }
            (UpstreamEvent::Drain { epoch }, None) => {
                self.paused = Some(epoch);
                vec![
                    UpstreamAction::MarkAndPause { epoch },
                    UpstreamAction::Ack { epoch, ack: TaskAck::Paused },
                ]
            }
            (UpstreamEvent::Resume { epoch }, None) => {
                vec![UpstreamAction::Error(StopRestartError::ResumeWithoutDrain { epoch })]
            }
            (UpstreamEvent::Resume { epoch: got }, Some(paused)) if got != paused => {
                vec![UpstreamAction::Error(StopRestartError::ResumeOfOtherEpoch { paused, got })]
            }
            (UpstreamEvent::Resume { epoch }, Some(_)) => {
                self.paused = None;
                vec![
                    UpstreamAction::SwitchAndResume { epoch },
                    UpstreamAction::Ack { epoch, ack: TaskAck::Resumed },
                ]
            }
        }
    }

    /// The epoch this task is paused for, if it is.
    pub fn paused(&self) -> Option<Epoch> {
        self.paused
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::control::{Deployment, Protocol};

    const OP: OperatorId = OperatorId(1);

    fn task(index: u32) -> TaskId {
        TaskId::new(OP, index)
    }

    /// A plan of `epoch` for operator 1 with `moves` (from, to, buckets) and `created` tasks.
    fn plan(epoch: Epoch, moves: &[(u32, u32, &[BucketId])], created: &[u32]) -> Arc<ReconfigPlan> {
        let mut deployment = Deployment::for_tests(
            BTreeMap::from([(OP, vec![0, 1, 2])]),
            BTreeMap::new(),
            8,
            Protocol::StopAndRestart,
        );
        deployment.epoch = epoch;
        Arc::new(ReconfigPlan {
            epoch,
            operator: OP,
            deployment,
            moves: moves.iter().map(|(from, to, b)| ((task(*from), task(*to)), b.to_vec())).collect(),
            upstreams: vec![],
            created: created.to_vec(),
            cancelled: vec![],
            retired: vec![],
        })
    }

    fn ack(epoch: Epoch, ack: TaskAck) -> TargetAction {
        TargetAction::Ack { epoch, ack }
    }

    /// Prepare, then the coordinator's Drain (it comes once every task is prepared).
    fn prepare(core: &mut TargetCore<u32>, plan: &Arc<ReconfigPlan>, inputs: &[u32]) -> Vec<TargetAction> {
        let mut actions = core.on(TargetEvent::Prepare { plan: plan.clone(), inputs: inputs.to_vec() });
        if !actions.iter().any(|a| matches!(a, TargetAction::Error(_))) {
            actions.extend(core.on(TargetEvent::Drain { epoch: plan.epoch }));
        }
        actions
    }

    /// A task whose inputs all ended awaits no marker, but sends only after the Drain: before
    /// it, a receiver may not have seen its Prepare.
    #[test]
    fn state_waits_for_the_drain() {
        let p = plan(1, &[(0, 1, &[3])], &[]);
        let mut core: TargetCore<u32> = TargetCore::new(task(0));
        let actions = core.on(TargetEvent::Prepare { plan: p.clone(), inputs: vec![] });
        assert_eq!(actions, vec![ack(1, TaskAck::Prepared)], "no state before the Drain");
        let moves = vec![(task(1), vec![3])];
        assert_eq!(
            core.on(TargetEvent::Drain { epoch: 1 }),
            vec![TargetAction::SendState { epoch: 1, moves }]
        );
        assert_eq!(core.on(TargetEvent::Drain { epoch: 1 }), vec![], "a Drain after the part is done");
        assert_eq!(
            error(core.on(TargetEvent::Drain { epoch: 2 })),
            StopRestartError::DrainWithoutPrepare { epoch: 2 }
        );
    }

    fn marker(channel: u32, epoch: Epoch) -> TargetEvent<u32> {
        TargetEvent::Marker { channel, epoch }
    }

    fn error(actions: Vec<TargetAction>) -> StopRestartError {
        match &actions[..] {
            [TargetAction::Error(e)] => e.clone(),
            other => panic!("expected one error, got {other:?}"),
        }
    }

    #[test]
    fn a_sender_sends_once_every_marker_arrived() {
        let p = plan(1, &[(0, 1, &[3, 4]), (0, 2, &[5])], &[]);
        let mut core = TargetCore::new(task(0));
        assert_eq!(prepare(&mut core, &p, &[10, 11]), vec![ack(1, TaskAck::Prepared)]);
        assert_eq!((core.busy(), core.epoch()), (true, Some(1)));
        assert_eq!(core.on(marker(10, 1)), vec![]);
        assert!(core.busy(), "a marker is still awaited");
        let moves = vec![(task(1), vec![3, 4]), (task(2), vec![5])];
        assert_eq!(core.on(marker(11, 1)), vec![TargetAction::SendState { epoch: 1, moves }]);
        assert_eq!((core.busy(), core.epoch()), (false, None));
    }

    #[test]
    fn a_receiver_acks_once_every_sender_ended() {
        let p = plan(1, &[(0, 2, &[3]), (1, 2, &[4])], &[]);
        let mut core = TargetCore::new(task(2));
        assert_eq!(prepare(&mut core, &p, &[10]), vec![ack(1, TaskAck::Prepared)]);
        // An old task also passes the markers; it sends nothing but still reports (0 bytes).
        assert_eq!(core.on(marker(10, 1)), vec![TargetAction::SendState { epoch: 1, moves: vec![] }]);
        assert!(core.busy(), "state still arrives");
        assert_eq!(core.on(TargetEvent::StateChunk { from: task(0), epoch: 1 }), vec![]);
        assert_eq!(core.on(TargetEvent::StateEnd { from: task(0), epoch: 1 }), vec![]);
        assert_eq!(core.on(TargetEvent::StateChunk { from: task(1), epoch: 1 }), vec![]);
        assert_eq!(
            core.on(TargetEvent::StateEnd { from: task(1), epoch: 1 }),
            vec![ack(1, TaskAck::StateReceived)]
        );
        assert!(!core.busy());
    }

    #[test]
    fn a_created_task_awaits_no_marker_and_only_receives() {
        let p = plan(1, &[(0, 2, &[3])], &[2]);
        let mut core = TargetCore::new(task(2));
        assert_eq!(prepare(&mut core, &p, &[10]), vec![ack(1, TaskAck::Prepared)], "no SendState");
        assert!(core.busy());
        assert_eq!(core.on(TargetEvent::EndOfStream { channel: 10 }), vec![], "no channel is awaited");
        assert_eq!(
            core.on(TargetEvent::StateEnd { from: task(0), epoch: 1 }),
            vec![ack(1, TaskAck::StateReceived)]
        );
        assert!(!core.busy());
        // A created task nobody sends to is done at Prepare.
        let mut idle = TargetCore::new(task(1));
        let p = plan(2, &[(0, 2, &[3])], &[1, 2]);
        assert_eq!(prepare(&mut idle, &p, &[]), vec![ack(2, TaskAck::Prepared)]);
        assert!(!idle.busy());
    }

    #[test]
    fn a_task_that_sends_and_receives_acks_both_in_either_order() {
        let p = plan(1, &[(0, 1, &[3]), (1, 0, &[4])], &[]);
        let mut core = TargetCore::new(task(0));
        prepare(&mut core, &p, &[10]);
        // State arrives before this task's own marker.
        assert_eq!(
            core.on(TargetEvent::StateEnd { from: task(1), epoch: 1 }),
            vec![ack(1, TaskAck::StateReceived)]
        );
        assert!(core.busy(), "its own marker is still awaited");
        let send = TargetAction::SendState { epoch: 1, moves: vec![(task(1), vec![3])] };
        assert_eq!(core.on(marker(10, 1)), vec![send.clone()]);
        assert!(!core.busy());

        let mut core = TargetCore::new(task(1));
        prepare(&mut core, &p, &[10]);
        assert_eq!(
            core.on(marker(10, 1)),
            vec![TargetAction::SendState { epoch: 1, moves: vec![(task(0), vec![4])] }]
        );
        assert!(core.busy(), "state still arrives");
        assert_eq!(
            core.on(TargetEvent::StateEnd { from: task(0), epoch: 1 }),
            vec![ack(1, TaskAck::StateReceived)]
        );
        assert!(!core.busy());
    }

    #[test]
    fn inputs_ended_at_prepare_send_at_once() {
        let p = plan(1, &[(0, 1, &[3])], &[]);
        let mut core = TargetCore::new(task(0));
        let send = TargetAction::SendState { epoch: 1, moves: vec![(task(1), vec![3])] };
        assert_eq!(prepare(&mut core, &p, &[]), vec![ack(1, TaskAck::Prepared), send]);
        assert!(!core.busy());
        // A task with no part at all still reports StateSent (0 bytes): the phase driver waits
        // for it from every old task.
        let mut bystander = TargetCore::new(task(2));
        let nothing = TargetAction::SendState { epoch: 1, moves: vec![] };
        assert_eq!(prepare(&mut bystander, &p, &[]), vec![ack(1, TaskAck::Prepared), nothing]);
        assert!(!bystander.busy());
    }

    #[test]
    fn an_end_of_stream_counts_as_the_marker() {
        let p = plan(1, &[(0, 1, &[3])], &[]);
        let mut core = TargetCore::new(task(0));
        prepare(&mut core, &p, &[10, 11]);
        assert_eq!(core.on(marker(10, 1)), vec![]);
        let send = TargetAction::SendState { epoch: 1, moves: vec![(task(1), vec![3])] };
        assert_eq!(core.on(TargetEvent::EndOfStream { channel: 11 }), vec![send]);
        // The end of a channel whose marker already arrived, or outside a reconfiguration, is not an error.
        assert_eq!(core.on(TargetEvent::EndOfStream { channel: 10 }), vec![]);
    }

    #[test]
    fn markers_of_other_epochs_pass_through() {
        let mut core = TargetCore::new(task(0));
        assert_eq!(core.on(marker(10, 7)), vec![], "idle: another operator's reconfiguration");
        let p = plan(2, &[(0, 1, &[3])], &[]);
        prepare(&mut core, &p, &[10]);
        assert_eq!(core.on(marker(10, 1)), vec![], "the switch marker of an earlier epoch");
        assert!(core.busy());
        assert!(matches!(core.on(marker(10, 2))[..], [TargetAction::SendState { .. }]));
        assert_eq!(core.on(marker(10, 2)), vec![], "the switch marker of a finished epoch");
    }

    #[test]
    fn a_second_marker_of_the_running_epoch_is_an_error() {
        let p = plan(1, &[(0, 1, &[3])], &[]);
        let mut core = TargetCore::new(task(0));
        prepare(&mut core, &p, &[10, 11]);
        core.on(marker(10, 1));
        let e = error(core.on(marker(10, 1)));
        assert_eq!(e, StopRestartError::UnexpectedMarker { epoch: 1, channel: "10".into() });
        assert_eq!(
            error(core.on(marker(12, 1))),
            StopRestartError::UnexpectedMarker { epoch: 1, channel: "12".into() }
        );
        assert!(core.busy(), "unchanged: channel 11 is still awaited");
        assert!(matches!(core.on(marker(11, 1))[..], [TargetAction::SendState { .. }]));

        // A created task owes no marker, and the markers the routing switch sends on its new
        // channels (Koala's stateless `Switch` may deliver one before the `HandOver` command)
        // pass through.
        let p = plan(2, &[(0, 2, &[3])], &[2]);
        let mut created = TargetCore::new(task(2));
        created.on(TargetEvent::Prepare { plan: p.clone(), inputs: vec![10] });
        assert_eq!(created.on(marker(10, 2)), vec![]);
        assert!(created.busy(), "state still arrives");
        // A created task nobody sends to is done at its `Prepared`, before any `HandOver`.
        let mut idle = TargetCore::new(task(1));
        let p = plan(2, &[(0, 2, &[3])], &[1, 2]);
        let actions = idle.on(TargetEvent::Prepare { plan: p, inputs: vec![10] });
        assert_eq!(actions, vec![ack(2, TaskAck::Prepared)]);
        assert!(!idle.busy());
        assert_eq!(idle.on(marker(10, 2)), vec![]);
        assert_eq!(idle.on(TargetEvent::Drain { epoch: 2 }), vec![]);
    }

    #[test]
    fn a_prepare_while_running_or_stale_or_foreign_is_an_error() {
        let p = plan(2, &[(0, 1, &[3])], &[]);
        let mut core = TargetCore::new(task(0));
        prepare(&mut core, &p, &[10]);
        let e = error(prepare(&mut core, &plan(3, &[], &[]), &[10]));
        assert_eq!(e, StopRestartError::PrepareWhileRunning { running: 2, got: 3 });
        assert_eq!(core.epoch(), Some(2), "unchanged");
        core.on(marker(10, 2));
        assert_eq!(error(prepare(&mut core, &p, &[10])), StopRestartError::StaleEpoch { got: 2, last: 2 });
        assert_eq!(
            error(prepare(&mut core, &plan(1, &[], &[]), &[10])),
            StopRestartError::StaleEpoch { got: 1, last: 2 }
        );
        let mut other = TargetCore::new(TaskId::new(OperatorId(5), 0));
        let e = error(prepare(&mut other, &p, &[10]));
        assert_eq!(e, StopRestartError::OtherOperator { epoch: 2, operator: OP });
        assert!(!other.busy());
        // A newer epoch after the last one finished is fine.
        assert_eq!(prepare(&mut core, &plan(3, &[], &[]), &[10]), vec![ack(3, TaskAck::Prepared)]);
    }

    #[test]
    fn unexpected_state_is_an_error() {
        let mut core = TargetCore::new(task(1));
        let chunk = |from, epoch| TargetEvent::StateChunk { from, epoch };
        let end = |from, epoch| TargetEvent::StateEnd { from, epoch };
        assert_eq!(
            error(core.on(chunk(task(0), 1))),
            StopRestartError::StateOutsideReconfiguration { from: task(0), epoch: 1 }
        );
        assert_eq!(
            error(core.on(end(task(0), 1))),
            StopRestartError::StateOutsideReconfiguration { from: task(0), epoch: 1 }
        );
        let p = plan(2, &[(0, 1, &[3])], &[]);
        prepare(&mut core, &p, &[10]);
        assert_eq!(
            error(core.on(chunk(task(0), 1))),
            StopRestartError::StateOfOtherEpoch { from: task(0), got: 1, running: 2 }
        );
        assert_eq!(
            error(core.on(chunk(task(2), 2))),
            StopRestartError::NotASender { from: task(2), epoch: 2 }
        );
        assert_eq!(error(core.on(end(task(2), 2))), StopRestartError::NotASender { from: task(2), epoch: 2 });
        // Its own marker is still awaited, so the part keeps running after the sender ended.
        assert_eq!(core.on(end(task(0), 2)), vec![ack(2, TaskAck::StateReceived)]);
        assert_eq!(
            error(core.on(chunk(task(0), 2))),
            StopRestartError::StateAfterEnd { from: task(0), epoch: 2 }
        );
        assert_eq!(
            error(core.on(end(task(0), 2))),
            StopRestartError::StateAfterEnd { from: task(0), epoch: 2 }
        );
        assert!(matches!(core.on(marker(10, 2))[..], [TargetAction::SendState { .. }]));
        // Done: state now comes from outside a reconfiguration.
        assert!(matches!(
            error(core.on(chunk(task(0), 2))),
            StopRestartError::StateOutsideReconfiguration { .. }
        ));
    }

    /// Remote mode: the sender flushes instead of sending; a receiver may not read a moved
    /// bucket until the sender's flush is acknowledged (`StateEnd`), nor ack `StateReceived`
    /// (which the phase driver waits for before it resumes the upstreams); state chunks are
    /// refused, timers pass.
    #[test]
    fn remote_mode_flushes_and_a_receiver_reads_only_after_the_flush() {
        let p = plan(1, &[(0, 1, &[3]), (2, 1, &[5])], &[]);
        let mut sender = TargetCore::new_remote(task(0));
        let mut receiver = TargetCore::new_remote(task(1));
        assert!(receiver.may_read(3), "no reconfiguration: everything it owns is readable");
        prepare(&mut sender, &p, &[10]);
        prepare(&mut receiver, &p, &[10]);
        assert!(!receiver.may_read(3) && !receiver.may_read(5), "incoming buckets wait for flushes");
        assert!(receiver.may_read(4), "a bucket that does not move is readable");
        let flush = TargetAction::Flush { epoch: 1, moves: vec![(task(1), vec![3])] };
        assert_eq!(sender.on(marker(10, 1)), vec![flush], "a flush, not a state transfer");
        // The receiver's own marker: it gives nothing away, so an empty flush (it still acks).
        assert_eq!(receiver.on(marker(10, 1)), vec![TargetAction::Flush { epoch: 1, moves: vec![] }]);
        let e = error(receiver.on(TargetEvent::StateChunk { from: task(0), epoch: 1 }));
        assert_eq!(e, StopRestartError::StateUnderRemote { from: task(0), epoch: 1 });
        assert!(!receiver.may_read(3), "unchanged by the refused chunk");
        assert_eq!(receiver.on(TargetEvent::TimersChunk { from: task(0), epoch: 1 }), vec![]);
        assert!(!receiver.may_read(3), "timers arrived, the flush is not acknowledged yet");
        assert_eq!(receiver.on(TargetEvent::StateEnd { from: task(0), epoch: 1 }), vec![]);
        assert!(receiver.may_read(3), "task 0 flushed bucket 3");
        assert!(!receiver.may_read(5), "task 2 has not flushed bucket 5: no StateReceived yet");
        assert_eq!(
            receiver.on(TargetEvent::StateEnd { from: task(2), epoch: 1 }),
            vec![ack(1, TaskAck::StateReceived)]
        );
        assert!(receiver.may_read(5) && !receiver.busy());
        // Under stop-and-restart the same gate holds until the state arrived.
        let mut sr = TargetCore::new(task(1));
        prepare(&mut sr, &p, &[]);
        assert!(!sr.may_read(3));
        assert_eq!(sr.on(TargetEvent::StateChunk { from: task(0), epoch: 1 }), vec![]);
        assert!(!sr.may_read(3));
        sr.on(TargetEvent::StateEnd { from: task(0), epoch: 1 });
        assert!(sr.may_read(3));
    }

    #[test]
    fn an_upstream_drains_then_resumes() {
        let mut core = UpstreamCore::new();
        assert_eq!(core.paused(), None);
        assert_eq!(
            core.on(UpstreamEvent::Drain { epoch: 4 }),
            vec![
                UpstreamAction::MarkAndPause { epoch: 4 },
                UpstreamAction::Ack { epoch: 4, ack: TaskAck::Paused }
            ]
        );
        assert_eq!(core.paused(), Some(4));
        assert_eq!(
            core.on(UpstreamEvent::Resume { epoch: 4 }),
            vec![
                UpstreamAction::SwitchAndResume { epoch: 4 },
                UpstreamAction::Ack { epoch: 4, ack: TaskAck::Resumed }
            ]
        );
        assert_eq!(core.paused(), None);
        assert!(matches!(
            core.on(UpstreamEvent::Drain { epoch: 5 })[..],
            [UpstreamAction::MarkAndPause { .. }, _]
        ));
    }

    #[test]
    fn an_upstream_refuses_what_does_not_follow_drain_then_resume() {
        let refused = |e| vec![UpstreamAction::Error(e)];
        let mut core = UpstreamCore::new();
        assert_eq!(
            core.on(UpstreamEvent::Resume { epoch: 4 }),
            refused(StopRestartError::ResumeWithoutDrain { epoch: 4 })
        );
        core.on(UpstreamEvent::Drain { epoch: 4 });
        assert_eq!(
            core.on(UpstreamEvent::Drain { epoch: 5 }),
            refused(StopRestartError::DrainWhilePaused { paused: 4, got: 5 })
        );
        assert_eq!(
            core.on(UpstreamEvent::Resume { epoch: 3 }),
            refused(StopRestartError::ResumeOfOtherEpoch { paused: 4, got: 3 })
        );
        assert_eq!(core.paused(), Some(4), "unchanged");
    }
}
