//! Backpressure in the simulated job (docs/testing.md §2, bounded Koala inbox): with
//! [`SimConfig::channel_capacity`](super::SimConfig::channel_capacity) an upstream is a thread
//! with blocking sends, as the runtime's are — a send to a full data channel blocks it, and it
//! then emits nothing and takes no command (no `Switch`, so no markers) until the channel has
//! room; a Koala task with a bound refuses the head of a data channel or peer lane as its core
//! says ([`KoalaTask::data_room`](crate::koala::KoalaTask::data_room),
//! [`KoalaTask::peer_room`](crate::koala::KoalaTask::peer_room)) and takes a batch in part; so
//! does a DRRS task ([`DrrsTask::data_room`](crate::drrs::DrrsTask::data_room): a record to
//! forward without credit, or one that would wait past its wait buffer) — it takes its peer lane
//! whole, the credit it lends bounds what comes there.

use koala_types::{ChannelMessage, InputChannel};

use super::world::{ChannelKey, Core, Kind, Msg, Node, World};
use crate::koala::PeerMessage;

impl World {
    /// Whether the head of the `i`-th non-empty channel may be delivered now.
    pub(crate) fn deliverable(&self, i: usize) -> bool {
        let Some((key, msg)) = self.channels.head(i) else { return false };
        match key {
            // A blocked upstream's thread is in a send: it takes no command.
            (_, Node::Upstream(to), _) => {
                self.upstreams.iter().find(|u| u.id == to).is_none_or(|u| u.sending.is_empty())
            }
            (from, Node::Task(to), Kind::Data(input)) => {
                if self.paused.contains(&to) {
                    return false;
                }
                match (&self.tasks.get(&to).map(|t| &t.core), from, msg) {
                    (
                        Some(Core::Koala(core)),
                        Node::Upstream(from) | Node::Task(from),
                        Msg::Data(ChannelMessage::Batch(records)),
                    ) => core.data_room(InputChannel { input, from }, records) > 0,
                    (Some(Core::Koala(core)), _, _) => core.takes_data(),
                    (
                        Some(Core::Drrs(core)),
                        Node::Upstream(from) | Node::Task(from),
                        Msg::Data(ChannelMessage::Batch(records)),
                    ) => core.data_room(InputChannel { input, from }, records) > 0,
                    _ => true,
                }
            }
            (_, Node::Task(to), Kind::Peer) => match (&self.tasks.get(&to).map(|t| &t.core), msg) {
                (Some(Core::Koala(core)), Msg::Peer(PeerMessage::Records { records, .. })) => {
                    core.peer_room(records.len()) > 0
                }
                _ => true,
            },
            _ => true,
        }
    }

    /// Whether a Koala task that takes data input, or a DRRS task, refuses the head of one of its
    /// data channels now (`open`: the deliverable channels).
    pub(crate) fn refuses_a_head(&self, open: &[usize]) -> bool {
        (0..self.channels.nonempty()).filter(|i| !open.contains(i)).any(|i| {
            matches!(self.channels.head(i), Some(((_, Node::Task(to), Kind::Data(_)), _))
                if matches!(self.tasks.get(&to).map(|t| &t.core),
                    Some(Core::Koala(c)) if c.takes_data()) || matches!(self.tasks.get(&to).map(|t| &t.core), Some(Core::Drrs(_))))
        })
    }

    /// The part of a batch (from a data channel or forwarded on a peer lane) a Koala task takes
    /// now; the rest goes back to the head of its channel.
    pub(crate) fn take_part(&mut self, key: ChannelKey, msg: Msg) -> Msg {
        let (from, Node::Task(to), kind) = key else { return msg };
        let (Node::Upstream(sender) | Node::Task(sender)) = from else { return msg };
        if let (Some(Core::Drrs(core)), Kind::Data(input)) = (self.tasks.get(&to).map(|t| &t.core), kind) {
            let Msg::Data(ChannelMessage::Batch(mut records)) = msg else { return msg };
            let room = core.data_room(InputChannel { input, from: sender }, &records);
            if room < records.len() {
                let rest = records.split_off(room);
                self.stats.split_batches += 1;
                self.channels.push_front(key, Msg::Data(ChannelMessage::Batch(rest)));
            }
            return Msg::Data(ChannelMessage::Batch(records));
        }
        let Some(Core::Koala(core)) = self.tasks.get(&to).map(|t| &t.core) else { return msg };
        let (taken, rest) = match (kind, msg) {
            (Kind::Data(input), Msg::Data(ChannelMessage::Batch(mut records))) => {
                let room = core.data_room(InputChannel { input, from: sender }, &records);
                if room >= records.len() {
                    return Msg::Data(ChannelMessage::Batch(records));
                }
                let rest = records.split_off(room);
                (Msg::Data(ChannelMessage::Batch(records)), Msg::Data(ChannelMessage::Batch(rest)))
            }
            (Kind::Peer, Msg::Peer(PeerMessage::Records { epoch, input, mut records })) => {
                let room = core.peer_room(records.len());
                if room >= records.len() {
                    return Msg::Peer(PeerMessage::Records { epoch, input, records });
                }
                let rest = records.split_off(room);
                (
                    Msg::Peer(PeerMessage::Records { epoch, input, records }),
                    Msg::Peer(PeerMessage::Records { epoch, input, records: rest }),
                )
            }
            (_, msg) => return msg,
        };
        self.stats.split_batches += 1;
        self.channels.push_front(key, rest);
        taken
    }

    /// Sends of upstream `u` as its thread makes them: in order, each once its channel has room
    /// (only data channels are bounded).
    pub(crate) fn send_from(&mut self, u: usize, key: ChannelKey, msg: Msg) {
        if self.cfg.channel_capacity == 0 {
            self.channels.push(key, msg);
            return;
        }
        let was_blocked = !self.upstreams[u].sending.is_empty();
        self.upstreams[u].sending.push_back((key, msg));
        self.flush_sends(u);
        if !was_blocked && !self.upstreams[u].sending.is_empty() {
            self.stats.blocked_sends += 1;
        }
    }

    fn flush_sends(&mut self, u: usize) {
        while let Some((key, _)) = self.upstreams[u].sending.front() {
            if matches!(key.2, Kind::Data(_)) && self.channels.len_of(key) >= self.cfg.channel_capacity {
                return;
            }
            if let Some((key, msg)) = self.upstreams[u].sending.pop_front() {
                self.channels.push(key, msg);
            }
        }
    }

    /// A data channel made room: blocked upstreams go on with their sends.
    pub(crate) fn unblock_senders(&mut self) -> Result<(), String> {
        for u in 0..self.upstreams.len() {
            if !self.upstreams[u].sending.is_empty() {
                self.flush_sends(u);
            }
        }
        Ok(())
    }
}
