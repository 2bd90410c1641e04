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

use koala_types::{BucketId, Epoch, TaskId};

use crate::control::{ReconfigPlan, TaskAck};

mod error;
#[cfg(test)]
mod tests;
mod upstream;

pub use error::StopRestartError;
pub use upstream::{UpstreamAction, UpstreamCore, UpstreamEvent};

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
