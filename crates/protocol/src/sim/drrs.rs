//! How the simulated runtime runs DRRS tasks (docs/testing.md §2): it delivers their events,
//! executes their actions — set-aside timers, bucket pushes on the state lane — and
//! the coordinator's subscale messages, with the same checks as every protocol (single owner,
//! one live copy, per-key order, watermarks, timers).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use koala_types::{BucketId, ChannelMessage, Epoch, InputChannel, TaskId, bucket_of};

use super::scenario::TARGET;
use super::world::{Core, Kind, Msg, Node, World};
use crate::control::CoordinatorMessage;
use crate::drrs::{DrrsCommand, DrrsControl, LoopHolds, TaskAction, TaskEvent};
use crate::relay::{Relayed, relay};

impl World {
    /// A message reaches a DRRS target task; afterwards it exits if the runtime's would.
    pub(crate) fn deliver_drrs(
        &mut self,
        id: TaskId,
        src: Option<TaskId>,
        channel: Option<InputChannel>,
        msg: Msg,
    ) -> Result<(), String> {
        self.deliver_drrs_event(id, src, channel, msg)?;
        self.drrs_check_exit(id);
        Ok(())
    }

    /// After every event a DRRS task handled, the runtime's rules ([`crate::drrs::DrrsLife`]):
    /// it ends its outputs and reports `InputsEnded`, and exits, when the runtime's would (a
    /// cancelled task that exits without the report ends its outputs as it exits). The loop holds
    /// nothing outside the core here (a refused record stays in its channel, a push is on the
    /// state lane at once). The coordinator hears that it finished, as from a worker.
    pub(crate) fn drrs_check_exit(&mut self, id: TaskId) {
        let Some(t) = self.tasks.get_mut(&id) else { return };
        let Core::Drrs(core) = &t.core else { return };
        t.drrs.check_taking_part(core);
        let ended = t.drrs.check_inputs_ended(core, LoopHolds::default());
        let exits = !t.gone && t.drrs.may_exit(core, LoopHolds::default());
        t.gone |= exits;
        if let Some(epoch) = ended {
            self.end_outputs(id);
            let ack = Msg::Ack(epoch, crate::control::TaskAck::InputsEnded);
            self.channels.push((Node::Task(id), Node::Coordinator, Kind::Control), ack);
        }
        if exits {
            self.end_outputs(id);
            self.channels.push((Node::Task(id), Node::Coordinator, Kind::Control), Msg::Finished(id));
        }
    }

    fn deliver_drrs_event(
        &mut self,
        id: TaskId,
        src: Option<TaskId>,
        channel: Option<InputChannel>,
        msg: Msg,
    ) -> Result<(), String> {
        let event = match (msg, channel, src) {
            (Msg::Data(ChannelMessage::Batch(records)), Some(channel), _) => {
                TaskEvent::Records { channel, records }
            }
            (Msg::Data(ChannelMessage::Watermark(time)), Some(channel), _) => {
                TaskEvent::Watermark { channel, time }
            }
            (Msg::Data(ChannelMessage::Marker(epoch)), Some(channel), _) => {
                TaskEvent::Marker { channel, epoch }
            }
            (Msg::Data(ChannelMessage::EndOfStream), Some(channel), _) => TaskEvent::EndOfStream { channel },
            (Msg::DrrsPeer(message), _, Some(from)) => TaskEvent::Peer { from, message },
            (Msg::Pushed { to, bucket }, _, Some(from)) if from == id => TaskEvent::Pushed { to, bucket },
            (Msg::Bucket { epoch, bucket, entries, timers }, _, Some(from)) => {
                // The state and timers are installed before the core hears of them.
                for (key, count) in entries {
                    self.install(id, key, count)?;
                }
                self.install_timers(from, id, timers)?;
                let slot = self.claims.get_mut(usize::from(bucket)).ok_or("bucket out of range")?;
                if slot.is_some() {
                    return Err(format!("single owner: {id} takes bucket {bucket} claimed by {slot:?}"));
                }
                *slot = Some(id);
                TaskEvent::BucketArrived { from, epoch, bucket }
            }
            // A new task's core learns its channels now (`World::broadcast` deployed it with them).
            (Msg::DrrsStart(sub), _, None) => {
                if let Some(t) = self.tasks.get_mut(&id)
                    && let Core::Drrs(core) = &mut t.core
                {
                    t.drrs.begin(core, &sub);
                }
                TaskEvent::Start(sub)
            }
            (Msg::Prepare(plan), _, None) => {
                if let Some(t) = self.tasks.get_mut(&id) {
                    t.drrs.prepared(&plan, id);
                }
                self.channels.push(
                    (Node::Task(id), Node::Coordinator, Kind::Control),
                    Msg::Ack(plan.epoch, crate::control::TaskAck::Prepared),
                );
                return Ok(());
            }
            (Msg::EndedUpstream(u), _, None) => {
                let open = match self.tasks.get_mut(&id) {
                    Some(t) => match &t.core {
                        Core::Drrs(core) => t.drrs.upstream_ended(core, u),
                        _ => Vec::new(),
                    },
                    None => Vec::new(),
                };
                for channel in open {
                    self.feed_drrs(id, TaskEvent::EndOfStream { channel })?;
                }
                return Ok(());
            }
            (m, ..) => return Err(format!("unroutable message {m:?} to DRRS task {id}")),
        };
        self.feed_drrs(id, event)
    }

    /// Feeds an event to a DRRS task core and executes its actions.
    fn feed_drrs(&mut self, id: TaskId, event: TaskEvent) -> Result<(), String> {
        let Some(Core::Drrs(core)) = self.tasks.get_mut(&id).map(|t| &mut t.core) else {
            return Err(format!("no DRRS task {id}"));
        };
        let (before, was_refusing) = (core.waited_records(), core.is_paused());
        let actions = core.on(event);
        self.stats.waited += core.waited_records() - before;
        if core.is_paused() && !was_refusing {
            self.stats.pauses += 1;
        }
        // The bounded wait buffer: every record the task holds, forwarded ones included.
        let (held, bound) = (core.queued_records(), core.hold_bound());
        self.stats.max_queued = self.stats.max_queued.max(held);
        if held > bound {
            return Err(format!(
                "bounded wait buffer: {id} holds {held} records, more than its bound {bound}"
            ));
        }
        self.stats.max_running_subscales = self.stats.max_running_subscales.max(core.running_subscales());
        self.stats.max_moving_subscales = self.stats.max_moving_subscales.max(core.moving_subscales());
        for a in actions {
            self.exec_drrs(id, a)?;
        }
        self.check_claims(id)
    }

    fn exec_drrs(&mut self, me: TaskId, action: TaskAction) -> Result<(), String> {
        let nb = self.cfg.num_buckets;
        match action {
            TaskAction::Process { input, records } => {
                for r in &records {
                    self.process(me, input, r)?;
                }
            }
            TaskAction::SendToPeer { to, message } => {
                self.channels.push((Node::Task(me), Node::Task(to), Kind::Peer), Msg::DrrsPeer(message));
            }
            TaskAction::DetachTimers { buckets, up_to } => {
                if let Some(up_to) = up_to {
                    self.exec_task(
                        me,
                        crate::koala::TaskAction::FireTimers { buckets: buckets.clone(), up_to },
                    )?;
                }
                let task = self.tasks.get_mut(&me).ok_or("timers of unknown task")?;
                let (moved, kept): (BTreeSet<_>, BTreeSet<_>) = std::mem::take(&mut task.timers)
                    .into_iter()
                    .partition(|(_, k)| buckets.contains(&bucket_of(k, nb)));
                task.timers = kept;
                task.aside.extend(moved);
            }
            TaskAction::PushBucket { to, epoch, bucket } => self.push_bucket(me, to, epoch, bucket)?,
            TaskAction::EmitWatermark(t) => self.exec_task(me, crate::koala::TaskAction::EmitWatermark(t))?,
            TaskAction::Ack { epoch, ack } => {
                if ack == crate::control::TaskAck::Done {
                    self.stats.subscale_acks += 1;
                }
                self.channels.push((Node::Task(me), Node::Coordinator, Kind::Control), Msg::Ack(epoch, ack));
            }
            TaskAction::Error(e) => return Err(format!("protocol error at {me}: {e}")),
        }
        Ok(())
    }

    /// A sender pushes a whole bucket: its state and set-aside timers leave the store, travel on
    /// the state lane, and the sender hears that the push went out at a random later step.
    fn push_bucket(&mut self, me: TaskId, to: TaskId, epoch: Epoch, bucket: BucketId) -> Result<(), String> {
        let nb = self.cfg.num_buckets;
        let slot = self.claims.get_mut(usize::from(bucket)).ok_or("bucket out of range")?;
        if *slot != Some(me) {
            return Err(format!("single owner: {me} pushes bucket {bucket} claimed by {slot:?}"));
        }
        *slot = None;
        let task = self.tasks.get_mut(&me).ok_or("push from unknown task")?;
        let keys: Vec<Vec<u8>> = task.store.keys().filter(|k| bucket_of(k, nb) == bucket).cloned().collect();
        let mut entries = Vec::new();
        for key in keys {
            if let Some(v) = task.store.remove(&key) {
                self.holder.remove(&key);
                entries.push((key, v));
            }
        }
        let (timers, kept): (BTreeSet<_>, BTreeSet<_>) =
            std::mem::take(&mut task.aside).into_iter().partition(|(_, k)| bucket_of(k, nb) == bucket);
        task.aside = kept;
        if task.timers.iter().any(|(_, k)| bucket_of(k, nb) == bucket) {
            return Err(format!("timers: {me} pushes bucket {bucket} but kept some of its timers live"));
        }
        self.stats.pushed_buckets += 1;
        let msg = Msg::Bucket { epoch, bucket, entries, timers: timers.into_iter().collect() };
        self.channels.push((Node::Task(me), Node::Task(to), Kind::State), msg);
        self.channels.push((Node::Task(me), Node::Task(me), Kind::Control), Msg::Pushed { to, bucket });
        Ok(())
    }

    /// The DRRS coordinator's messages reach the tasks and upstreams the workers' rule
    /// (`crate::relay`) gives them to, as in the runtime.
    pub(crate) fn broadcast_drrs(&mut self, msg: CoordinatorMessage) -> Result<(), String> {
        let relayed = relay(&msg, None);
        let CoordinatorMessage::Drrs(control) = msg else {
            return Err(format!("{msg:?} is no DRRS message"));
        };
        match *control {
            DrrsControl::Begin { subscale, .. } => {
                let subscale = Arc::new(*subscale);
                for (to, r) in relayed {
                    if r != Relayed::DrrsBegin {
                        return Err(format!("a DRRS begin relayed as {r:?} to {to}"));
                    }
                    self.channels.push(
                        (Node::Coordinator, Node::Task(to), Kind::Control),
                        Msg::DrrsStart(subscale.clone()),
                    );
                }
            }
            switch @ DrrsControl::Switch { operator, .. } => {
                if operator != TARGET {
                    return Err(format!(
                        "a DRRS switch of operator {operator}, which the simulator does not run"
                    ));
                }
                // What a worker tells its upstream tasks: the DRRS core's own conversion.
                let at = switch.plan_epoch();
                let plan = self
                    .plans
                    .get(&at)
                    .cloned()
                    .ok_or_else(|| format!("a DRRS switch of unknown epoch {at}"))?;
                let DrrsCommand::Switch(switch) = switch.into_command(&mut HashMap::from([(at, plan)]))?
                else {
                    return Err("a DRRS switch read as another command".into());
                };
                for (up, r) in relayed {
                    if r != Relayed::DrrsSwitch {
                        return Err(format!("a DRRS switch relayed as {r:?} to {up}"));
                    }
                    self.channels.push(
                        (Node::Coordinator, Node::Upstream(up), Kind::Control),
                        Msg::Switch(switch.clone()),
                    );
                }
            }
        }
        Ok(())
    }
}
