//! How the simulated runtime runs stop-and-restart and Remote target tasks (docs/testing.md §2):
//! it delivers their events to the core and its watermark aligner, and executes their actions —
//! moved state and timers on the peer lane, Remote's write-back to the shared store — with the
//! same checks as every protocol (single owner, one live copy, timers).

use std::collections::BTreeSet;

use koala_types::{BucketId, ChannelMessage, Epoch, InputChannel, TaskId, Timestamp, bucket_of};

use super::Fault;
use super::world::{Core, Kind, Msg, Node, World};
use crate::control::Protocol;
use crate::koala::TaskAck;
use crate::stop_restart::{TargetAction, TargetEvent};

impl World {
    /// A message reaches a stop-and-restart target task: records are processed at once (the
    /// routing sends a bucket's records to its owner only), watermarks go through the task's
    /// aligner, markers, ends and state transfer through its core.
    pub(crate) fn deliver_stop_and_restart(
        &mut self,
        id: TaskId,
        src: Option<TaskId>,
        channel: Option<InputChannel>,
        msg: Msg,
    ) -> Result<(), String> {
        let event = match (msg, channel, src) {
            (Msg::Data(ChannelMessage::Batch(records)), Some(channel), _) => {
                for r in records {
                    self.process(id, channel.input, &r)?;
                }
                return Ok(());
            }
            (Msg::Data(ChannelMessage::Watermark(time)), Some(channel), _) => {
                let advanced = match self.tasks.get_mut(&id).map(|t| &mut t.core) {
                    Some(Core::StopAndRestart(_, aligner)) => aligner.update(&channel, time),
                    _ => None,
                };
                return self.sr_watermark(id, advanced);
            }
            (Msg::Data(ChannelMessage::Marker(epoch)), Some(channel), _) => {
                TargetEvent::Marker { channel, epoch }
            }
            (Msg::Data(ChannelMessage::EndOfStream), Some(channel), _) => return self.sr_end(id, &[channel]),
            (Msg::EndedUpstream(from), _, None) => {
                // Every channel of the finished upstream ends here (two for a self-join).
                let channels = match self.tasks.get(&id).map(|t| &t.core) {
                    Some(Core::StopAndRestart(_, aligner)) => {
                        aligner.channels().filter(|c| c.from == from).collect()
                    }
                    _ => Vec::new(),
                };
                return self.sr_end(id, &channels);
            }
            (Msg::State { epoch, entries, timers }, _, Some(from)) => {
                // Under remote only timers travel (`remote_flush` sends no entries).
                let event = if self.cfg.protocol == Protocol::Remote {
                    TargetEvent::TimersChunk { from, epoch }
                } else {
                    TargetEvent::StateChunk { from, epoch }
                };
                self.sr_event(id, event)?;
                return self.sr_install(id, from, entries, timers);
            }
            (Msg::StateEnd(epoch), _, Some(from)) => {
                // The sender let go of the buckets it moves here: this task owns them now.
                let moved =
                    self.engine.running().and_then(|p| p.moves.get(&(from, id)).cloned()).unwrap_or_default();
                for b in moved {
                    let slot = self.claims.get_mut(usize::from(b)).ok_or("bucket out of range")?;
                    if slot.is_some() {
                        return Err(format!("single owner: {id} takes bucket {b} claimed by {slot:?}"));
                    }
                    *slot = Some(id);
                }
                TargetEvent::StateEnd { from, epoch }
            }
            (Msg::Drain(epoch), _, None) => TargetEvent::Drain { epoch },
            (Msg::Prepare(plan), _, None) => {
                if let Some(t) = self.tasks.get_mut(&id) {
                    t.life.prepared(plan.epoch, false);
                }
                let inputs = match self.tasks.get(&id).map(|t| &t.core) {
                    Some(Core::StopAndRestart(_, aligner)) => aligner.channels().collect(),
                    _ => Vec::new(),
                };
                TargetEvent::Prepare { plan, inputs }
            }
            (m, ..) => return Err(format!("unroutable message {m:?} to stop-and-restart task {id}")),
        };
        self.sr_event(id, event)
    }

    /// After every event a stop-and-restart task handled, the runtime's rules ([`crate::koala::TaskLife`]):
    /// once every input ended and no part of a reconfiguration runs it reports `InputsEnded`;
    /// once also released it exits, and the coordinator hears that it finished.
    pub(crate) fn sr_check_exit(&mut self, id: TaskId) {
        let Some(t) = self.tasks.get_mut(&id) else { return };
        let Core::StopAndRestart(core, aligner) = &t.core else { return };
        let busy = core.busy();
        if let Some(epoch) = t.life.check_target_inputs_ended(aligner.live_channels(), busy) {
            // As the runtime's task: its outputs end, then it reports.
            self.end_outputs(id);
            let ack = Msg::Ack(epoch, TaskAck::InputsEnded);
            self.channels.push((Node::Task(id), Node::Coordinator, Kind::Control), ack);
        }
        let Some(t) = self.tasks.get_mut(&id) else { return };
        let broken = self.cfg.fault == Some(Fault::ExitWithoutRelease) && t.life.inputs_ended() && !busy;
        if !t.gone && (t.life.target_may_exit(busy) || broken) {
            t.gone = true;
            self.channels.push((Node::Task(id), Node::Coordinator, Kind::Control), Msg::Finished(id));
        }
    }

    /// Data channels of a stop-and-restart task end: each leaves its aligner (the event time
    /// may advance) and counts as its marker.
    fn sr_end(&mut self, id: TaskId, channels: &[InputChannel]) -> Result<(), String> {
        for channel in channels {
            let (open, advanced) = match self.tasks.get_mut(&id).map(|t| &mut t.core) {
                Some(Core::StopAndRestart(_, aligner)) => {
                    let open = aligner.channels().any(|c| c == *channel);
                    (open, if open { aligner.close(channel) } else { None })
                }
                _ => (false, None),
            };
            if open {
                self.sr_watermark(id, advanced)?;
                self.sr_event(id, TargetEvent::EndOfStream { channel: *channel })?;
            }
        }
        Ok(())
    }

    /// A stop-and-restart task's event time advanced: every timer at or below it fires.
    fn sr_watermark(&mut self, id: TaskId, advanced: Option<Timestamp>) -> Result<(), String> {
        match advanced {
            Some(t) => self.exec_task(id, crate::koala::TaskAction::EmitWatermark(t)),
            None => Ok(()),
        }
    }

    /// Moved state arrives: one live copy, and no timer behind the receiver's event time.
    fn sr_install(
        &mut self,
        id: TaskId,
        from: TaskId,
        entries: Vec<(Vec<u8>, u64)>,
        timers: Vec<(Timestamp, Vec<u8>)>,
    ) -> Result<(), String> {
        for (key, count) in entries {
            self.install(id, key, count)?;
        }
        self.install_timers(from, id, timers)
    }

    /// Feeds a stop-and-restart task's core and executes its actions.
    fn sr_event(&mut self, id: TaskId, event: TargetEvent<InputChannel>) -> Result<(), String> {
        let actions = match self.tasks.get_mut(&id).map(|t| &mut t.core) {
            Some(Core::StopAndRestart(core, _)) => core.on(event),
            _ => return Err(format!("{id} is not a stop-and-restart task")),
        };
        for a in actions {
            match a {
                TargetAction::Ack { epoch, ack } => self
                    .channels
                    .push((Node::Task(id), Node::Coordinator, Kind::Control), Msg::Ack(epoch, ack)),
                TargetAction::SendState { epoch, moves } => self.sr_send(id, epoch, moves)?,
                TargetAction::Flush { epoch, moves } => self.remote_flush(id, epoch, moves)?,
                TargetAction::Error(e) => return Err(format!("protocol error at {id}: {e}")),
            }
        }
        Ok(())
    }

    /// Every marker arrived: the moved buckets' state and timers go to their new owners and are
    /// gone here; then `StateSent`.
    fn sr_send(
        &mut self,
        id: TaskId,
        epoch: Epoch,
        moves: Vec<(TaskId, Vec<BucketId>)>,
    ) -> Result<(), String> {
        let nb = self.cfg.num_buckets;
        let mut entries_sent = 0u64;
        for (to, buckets) in moves {
            let wanted: BTreeSet<BucketId> = buckets.iter().copied().collect();
            self.let_go(id, &buckets, "sends")?;
            let task = self.tasks.get_mut(&id).ok_or("send from unknown task")?;
            let keys: Vec<Vec<u8>> =
                task.store.keys().filter(|k| wanted.contains(&bucket_of(k, nb))).cloned().collect();
            let mut entries = Vec::new();
            for key in keys {
                if let Some(v) = task.store.remove(&key) {
                    self.holder.remove(&key);
                    entries.push((key, v));
                }
            }
            let (moved, kept): (BTreeSet<_>, BTreeSet<_>) = std::mem::take(&mut task.timers)
                .into_iter()
                .partition(|(_, k)| wanted.contains(&bucket_of(k, nb)));
            task.timers = kept;
            entries_sent += entries.len() as u64;
            let msg = Msg::State { epoch, entries, timers: moved.into_iter().collect() };
            self.channels.push((Node::Task(id), Node::Task(to), Kind::Peer), msg);
            self.channels.push((Node::Task(id), Node::Task(to), Kind::Peer), Msg::StateEnd(epoch));
        }
        let ack = TaskAck::StateSent { bytes: entries_sent * 8, entries: entries_sent };
        self.channels.push((Node::Task(id), Node::Coordinator, Kind::Control), Msg::Ack(epoch, ack));
        Ok(())
    }

    /// `id` gives up its claim on `buckets` (it `verb` them); single owner: it must hold each.
    fn let_go(&mut self, id: TaskId, buckets: &[BucketId], verb: &str) -> Result<(), String> {
        for &b in buckets {
            let slot = self.claims.get_mut(usize::from(b)).ok_or("bucket out of range")?;
            if *slot != Some(id) {
                return Err(format!("single owner: {id} {verb} bucket {b} claimed by {slot:?}"));
            }
            *slot = None;
        }
        Ok(())
    }

    /// Remote: every marker arrived; the old owner writes back what it buffered for the moved
    /// buckets to the shared store (a task's `store` is its write-back buffer under remote),
    /// sends their timers and `StateEnd`; then `StateSent` with nothing moved. The broken
    /// variant sends `StateEnd` with the buffer unwritten.
    fn remote_flush(
        &mut self,
        id: TaskId,
        epoch: Epoch,
        moves: Vec<(TaskId, Vec<BucketId>)>,
    ) -> Result<(), String> {
        let nb = self.cfg.num_buckets;
        for (to, buckets) in moves {
            let wanted: BTreeSet<BucketId> = buckets.iter().copied().collect();
            self.let_go(id, &buckets, "flushes")?;
            let task = self.tasks.get_mut(&id).ok_or("flush from unknown task")?;
            if self.cfg.fault != Some(Fault::FlushAfterStateEnd) {
                let keys: Vec<Vec<u8>> =
                    task.store.keys().filter(|k| wanted.contains(&bucket_of(k, nb))).cloned().collect();
                for key in keys {
                    if let Some(v) = task.store.remove(&key) {
                        self.holder.remove(&key);
                        self.shared.insert(key, v);
                        self.stats.flushed_keys += 1;
                    }
                }
            }
            let (moved, kept): (BTreeSet<_>, BTreeSet<_>) = std::mem::take(&mut task.timers)
                .into_iter()
                .partition(|(_, k)| wanted.contains(&bucket_of(k, nb)));
            task.timers = kept;
            let msg = Msg::State { epoch, entries: Vec::new(), timers: moved.into_iter().collect() };
            self.channels.push((Node::Task(id), Node::Task(to), Kind::Peer), msg);
            self.channels.push((Node::Task(id), Node::Task(to), Kind::Peer), Msg::StateEnd(epoch));
        }
        let ack = TaskAck::StateSent { bytes: 0, entries: 0 };
        self.channels.push((Node::Task(id), Node::Coordinator, Kind::Control), Msg::Ack(epoch, ack));
        Ok(())
    }

    /// Remote: a task's write-back buffer overflows; everything in it goes to the shared store.
    pub(crate) fn remote_evict(&mut self, id: TaskId) {
        if let Some(task) = self.tasks.get_mut(&id) {
            for (key, v) in std::mem::take(&mut task.store) {
                self.holder.remove(&key);
                self.shared.insert(key, v);
            }
        }
    }
}
