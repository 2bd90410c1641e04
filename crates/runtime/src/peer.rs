//! Peer channels: channels between tasks of one operator (docs/architecture.md §4). Besides its
//! data queue, a task has two peer queues, so peer traffic is bounded and yet two tasks that send
//! to each other never wait on each other:
//!
//! - the **peer lane** ([`PEER_INPUT`]) carries Koala's hand-overs, forwarded records, peer
//!   watermarks, `Open` and `Close`, and stop-and-restart's state chunks. It is bounded
//!   ([`peer_capacity`]). A task never blocks on a full peer lane while not draining its own:
//!   the Koala loop keeps what a peer cannot take yet in an [`Outbox`], keeps serving its own
//!   peer and fetch lanes and takes no data input meanwhile (so backpressure goes upstream), and
//!   a stop-and-restart sender waits with [`PeerSender::send_draining`], which applies the state
//!   arriving for it while it waits.
//! - the **fetch lane** ([`FETCH_INPUT`]) carries Koala fetch requests and responses. It is an
//!   unbounded queue, bounded by credit instead: a task has at most one fetch outstanding per
//!   location (`koala_protocol::koala` pipeline), so between two tasks at most one request and one
//!   response are on their way in each direction. Nobody ever waits for room on it, so a fetch
//!   can never be part of a deadlock and a response never waits behind a hand-over. It keeps the
//!   split the protocol simulator checks: fetches FIFO among themselves, independent of peer
//!   messages.
//!
//! A wait-for cycle would need a task blocked on a peer lane that is not draining its own; no
//! task ever is. What else a task blocks on — a full data queue downstream — follows the job's
//! DAG and ends at a sink, so it cannot close a cycle either.
//!
//! [`PEER_INPUT`]: crate::links::PEER_INPUT
//! [`FETCH_INPUT`]: crate::links::FETCH_INPUT

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufWriter, Write};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender, TrySendError, bounded};
use koala_types::frame::write_frame;
use koala_types::handshake::Token;
use koala_types::tls::{Conn, Tls};
use koala_types::{ChannelMessage, TaskId};

use crate::RuntimeError;
use crate::channel::{InputChannel, TaskInput, connect};

/// Capacity of a task's peer lane, in messages, for a job's `channel_capacity`: the same number
/// as its data queue. A peer message is a forwarded batch (at most `batch_records` records, like a
/// data message), a hand-over, or a 256 KiB stop-and-restart chunk, so the default of 64 holds at
/// most 16 MiB of state in flight per receiving task, enough to keep a transfer streaming while
/// the receiver writes; one knob keeps memory per task proportional, and a test can shrink both.
pub fn peer_capacity(channel_capacity: usize) -> usize {
    channel_capacity.max(1)
}

/// Messages waiting for a remote peer lane's writer thread besides the one it writes: the writer
/// blocks on the socket so the task never has to.
const REMOTE_QUEUE: usize = 1;

/// The sending half of a peer lane: a bounded queue the sender can wait on together with its own
/// input (the receiver's peer queue, or the writer thread of a connection to another worker).
pub struct PeerSender {
    to: TaskId,
    channel: InputChannel,
    queue: Sender<TaskInput>,
}

impl PeerSender {
    /// The peer lane to a task of this worker.
    pub fn local(to: TaskId, inbox: Sender<TaskInput>, channel: InputChannel) -> Self {
        Self { to, channel, queue: inbox }
    }

    /// The peer lane to a task of another worker: a connection written by its own thread, so
    /// waiting for the receiver is waiting on a queue.
    pub fn connect(
        addr: &str,
        to: TaskId,
        channel: InputChannel,
        token: Option<&Token>,
        tls: Option<&Tls>,
    ) -> Result<Self, RuntimeError> {
        let stream = connect(addr, to, channel, token, tls)?;
        let (queue, outgoing) = bounded(REMOTE_QUEUE);
        std::thread::Builder::new()
            .name("koala-peer-out".into())
            .spawn(move || write_peer_lane(stream, &outgoing, to))
            .map_err(|e| RuntimeError::io("spawning a peer lane writer", e))?;
        Ok(Self { to, channel, queue })
    }

    /// The receiving task.
    pub fn to(&self) -> TaskId {
        self.to
    }

    /// Sends `message` if the lane has room; gives it back if it is full.
    pub fn try_send(&self, message: ChannelMessage) -> Result<Option<ChannelMessage>, RuntimeError> {
        match self.queue.try_send(TaskInput { channel: self.channel, message }) {
            Ok(()) => Ok(None),
            Err(TrySendError::Full(item)) => Ok(Some(item.message)),
            Err(TrySendError::Disconnected(_)) => Err(RuntimeError::ChannelClosed(self.to)),
        }
    }

    /// Sends `message`, blocking while the lane is full (for a thread that has no input of its
    /// own to take meanwhile: the task's thread drains it, `send_draining`).
    pub fn send(&self, message: ChannelMessage) -> Result<(), RuntimeError> {
        self.queue
            .send(TaskInput { channel: self.channel, message })
            .map_err(|_| RuntimeError::ChannelClosed(self.to))
    }

    /// Sends `message`, blocking while the lane is full — but taking the sender's own peer input
    /// from `own` meanwhile and handing it to `on_input`, so two tasks streaming to each other
    /// both progress. `on_input` must not send on a peer lane. Returns how long it waited.
    pub fn send_draining(
        &self,
        message: ChannelMessage,
        own: &Receiver<TaskInput>,
        mut on_input: impl FnMut(TaskInput) -> Result<(), RuntimeError>,
    ) -> Result<Duration, RuntimeError> {
        let Some(message) = self.try_send(message)? else {
            return Ok(Duration::ZERO);
        };
        let started = Instant::now();
        let item = TaskInput { channel: self.channel, message };
        loop {
            let mut select = Select::new();
            let send = select.send(&self.queue);
            select.recv(own);
            let op = select.select();
            if op.index() == send {
                op.send(&self.queue, item).map_err(|_| RuntimeError::ChannelClosed(self.to))?;
                return Ok(started.elapsed());
            }
            match op.recv(own) {
                Ok(input) => on_input(input)?,
                Err(_) => {
                    // Nothing can arrive here any more; only the receiver is left to wait for.
                    self.queue.send(item).map_err(|_| RuntimeError::ChannelClosed(self.to))?;
                    return Ok(started.elapsed());
                }
            }
        }
    }
}

/// Writes a peer lane's messages to its connection until the task drops the lane. A failed write
/// closes the lane (logged), so the task's next send on it fails with `ChannelClosed`; a worker
/// that is gone is noticed by the coordinator through its control connection.
fn write_peer_lane(mut stream: BufWriter<Conn>, outgoing: &Receiver<TaskInput>, to: TaskId) {
    while let Ok(item) = outgoing.recv() {
        let written = write_frame(&mut stream, &item.message)
            .and_then(|_| if outgoing.is_empty() { stream.flush() } else { Ok(()) });
        if let Err(e) = written {
            tracing::error!(%to, error = %e, "writing a peer lane failed; closing it");
            return;
        }
    }
    if let Err(e) = stream.flush() {
        tracing::error!(%to, error = %e, "flushing a peer lane failed");
    }
}

/// A task's peer lanes, with the messages a full lane could not take yet, per peer in send order
/// (so FIFO per peer holds). While anything waits here the Koala loop takes no data input and
/// keeps serving its own peer and fetch lanes and its commands; what it sends in reaction to
/// those is bounded (fetch messages do not come here; per epoch a hand-over, `Open` and `Close`
/// per peer; records it forwards come from data input), so waiting messages stay bounded too.
#[derive(Default)]
pub struct Outbox {
    lanes: HashMap<TaskId, PeerSender>,
    waiting: BTreeMap<TaskId, VecDeque<ChannelMessage>>,
}

impl Outbox {
    /// Whether a lane to `to` is open.
    pub fn is_open(&self, to: TaskId) -> bool {
        self.lanes.contains_key(&to)
    }

    /// Adds a lane.
    pub fn open(&mut self, lane: PeerSender) {
        self.lanes.insert(lane.to(), lane);
    }

    /// Whether some message waits for a full lane.
    pub fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Whether some message waits for the lane to `to`.
    pub fn is_waiting_for(&self, to: TaskId) -> bool {
        self.waiting.contains_key(&to)
    }

    /// How many messages wait for full lanes.
    pub fn waiting_len(&self) -> usize {
        self.waiting.values().map(VecDeque::len).sum()
    }

    /// Sends `message` to `to` now if its lane has room and nothing waits for it, else queues it.
    pub fn send(&mut self, to: TaskId, message: ChannelMessage) -> Result<(), RuntimeError> {
        if let Some(waiting) = self.waiting.get_mut(&to) {
            waiting.push_back(message);
            return Ok(());
        }
        let lane = self.lanes.get(&to).ok_or(RuntimeError::ChannelClosed(to))?;
        if let Some(message) = lane.try_send(message)? {
            self.waiting.entry(to).or_default().push_back(message);
        }
        Ok(())
    }

    /// The lanes messages wait for, to wait on with a [`Select`] (queues are cheap clones); once
    /// one is ready, [`Outbox::flush`].
    pub fn blocked(&self) -> Vec<Sender<TaskInput>> {
        self.waiting.keys().filter_map(|to| self.lanes.get(to).map(|l| l.queue.clone())).collect()
    }

    /// Moves waiting messages into lanes that have room, in order.
    pub fn flush(&mut self) -> Result<(), RuntimeError> {
        let peers: Vec<TaskId> = self.waiting.keys().copied().collect();
        for to in peers {
            let Some(lane) = self.lanes.get(&to) else { continue };
            let Some(waiting) = self.waiting.get_mut(&to) else { continue };
            while let Some(message) = waiting.pop_front() {
                if let Some(message) = lane.try_send(message)? {
                    waiting.push_front(message);
                    break;
                }
            }
            if waiting.is_empty() {
                self.waiting.remove(&to);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use koala_types::OperatorId;

    use super::*;
    use crate::channel::PEER_INPUT;

    fn task(index: u32) -> TaskId {
        TaskId::new(OperatorId(1), index)
    }

    fn numbered(i: u8) -> ChannelMessage {
        ChannelMessage::Protocol(vec![i])
    }

    /// What a full lane cannot take waits, and later messages queue behind it instead of
    /// overtaking it once the lane has room: per-peer FIFO holds. Another peer's lane is not held up.
    #[test]
    fn an_outbox_keeps_each_peers_order_while_its_lane_is_full() {
        let (full_tx, full) = bounded(1);
        let (free_tx, free) = bounded(8);
        let mut outbox = Outbox::default();
        outbox.open(PeerSender::local(task(1), full_tx, InputChannel { input: PEER_INPUT, from: task(0) }));
        outbox.open(PeerSender::local(task(2), free_tx, InputChannel { input: PEER_INPUT, from: task(0) }));
        for i in 0..5 {
            outbox.send(task(1), numbered(i)).expect("send");
            outbox.send(task(2), numbered(i)).expect("send");
        }
        assert!(outbox.has_waiting());
        assert_eq!(outbox.blocked().len(), 1, "only the full lane blocks");
        assert_eq!(free.len(), 5, "the other peer got everything at once");
        let mut got = Vec::new();
        while let Ok(item) = full.try_recv() {
            got.push(item.message);
            outbox.flush().expect("flush");
        }
        assert!(!outbox.has_waiting());
        assert_eq!(got, (0..5).map(numbered).collect::<Vec<_>>());
    }
}
