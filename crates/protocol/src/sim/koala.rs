//! A simulated Koala task: its peer, fetch and control messages, and every event fed to its core
//! with the runtime's rules checked around it (bounded inbox, pulls yielding to input, single
//! bucket owner, exit once released and its inputs ended).

use std::collections::BTreeMap;

use koala_types::TaskId;

use super::Fault;
use super::world::{Core, Kind, Msg, Node, SimTask, World, sim_inputs};
use crate::control::TaskAck;
use crate::koala::{LocalKeys, PeerMessage, TaskAction, TaskEvent};

impl World {
    /// A peer, fetch or control message reaches a Koala task.
    pub(crate) fn deliver_koala_control(
        &mut self,
        id: TaskId,
        src: Option<TaskId>,
        msg: Msg,
    ) -> Result<(), String> {
        let event = match (msg, src) {
            (Msg::Peer(message), Some(from)) => TaskEvent::Peer { from, message },
            (Msg::FetchRequest(request), Some(from)) => TaskEvent::FetchRequest { from, request },
            (Msg::FetchResponse(response), Some(from)) => {
                self.pulls_in_flight.remove(&(id, from, response.id));
                TaskEvent::FetchResponse { from, response }
            }
            (Msg::FilterRequest(request), Some(from)) => TaskEvent::FilterRequest { from, request },
            (Msg::Wake, Some(from)) if from == id => TaskEvent::Wake,
            (Msg::Clock, Some(from)) if from == id => {
                self.clock_queued.remove(&id);
                TaskEvent::ProcessingTime { now: self.step }
            }
            (Msg::Filter(response), Some(from)) => TaskEvent::Filter { from, response },
            (Msg::BuildFilter { to, request }, Some(from)) if from == id => {
                return self.build_and_send_filter(id, to, request);
            }
            (Msg::Start(r), None) => {
                if let Some(t) = self.tasks.get_mut(&id) {
                    t.life.started(r.epoch);
                }
                // A task learns the channels of upstreams it does not know yet (a new
                // task: all of them) with its `Start`; the runtime knows them when it
                // deploys the task.
                let inputs = self.cfg.inputs;
                if let Some(Core::Koala(k)) = self.tasks.get_mut(&id).map(|t| &mut t.core) {
                    for &u in &r.upstreams {
                        for channel in sim_inputs(u, inputs) {
                            k.add_input(channel);
                        }
                    }
                }
                TaskEvent::Start(r)
            }
            (Msg::Prepare(plan), None) => {
                // A Koala task learns the new placement and answers.
                if let Some(t) = self.tasks.get_mut(&id) {
                    t.life.prepared(plan.epoch, !plan.senders_to(id).is_empty());
                }
                self.channels.push(
                    (Node::Task(id), Node::Coordinator, Kind::Control),
                    Msg::Ack(plan.epoch, TaskAck::Prepared),
                );
                return Ok(());
            }
            (Msg::EndedUpstream(u), None) => {
                // Every channel of the finished upstream ends here (two for a self-join).
                let open = match self.tasks.get(&id).map(|t| &t.core) {
                    Some(Core::Koala(k)) => k.inputs_from(u),
                    _ => Vec::new(),
                };
                for channel in open {
                    self.feed(id, TaskEvent::EndOfStream { channel })?;
                }
                return Ok(());
            }
            (m, _) => return Err(format!("unroutable message {m:?} to {id}")),
        };
        self.feed(id, event)
    }

    /// Feeds an event to a Koala task core and executes its actions.
    pub(crate) fn feed(&mut self, id: TaskId, event: TaskEvent) -> Result<(), String> {
        let Some(SimTask { core: Core::Koala(core), store, .. }) = self.tasks.get_mut(&id) else {
            return Err(format!("no Koala task {id}"));
        };
        let mut local = SimLocal { store, probes: 0 };
        core.set_intake_tag(self.step);
        // The runtime tells its core how much input waits in its queue; so does the world.
        let backlog = self.channels.data_batches_to(id);
        core.set_input_backlog(backlog);
        let what = match &event {
            TaskEvent::Records { records, .. } => format!("{} records on a data channel", records.len()),
            TaskEvent::Peer { message: PeerMessage::Records { records, .. }, .. } => {
                format!("{} records on the peer lane", records.len())
            }
            other => format!("{other:?}").chars().take(60).collect(),
        };
        let asked_ahead = core.look_ahead_requests();
        let actions = core.on_with(event, &mut local);
        self.stats.local_probes += local.probes;
        self.stats.look_ahead_fetches += core.look_ahead_requests() - asked_ahead;
        // Background pulls yield to input: none goes out while batches wait for the task.
        if backlog > 0 {
            self.stats.fed_with_backlog += 1;
            if actions
                .iter()
                .any(|a| matches!(a, TaskAction::FetchState { request, .. } if request.keys.is_empty()))
            {
                return Err(format!(
                    "pulls yield to input: {id} pulls while {backlog} batches wait for it, after {what}"
                ));
            }
        }
        // The runtime's rule: a task holding `max_queued_records` takes no data input.
        if core.takes_data() {
            self.paused.remove(&id);
        } else if self.paused.insert(id) {
            self.stats.pauses += 1;
        }
        for b in core.take_batches() {
            self.stats.max_batch_wait = self.stats.max_batch_wait.max(self.step - b.taken);
        }
        let queued = core.queued_records();
        self.stats.max_queued = self.stats.max_queued.max(queued);
        if queued > self.cfg.max_queued_records && self.cfg.fault != Some(Fault::HoldBackAfterMarker) {
            return Err(format!(
                "bounded inbox: {id} holds {queued} records, past max_queued_records = {}, after {what}",
                self.cfg.max_queued_records
            ));
        }
        // Buckets the core took over in this event came with a hand-over the sender let go of.
        for b in core.owned_buckets() {
            match self.claims.get_mut(usize::from(b)) {
                Some(slot @ None) => *slot = Some(id),
                Some(Some(owner)) if *owner == id => {}
                other => {
                    return Err(format!("single owner: {id} takes bucket {b} claimed by {other:?}"));
                }
            }
        }
        let ended = self.tasks.get_mut(&id).and_then(|t| match &t.core {
            Core::Koala(core) => t.life.check_inputs_ended(core.as_ref()),
            _ => None,
        });
        for a in actions {
            self.exec_task(id, a)?;
        }
        if let Some(ended) = ended {
            // The runtime's task fires its timers and ends its outputs here at the first report
            // and keeps serving state until released.
            if ended.end_outputs {
                self.end_outputs(id);
            }
            self.channels.push(
                (Node::Task(id), Node::Coordinator, Kind::Control),
                Msg::Ack(ended.epoch, TaskAck::InputsEnded),
            );
        }
        self.koala_check_exit(id);
        self.check_claims(id)
    }

    /// A Koala task exits as the runtime's does, after every event it handles
    /// ([`TaskLife::may_exit`]): released and its inputs ended.
    pub(crate) fn koala_check_exit(&mut self, id: TaskId) {
        if let Some(t) = self.tasks.get_mut(&id)
            && matches!(t.core, Core::Koala(_))
            && !t.gone
            && t.life.may_exit()
        {
            t.gone = true;
            self.stats.exited += 1;
        }
    }
}

/// A simulated task's store as the core's local-first lookups see it.
struct SimLocal<'a> {
    store: &'a BTreeMap<Vec<u8>, u64>,
    probes: u64,
}

impl LocalKeys for SimLocal<'_> {
    fn contains_many(&mut self, keys: &[&[u8]]) -> Vec<bool> {
        self.probes += keys.len() as u64;
        keys.iter().map(|k| self.store.contains_key(*k)).collect()
    }
}
