//! What a Koala or DRRS task took off its data queue (and a Koala task off its peer lane) but its
//! core did not take yet (docs/architecture.md §4, bounded Koala inbox; docs/protocols.md §11,
//! DRRS's bounded wait buffer). The core says how many records of a batch it takes
//! (`KoalaTask::data_room`, `KoalaTask::peer_room`, `DrrsTask::data_room`): with those answers
//! it never holds more than its bound, and nothing deadlocks (the simulator checks both with
//! upstreams that block on full channels, as these do). The rest waits here:
//!
//! - a data channel whose head the core refused keeps that message (or the rest of the batch) and
//!   every later one of the channel, in order, and its senders wait at the queue's gate
//!   ([`DataReceiver::hold_back`]) until it is taken, so what waits here is what was already in
//!   the queue (at most `channel_capacity` messages, plus one per sender that had its turn);
//!   the task's other channels go on;
//! - the rest of a batch forwarded on the peer lane waits alone: until it is taken the task reads
//!   neither its peer lane nor its data queue (fetch answers, which free room, keep flowing).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use koala_protocol::drrs::DrrsTask;
use koala_protocol::koala::{KoalaTask, PeerMessage};
use koala_types::{ChannelMessage, InputChannel, Record, TaskId};

use crate::queue::DataReceiver;

/// A protocol core that says how much of a data batch it takes now.
pub(super) trait DataRoom {
    /// How many of `records`, from the front, the core takes now from `channel`.
    fn data_room(&self, channel: InputChannel, records: &[Record]) -> usize;
    /// Whether the core takes a watermark, marker or end of stream now.
    fn takes_data(&self) -> bool;
}

impl DataRoom for KoalaTask {
    fn data_room(&self, channel: InputChannel, records: &[Record]) -> usize {
        KoalaTask::data_room(self, channel, records)
    }

    fn takes_data(&self) -> bool {
        KoalaTask::takes_data(self)
    }
}

impl DataRoom for DrrsTask {
    fn data_room(&self, channel: InputChannel, records: &[Record]) -> usize {
        DrrsTask::data_room(self, channel, records)
    }

    /// A DRRS task refuses only records (a forward without credit, a record that would wait past
    /// its buffer); what follows them on their channel waits behind them.
    fn takes_data(&self) -> bool {
        true
    }
}

/// See the module docs.
#[derive(Default)]
pub(super) struct Intake {
    /// By data channel whose head the core refused: its messages in channel order.
    stashed: BTreeMap<InputChannel, VecDeque<ChannelMessage>>,
    /// The channels the gate holds back now.
    held_back: BTreeSet<InputChannel>,
    /// The rest of a forwarded batch, with its sender.
    peer: Option<(TaskId, PeerMessage)>,
}

impl Intake {
    /// The part of `message` from `channel` the core takes now; the rest waits here.
    pub(super) fn take(
        &mut self,
        core: &impl DataRoom,
        channel: InputChannel,
        message: ChannelMessage,
    ) -> Option<ChannelMessage> {
        if let Some(waiting) = self.stashed.get_mut(&channel) {
            waiting.push_back(message);
            return None;
        }
        let (now, rest) = split(core, channel, message);
        if let Some(rest) = rest {
            self.stashed.entry(channel).or_default().push_back(rest);
        }
        now
    }

    /// A message (or part of one) waiting here that the core takes now.
    pub(super) fn next(&mut self, core: &impl DataRoom) -> Option<(InputChannel, ChannelMessage)> {
        let channels: Vec<InputChannel> = self.stashed.keys().copied().collect();
        for channel in channels {
            let Some(waiting) = self.stashed.get_mut(&channel) else { continue };
            let Some(head) = waiting.pop_front() else { continue };
            let (now, rest) = split(core, channel, head);
            if let Some(rest) = rest {
                waiting.push_front(rest);
            }
            if waiting.is_empty() {
                self.stashed.remove(&channel);
            }
            if let Some(now) = now {
                return Some((channel, now));
            }
        }
        None
    }

    /// Holds back at the gate the channels that have messages waiting here, and only them.
    pub(super) fn hold_back(&mut self, inbox: &DataReceiver) {
        if self.stashed.len() != self.held_back.len() || !self.stashed.keys().eq(self.held_back.iter()) {
            self.held_back = self.stashed.keys().copied().collect();
            inbox.hold_back(&self.held_back);
        }
    }

    /// Whether data messages wait here.
    pub(super) fn has_data(&self) -> bool {
        !self.stashed.is_empty()
    }

    /// The part of a peer message the core takes now: all of it, unless it is a forwarded batch
    /// that does not fit; then the rest waits ([`Self::peer_waiting`]).
    pub(super) fn take_peer(
        &mut self,
        core: &KoalaTask,
        from: TaskId,
        message: PeerMessage,
    ) -> Option<PeerMessage> {
        debug_assert!(self.peer.is_none(), "the peer lane is read while a forwarded batch waits");
        let (now, rest) = split_peer(core, message);
        self.peer = rest.map(|rest| (from, rest));
        now
    }

    /// The waiting part of a forwarded batch, if the core takes some of it now.
    pub(super) fn next_peer(&mut self, core: &KoalaTask) -> Option<(TaskId, PeerMessage)> {
        let (from, message) = self.peer.take()?;
        let (now, rest) = split_peer(core, message);
        self.peer = rest.map(|rest| (from, rest));
        now.map(|now| (from, now))
    }

    /// Whether part of a forwarded batch waits: the task reads neither its peer lane nor data.
    pub(super) fn peer_waiting(&self) -> bool {
        self.peer.is_some()
    }
}

/// `message` split into what the core takes now and what waits.
fn split(
    core: &impl DataRoom,
    channel: InputChannel,
    message: ChannelMessage,
) -> (Option<ChannelMessage>, Option<ChannelMessage>) {
    match message {
        ChannelMessage::Batch(mut records) => {
            let room = core.data_room(channel, &records);
            if room >= records.len() {
                (Some(ChannelMessage::Batch(records)), None)
            } else if room == 0 {
                (None, Some(ChannelMessage::Batch(records)))
            } else {
                let rest = records.split_off(room);
                (Some(ChannelMessage::Batch(records)), Some(ChannelMessage::Batch(rest)))
            }
        }
        // A watermark, marker or end waits only behind records (FIFO) or for a full task.
        other if core.takes_data() => (Some(other), None),
        other => (None, Some(other)),
    }
}

fn split_peer(core: &KoalaTask, message: PeerMessage) -> (Option<PeerMessage>, Option<PeerMessage>) {
    match message {
        PeerMessage::Records { epoch, input, mut records } => {
            let room = core.peer_room(records.len());
            if room >= records.len() {
                (Some(PeerMessage::Records { epoch, input, records }), None)
            } else if room == 0 {
                (None, Some(PeerMessage::Records { epoch, input, records }))
            } else {
                let rest = records.split_off(room);
                (
                    Some(PeerMessage::Records { epoch, input, records }),
                    Some(PeerMessage::Records { epoch, input, records: rest }),
                )
            }
        }
        other => (Some(other), None),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use koala_protocol::koala::TaskConfig;
    use koala_types::{OperatorId, Record};

    use super::*;
    use crate::channel::TaskInput;
    use crate::queue::{SendFailed, data_queue};

    fn channel(from: u32) -> InputChannel {
        InputChannel { input: 0, from: TaskId::new(OperatorId(0), from) }
    }

    fn batch(times: std::ops::Range<u64>) -> ChannelMessage {
        ChannelMessage::Batch(
            times.map(|time| Record { key: vec![time as u8], value: vec![], time, due_ms: 0 }).collect(),
        )
    }

    fn times(message: &ChannelMessage) -> Vec<u64> {
        match message {
            ChannelMessage::Batch(records) => records.iter().map(|r| r.time).collect(),
            _ => vec![],
        }
    }

    /// A batch past the room the core has is taken in part; the rest and every later message of
    /// its channel wait here in order while the gate holds that channel's senders back (the
    /// other channels go on), and the gate lets them go once nothing of the channel waits.
    #[test]
    fn the_rest_of_a_batch_waits_and_its_channel_is_held_back_until_taken() {
        let mut core = KoalaTask::new(TaskConfig {
            id: TaskId::new(OperatorId(1), 0),
            num_buckets: 4,
            owned: (0..4).collect(),
            inputs: BTreeSet::from([channel(0), channel(1)]),
        });
        core.set_max_queued_records(3);
        let (tx, rx) = data_queue(4);
        let mut intake = Intake::default();
        let now = intake.take(&core, channel(0), batch(0..5)).expect("the first three fit");
        assert_eq!(times(&now), vec![0, 1, 2]);
        assert!(intake.take(&core, channel(0), ChannelMessage::Watermark(9)).is_none(), "behind the rest");
        assert_eq!(intake.take(&core, channel(1), batch(5..6)).map(|m| times(&m)), Some(vec![5]));
        intake.hold_back(&rx);
        let send = |from| {
            tx.send_timeout(TaskInput { channel: channel(from), message: batch(7..8) }, Duration::ZERO)
        };
        assert!(matches!(send(0), Err(SendFailed::Timeout(_))), "channel 0 is held back");
        assert!(send(1).is_ok(), "channel 1 goes on");
        // The core took nothing yet here (its room is still 3): the rest, then the watermark.
        let (c, rest) = intake.next(&core).expect("the rest fits now");
        assert_eq!((c, times(&rest)), (channel(0), vec![3, 4]));
        let (c, watermark) = intake.next(&core).expect("then the watermark");
        assert_eq!((c, watermark), (channel(0), ChannelMessage::Watermark(9)));
        assert!(intake.next(&core).is_none() && !intake.has_data());
        intake.hold_back(&rx);
        assert!(send(0).is_ok(), "channel 0 is let go");
    }
}
