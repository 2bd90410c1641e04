//! The simulated upstream tasks: a source emitting keyed records, a router per operator input,
//! and what they do with the coordinator's `Switch`, `Drain` and `Resume` (the runtime's rules:
//! `RoutingSwitch::event`, the stop-and-restart `UpstreamCore`).

use koala_types::{Epoch, Record, TaskId};

use super::Fault;
use super::scenario::{TARGET, UPSTREAM};
use super::world::{Kind, Msg, Node, World};
use crate::control::TaskAck;
use crate::koala::{RouterAction, RouterEvent};
use crate::stop_restart::{UpstreamAction, UpstreamEvent};
use crate::switch::{RoutingSwitch, SwitchedEdge};

impl World {
    pub(crate) fn can_emit(&self, u: usize) -> bool {
        // A source may end at any time, also in the middle of a reconfiguration; a paused one
        // (stop-and-restart, between Drain and Resume) neither emits nor ends. One blocked on a
        // send does nothing.
        let up = &self.upstreams[u];
        if !up.sending.is_empty() {
            return false;
        }
        let all_started = self.next_request == self.targets.len() && self.pending.is_empty();
        up.pause.paused().is_none() && (up.remaining > 0 || (!up.ended && (up.may_end_early || all_started)))
    }

    /// A source emits 1–3 records (and maybe a watermark), or its end of stream. Each record
    /// goes on a random input and carries its sequence number within its (key, input) lane.
    pub(crate) fn emit(&mut self, u: usize) -> Result<(), String> {
        let up_count = self.upstreams.len();
        let keys_here: Vec<usize> = (0..self.cfg.keys).filter(|k| k % up_count == u).collect();
        let n = 1 + self.rng.below(3);
        let up = &mut self.upstreams[u];
        if up.remaining == 0 {
            up.ended = true;
            let id = up.id;
            self.on_routers(u, |_| RouterEvent::EndOfStream)?;
            if self.cfg.sources_end_early && self.next_request < self.targets.len() {
                // The coordinator hears of it only with the requests (`World::request_late`).
                self.downstream.late_finished.push(id);
                return Ok(());
            }
            self.send_from(u, (Node::Upstream(id), Node::Coordinator, Kind::Control), Msg::Finished(id));
            return Ok(());
        }
        let mut records: Vec<Vec<Record>> = vec![Vec::new(); self.cfg.inputs];
        for _ in 0..n.min(self.upstreams[u].remaining) {
            let key = super::checks::key_name(keys_here[self.rng.below(keys_here.len())]);
            let input = if self.cfg.inputs > 1 { self.rng.below(self.cfg.inputs) } else { 0 };
            *self.emitted.entry(key.clone()).or_insert(0) += 1;
            let seq = self.lane_emitted.entry((key.clone(), input)).or_insert(0);
            *seq += 1;
            let value = super::checks::record_value(*seq, input);
            let up = &mut self.upstreams[u];
            up.clock += 1 + self.rng.below(3) as u64;
            up.remaining -= 1;
            records[input].push(Record { key, value, time: up.clock, due_ms: 0 });
            self.emitted_total += 1;
        }
        for (input, batch) in records.into_iter().enumerate().filter(|(_, b)| !b.is_empty()) {
            let actions = self.upstreams[u].routers[input].on(RouterEvent::Records(batch));
            self.route(u, input, actions)?;
        }
        if self.rng.chance(1, 3) || self.upstreams[u].remaining == 0 {
            let clock = self.upstreams[u].clock;
            self.on_routers(u, |_| RouterEvent::Watermark(clock))?;
        }
        while self.next_request < self.targets.len() && self.triggers[self.next_request] < self.emitted_total
        {
            self.pending.push_back(self.targets[self.next_request].clone());
            self.next_request += 1;
        }
        self.start_next()
    }

    /// Feeds the same event to every router of upstream `u` (one per input), in input order.
    pub(crate) fn on_routers(
        &mut self,
        u: usize,
        event: impl Fn(usize) -> RouterEvent,
    ) -> Result<(), String> {
        for input in 0..self.upstreams[u].routers.len() {
            let actions = self.upstreams[u].routers[input].on(event(input));
            self.route(u, input, actions)?;
        }
        Ok(())
    }

    pub(crate) fn route(&mut self, u: usize, input: usize, actions: Vec<RouterAction>) -> Result<(), String> {
        let from = self.upstreams[u].id;
        for a in actions {
            match a {
                RouterAction::Send { to, message } => self.send_from(
                    u,
                    (Node::Upstream(from), Node::Task(to), Kind::Data(input)),
                    Msg::Data(message),
                ),
                RouterAction::Error(e) => {
                    return Err(format!("upstream {from} refused an event: {e}"));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn upstream_ack(&mut self, u: usize, epoch: Epoch, ack: TaskAck) {
        let id = self.upstreams[u].id;
        self.send_from(u, (Node::Upstream(id), Node::Coordinator, Kind::Control), Msg::Ack(epoch, ack));
    }

    /// A control message reaches an upstream task (a finished one is gone and never answers).
    pub(crate) fn deliver_to_upstream(&mut self, id: TaskId, msg: Msg) -> Result<(), String> {
        let u = self.upstreams.iter().position(|x| x.id == id).ok_or("message to unknown upstream")?;
        if self.upstreams[u].ended {
            return Ok(());
        }
        match msg {
            Msg::Switch(switch) => {
                // One switch of the task, a marker on each of its channels, one `Switched`.
                let event = switch_event(&switch, id, false)?;
                self.on_routers(u, |_| event.clone())?;
                self.upstream_ack(u, switch.epoch, TaskAck::Switched);
            }
            Msg::Drain(epoch) if self.cfg.fault == Some(Fault::RerouteAtDrain) => {
                // Broken: switch to the new routing at once instead of pausing until every
                // moved bucket's state arrived.
                let assignment =
                    self.plans.get(&epoch).map(|p| crate::engine::assignment(&p.deployment, TARGET));
                let assignment = assignment.ok_or("drain of an unknown epoch")?;
                self.on_routers(u, |_| RouterEvent::Mark { epoch })?;
                self.on_routers(u, |_| RouterEvent::Reroute { epoch, assignment: assignment.clone() })?;
                self.upstream_ack(u, epoch, TaskAck::Paused);
            }
            Msg::Resume(switch) if self.cfg.fault == Some(Fault::RerouteAtDrain) => {
                self.upstream_ack(u, switch.epoch, TaskAck::Resumed);
            }
            Msg::Drain(epoch) => {
                let actions = self.upstreams[u].pause.on(UpstreamEvent::Drain { epoch });
                self.exec_upstream(u, actions, None)?;
            }
            Msg::Resume(switch) => {
                let actions = self.upstreams[u].pause.on(UpstreamEvent::Resume { epoch: switch.epoch });
                self.exec_upstream(u, actions, Some(&switch))?;
            }
            m => return Err(format!("unroutable message {m:?} to upstream {id}")),
        }
        Ok(())
    }

    fn exec_upstream(
        &mut self,
        u: usize,
        actions: Vec<UpstreamAction>,
        switch: Option<&RoutingSwitch>,
    ) -> Result<(), String> {
        for a in actions {
            match a {
                UpstreamAction::MarkAndPause { epoch } => {
                    self.on_routers(u, |_| RouterEvent::Mark { epoch })?
                }
                UpstreamAction::SwitchAndResume { epoch } => {
                    let switch = switch.filter(|s| s.epoch == epoch).ok_or("resume without its routing")?;
                    let event = switch_event(switch, self.upstreams[u].id, true)?;
                    self.on_routers(u, |_| event.clone())?;
                }
                UpstreamAction::Ack { epoch, ack } => self.upstream_ack(u, epoch, ack),
                UpstreamAction::Error(e) => {
                    return Err(format!("upstream {} refused: {e}", self.upstreams[u].id));
                }
            }
        }
        Ok(())
    }
}

/// The routing-core event of an upstream's keyed edge into the operator for `switch`: the rule
/// the runtime's output edges follow ([`RoutingSwitch::event`]).
fn switch_event(switch: &RoutingSwitch, upstream: TaskId, resume: bool) -> Result<RouterEvent, String> {
    let edge = SwitchedEdge { edge: crate::plan::Edge::new(UPSTREAM, TARGET, false), keyed: true };
    switch.event(edge, upstream, resume).map_err(|e| format!("upstream {upstream} refused a switch: {e}"))
}
