//! The consumer of the reconfigured operator in the simulated job: the tasks of the operator
//! the target operator feeds ([`SimConfig::consumers`](super::SimConfig::consumers)), and what
//! the target tasks send them. Every record a target task processes and every timer it fires is
//! one output, sent on a data channel (`Kind::Data(0)`) to the consumer task its key maps to; a
//! target task ends its outputs (end of stream to every consumer) where the runtime's does. A
//! consumer follows the runtime's rules: at a `Prepare` its worker tells it the created tasks'
//! channels (`crate::plan::consumer_inputs`, `AddInputs`) and it acks `Prepared`; once every
//! channel it knows ended it finishes, the coordinator hears it (`Engine::task_finished`), and
//! commands to it are dropped from then on — also an `AddInputs` that comes after it finished,
//! which it never answers (a consumer that finishes early).
//!
//! Checks: every output reaches its consumer exactly once (none lost to a consumer that
//! finished, none after the end of stream of its channel), no data comes on a channel the
//! consumer was not told about, a target task emits nothing after it ended its outputs, and at
//! the end every consumer finished.

use std::collections::{BTreeMap, BTreeSet};

use koala_types::{ChannelMessage, Epoch, InputChannel, TaskId};

use super::Fault;
use super::scenario::{CONSUMER, TARGET};
use super::world::{Kind, Msg, Node, World};
use crate::control::{ReconfigPlan, TaskAck};
use crate::koala::key_hash;
use crate::plan::{Edge, consumer_inputs};

/// One consumer task.
struct SimConsumer {
    /// Channels it was told about (at deployment or by `AddInputs`), ended or not.
    known: BTreeSet<InputChannel>,
    /// Known channels whose end of stream has not come.
    open: BTreeSet<InputChannel>,
    /// Every input ended: it finished and takes no command.
    finished: bool,
}

/// The consumer operator's tasks and the target tasks' outputs to them.
#[derive(Default)]
pub(crate) struct Downstream {
    consumers: Vec<SimConsumer>,
    /// Outputs of the current step not sent yet, per (target task, consumer index): sent as one
    /// batch per channel after the step, as a task's output buffer is flushed.
    outbox: BTreeMap<(TaskId, usize), Vec<u64>>,
    /// Target tasks that ended their outputs.
    ended: BTreeSet<TaskId>,
    /// With [`SimConfig::sources_end_early`](super::SimConfig::sources_end_early): upstreams
    /// that ended before the requests came, not reported to the coordinator yet.
    pub(crate) late_finished: Vec<TaskId>,
    /// Whether each output emitted (its id is its index) reached a consumer.
    received: Vec<bool>,
}

impl Downstream {
    /// `n` consumer tasks, each fed by the target tasks `targets`.
    pub(crate) fn new(n: usize, targets: &BTreeSet<TaskId>) -> Self {
        let known: BTreeSet<InputChannel> =
            targets.iter().map(|&from| InputChannel { input: 0, from }).collect();
        let consumers = (0..n)
            .map(|_| SimConsumer { known: known.clone(), open: known.clone(), finished: false })
            .collect();
        Self { consumers, ..Self::default() }
    }

    /// The consumer tasks' ids.
    pub(crate) fn ids(n: usize) -> impl Iterator<Item = TaskId> {
        (0..n as u32).map(|i| TaskId::new(CONSUMER, i))
    }
}

impl World {
    /// Target task `me` emits one output (a processed record or a fired timer of `key`).
    pub(crate) fn output(&mut self, me: TaskId, key: &[u8]) -> Result<(), String> {
        let n = self.downstream.consumers.len();
        if n == 0 {
            return Ok(());
        }
        if self.downstream.ended.contains(&me) {
            return Err(format!(
                "consumer: {me} emits an output of {} after it ended its outputs",
                String::from_utf8_lossy(key)
            ));
        }
        let id = self.downstream.received.len() as u64;
        self.downstream.received.push(false);
        let to = (key_hash(key) % n as u64) as usize;
        // The consumer needs only the output's id.
        self.downstream.outbox.entry((me, to)).or_default().push(id);
        Ok(())
    }

    /// Sends what the target tasks output in this step, a batch per channel.
    ///
    /// The consumer takes each batch at once, in the step that produced it: what it does with
    /// outputs changes nothing any protocol sees, so only its ends and `AddInputs` need steps of
    /// their own to race (and the run's steps stay near those without consumers). The checks
    /// are the same as for a batch that waited: a channel the consumer knows, not ended, at a
    /// consumer that did not finish (an end the task sent in this step is still queued).
    pub(crate) fn flush_outputs(&mut self) -> Result<(), String> {
        for ((from, to), outputs) in std::mem::take(&mut self.downstream.outbox) {
            self.take_outputs(from, TaskId::new(CONSUMER, to as u32), outputs)?;
        }
        Ok(())
    }

    /// Consumer task `id` takes a batch of outputs (their ids) from target task `from`.
    fn take_outputs(&mut self, from: TaskId, id: TaskId, outputs: Vec<u64>) -> Result<(), String> {
        let c = self.downstream.consumers.get(id.index as usize).ok_or("outputs to unknown consumer")?;
        let channel = InputChannel { input: 0, from };
        if c.finished {
            return Err(format!("consumer: {from} sends outputs to {id}, which finished: they are lost"));
        }
        if !c.known.contains(&channel) {
            return Err(format!("consumer: {id} gets outputs on {channel:?}, which it was not told about"));
        }
        if !c.open.contains(&channel) {
            return Err(format!("consumer: {id} gets outputs on {channel:?} after its end of stream"));
        }
        for out in outputs {
            match self.downstream.received.get_mut(out as usize) {
                Some(seen @ false) => *seen = true,
                Some(true) => return Err(format!("consumer: output #{out} reached {id} twice")),
                None => return Err(format!("consumer: {id} gets output #{out}, never emitted")),
            }
        }
        Ok(())
    }

    /// Target task `me` ends its outputs (once): its end of stream to every consumer task, behind
    /// what it output (taken at the end of this step, `World::flush_outputs`).
    pub(crate) fn end_outputs(&mut self, me: TaskId) {
        if !self.downstream.ended.insert(me) || self.downstream.consumers.is_empty() {
            return;
        }
        for to in Downstream::ids(self.downstream.consumers.len()) {
            let key = (Node::Task(me), Node::Consumer(to), Kind::Data(0));
            self.channels.push(key, Msg::Data(ChannelMessage::EndOfStream));
        }
    }

    /// With [`SimConfig::sources_end_early`](super::SimConfig::sources_end_early): once the first
    /// target task ended its outputs, every reconfiguration is requested and the coordinator hears
    /// of the upstreams' ends only then (a worker reports a finished task late), so the first
    /// `Prepare` races the consumers' end.
    pub(crate) fn request_late(&mut self) -> Result<(), String> {
        if !self.cfg.sources_end_early
            || self.next_request == self.targets.len()
            || self.downstream.ended.is_empty()
        {
            return Ok(());
        }
        self.pending.extend(self.targets[self.next_request..].iter().cloned());
        self.next_request = self.targets.len();
        self.start_next()?;
        for id in std::mem::take(&mut self.downstream.late_finished) {
            self.channels.push((Node::Upstream(id), Node::Coordinator, Kind::Control), Msg::Finished(id));
        }
        Ok(())
    }

    /// At a `Prepare`, as the workers do: every consumer task the rule names is told the created
    /// tasks' channels (`outputs`: the operator's output edges, the consumers' input `i` the
    /// `i`-th).
    pub(crate) fn prepare_consumers(&mut self, plan: &ReconfigPlan, outputs: &[Edge]) {
        for (input, edge) in outputs.iter().enumerate() {
            for to in Downstream::ids(self.downstream.consumers.len()) {
                let Some(mut channels) = consumer_inputs(plan, edge, input, to) else { continue };
                if self.cfg.fault == Some(Fault::ConsumerMissesCreatedInputs) {
                    channels.clear();
                }
                self.control(Node::Consumer(to), Msg::AddInputs { epoch: plan.epoch, channels });
            }
        }
    }

    /// A message reaches consumer task `id`.
    pub(crate) fn deliver_to_consumer(
        &mut self,
        from: Node,
        id: TaskId,
        kind: Kind,
        msg: Msg,
    ) -> Result<(), String> {
        let c = self.downstream.consumers.get_mut(id.index as usize).ok_or("message to unknown consumer")?;
        match (msg, from, kind) {
            (Msg::AddInputs { epoch, channels }, Node::Coordinator, _) => {
                if c.finished {
                    // Its worker drops commands to a finished task: the engine hears it finished.
                    self.stats.prepares_after_finish += 1;
                    return Ok(());
                }
                c.known.extend(channels.iter().copied());
                c.open.extend(channels);
                self.ack_prepared(id, epoch);
                Ok(())
            }
            (Msg::Data(message), Node::Task(sender), Kind::Data(input)) => {
                let channel = InputChannel { input, from: sender };
                if c.finished {
                    self.stats.after_exit += 1;
                    return Ok(());
                }
                if !c.known.contains(&channel) {
                    return Err(format!(
                        "consumer: {id} gets data on {channel:?}, which it was not told about"
                    ));
                }
                if !c.open.contains(&channel) {
                    return Err(format!("consumer: {id} gets data on {channel:?} after its end of stream"));
                }
                match message {
                    ChannelMessage::EndOfStream => {
                        c.open.remove(&channel);
                        if c.open.is_empty() {
                            c.finished = true;
                            self.stats.consumers_finished += 1;
                            // As a worker reports its finished task; the broken variant does not.
                            if self.cfg.fault != Some(Fault::ConsumerFinishUnreported) {
                                let key = (Node::Consumer(id), Node::Coordinator, Kind::Control);
                                self.channels.push(key, Msg::Finished(id));
                            }
                        }
                        Ok(())
                    }
                    ChannelMessage::Watermark(_) | ChannelMessage::Marker(_) => Ok(()),
                    other => Err(format!("consumer: {id} gets {other:?}, which the simulator does not send")),
                }
            }
            (m, ..) => Err(format!("unroutable message {m:?} to consumer {id}")),
        }
    }

    fn ack_prepared(&mut self, id: TaskId, epoch: Epoch) {
        let key = (Node::Consumer(id), Node::Coordinator, Kind::Control);
        self.channels.push(key, Msg::Ack(epoch, TaskAck::Prepared));
    }

    /// At the end: every output reached a consumer and every consumer finished.
    pub(crate) fn check_consumers_end(&self) -> Result<(), String> {
        let d = &self.downstream;
        let lost: Vec<usize> = (0..d.received.len()).filter(|&o| !d.received[o]).collect();
        if !lost.is_empty() {
            return Err(format!(
                "consumer: {} of {} outputs never reached a consumer (the first: #{})",
                lost.len(),
                d.received.len(),
                lost[0]
            ));
        }
        for (id, c) in Downstream::ids(d.consumers.len()).zip(&d.consumers) {
            if !c.finished {
                let open: Vec<String> = c.open.iter().map(|ch| ch.from.to_string()).collect();
                let ended: Vec<String> = d.ended.iter().map(|t| t.to_string()).collect();
                return Err(format!(
                    "consumer: {id} never finished, waiting for the end of {open:?} (ended outputs: {ended:?})"
                ));
            }
        }
        self.check_targets_ended()
    }

    /// Every target task that exists ended its outputs.
    fn check_targets_ended(&self) -> Result<(), String> {
        match self.tasks.keys().find(|t| t.operator == TARGET && !self.downstream.ended.contains(t)) {
            Some(t) if !self.downstream.consumers.is_empty() => {
                Err(format!("consumer: {t} never ended its outputs"))
            }
            _ => Ok(()),
        }
    }
}
