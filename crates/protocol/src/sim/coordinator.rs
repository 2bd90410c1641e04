//! The simulated job's coordinator: it plans each requested assignment by the coordinator's
//! rules (`crate::plan`), starts it on the job's reconfiguration engine, and delivers the
//! engine's broadcasts to the tasks they concern as the workers do (`crate::relay`,
//! `crates/runtime/src/worker.rs`).

use std::collections::BTreeSet;
use std::sync::Arc;

use koala_types::{TaskId, WorkerId};

use super::Fault;
use super::scenario::{CONSUMER, TARGET, UPSTREAM};
use super::world::{Core, Kind, Msg, Node, World, sim_inputs};
use crate::control::{CoordinatorMessage, Protocol};
use crate::drrs::DrrsLife;
use crate::engine::{EngineAction, StartError};
use crate::koala::Reconfiguration;
use crate::plan::{Edge, Neighbourhood, Target, plan};
use crate::relay::{Relayed, relay};
use crate::switch::RoutingSwitch;

impl World {
    /// Starts the next requested assignment if the engine is free, planned by the coordinator's
    /// rules (`crate::plan`): new tasks are the ones not live now, cancelled ones the live ones
    /// left out, every unreleased cancelled task takes part.
    pub(crate) fn start_next(&mut self) -> Result<(), String> {
        while self.engine.running().is_none() {
            let Some(assignment) = self.pending.pop_front() else { return Ok(()) };
            let current = self.engine.deployment();
            let target = Target::from_assignment(current, TARGET, &assignment, WorkerId(0));
            let epoch = self.epoch + 1;
            let retired = self.engine.retired(TARGET);
            let planned =
                plan(current, TARGET, target, &retired, epoch, &job(self.cfg.inputs, self.cfg.consumers))
                    .map_err(|e| e.to_string())?;
            match self.engine.start(planned.plan, planned.participants) {
                Ok(actions) => {
                    self.epoch = epoch;
                    self.exec_engine(actions)?;
                }
                Err(StartError::InputEnded) => self.skipped += 1,
                Err(e) => return Err(format!("the engine refused a plan: {e}")),
            }
        }
        Ok(())
    }

    /// Executes the engine's actions as the workers would: a broadcast reaches the tasks it
    /// concerns.
    pub(crate) fn exec_engine(&mut self, actions: Vec<EngineAction>) -> Result<(), String> {
        for a in actions {
            match a {
                EngineAction::Broadcast(msg) => self.broadcast(msg)?,
                // Behind every earlier control message to the task (e.g. a `Prepare`).
                EngineAction::Release(task) => self.control(Node::Task(task), Msg::Release),
                EngineAction::Completed { .. } => self.stats.epochs += 1,
            }
        }
        self.start_next()
    }

    pub(crate) fn control(&mut self, to: Node, msg: Msg) {
        self.channels.push((Node::Coordinator, to, Kind::Control), msg);
    }

    fn broadcast(&mut self, msg: CoordinatorMessage) -> Result<(), String> {
        if matches!(msg, CoordinatorMessage::Drrs(_)) {
            return self.broadcast_drrs(msg);
        }
        // As a worker does, a phase message is read against the plan its `Prepare` carried.
        let epoch = match &msg {
            CoordinatorMessage::Prepare(plan) => plan.epoch,
            CoordinatorMessage::Begin { reconfiguration, .. } => reconfiguration.epoch,
            CoordinatorMessage::Switch { epoch }
            | CoordinatorMessage::Drain { epoch }
            | CoordinatorMessage::Resume { epoch } => *epoch,
            _ => self.epoch,
        };
        if let CoordinatorMessage::Prepare(plan) = &msg {
            self.plans.insert(plan.epoch, Arc::new((**plan).clone()));
        }
        let plan =
            self.plans.get(&epoch).cloned().ok_or_else(|| format!("a broadcast of unknown epoch {epoch}"))?;
        let switch = Arc::new(RoutingSwitch::to_plan(plan.clone()));
        let upstreams: Vec<TaskId> = plan.upstreams.clone();
        // Which tasks hear what: the rule the workers run (`crate::relay`).
        let relayed = relay(&msg, Some(&plan));
        match msg {
            CoordinatorMessage::Prepare(_) => {
                // A new task expects input from the live upstreams (under Koala it learns them
                // from `Start`).
                let ups = match self.cfg.protocol {
                    Protocol::Koala | Protocol::Drrs => Vec::new(),
                    Protocol::StopAndRestart | Protocol::Remote => self.engine.upstream_tasks(TARGET),
                };
                for (id, _) in relayed {
                    if plan.created.contains(&id.index) {
                        let mut t = Self::sim_task(id, BTreeSet::new(), &ups, &self.cfg, true);
                        // A new DRRS task learns its channels when it is deployed, as the
                        // runtime's does: from the plan's upstreams, some of which may finish
                        // before its first subscale (its core learns them then, `DrrsLife`).
                        if let Core::Drrs(_) = &t.core {
                            let channels = upstreams.iter().flat_map(|&u| sim_inputs(u, self.cfg.inputs));
                            t.drrs = DrrsLife::new(true, channels);
                        }
                        if self.tasks.insert(id, t).is_some() {
                            return Err(format!("task {id} deployed twice"));
                        }
                    }
                    if self.tasks.get(&id).is_some_and(|t| !t.life.released()) {
                        self.control(Node::Task(id), Msg::Prepare(plan.clone()));
                    }
                }
                // The workers of the operator's consumers tell them the created tasks' channels.
                self.prepare_consumers(&plan, &job(self.cfg.inputs, self.cfg.consumers).outputs);
            }
            CoordinatorMessage::Begin { reconfiguration, .. } => {
                let reconfiguration: Arc<Reconfiguration> = Arc::from(reconfiguration);
                let epoch = reconfiguration.epoch;
                for (to, _) in relayed {
                    self.control(Node::Task(to), Msg::Start(reconfiguration.clone()));
                }
                if self.cfg.fault == Some(Fault::SwitchBeforePeerReady) && self.early_switched.insert(epoch) {
                    for up in upstreams {
                        self.control(Node::Upstream(up), Msg::Switch(switch.clone()));
                    }
                }
            }
            CoordinatorMessage::Switch { .. }
            | CoordinatorMessage::Drain { .. }
            | CoordinatorMessage::Resume { .. }
            | CoordinatorMessage::UpstreamEnded { .. } => {
                for (to, r) in relayed {
                    let (node, msg) = match r {
                        Relayed::Switch if self.early_switched.contains(&epoch) => continue,
                        Relayed::Switch => (Node::Upstream(to), Msg::Switch(switch.clone())),
                        Relayed::Drain => (Node::Upstream(to), Msg::Drain(epoch)),
                        Relayed::Resume => (Node::Upstream(to), Msg::Resume(switch.clone())),
                        // The operator's tasks, which were all prepared, may send their state;
                        // a Koala task hands over per `Start` and ignores it, as the runtime's.
                        Relayed::HandOver
                            if matches!(self.tasks.get(&to).map(|t| &t.core), Some(Core::Koala(_))) =>
                        {
                            continue;
                        }
                        Relayed::HandOver => (Node::Task(to), Msg::Drain(epoch)),
                        Relayed::UpstreamEnded(u) => (Node::Task(to), Msg::EndedUpstream(u)),
                        other => {
                            return Err(format!("a relayed {other:?}, which the simulator does not model"));
                        }
                    };
                    self.control(node, msg);
                }
            }
            other => {
                return Err(format!("the engine broadcast {other:?}, which the simulator does not model"));
            }
        }
        Ok(())
    }
}

/// The simulated job around its keyed operator: fed by the upstream operator on every input
/// (keyed edges), feeding the consumer operator if it has tasks (one edge).
pub(crate) fn job(inputs: usize, consumers: usize) -> Neighbourhood {
    Neighbourhood {
        stateful: true,
        inputs: vec![Edge::new(UPSTREAM, TARGET, false); inputs],
        outputs: if consumers > 0 { vec![Edge::new(TARGET, CONSUMER, false)] } else { Vec::new() },
    }
}
