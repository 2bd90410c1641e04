//! What flows into a task's input queue, and the sending half of a channel to another task.

use std::io::{BufWriter, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use koala_types::frame::write_frame;
use koala_types::handshake::{Role, Token, greet};
use koala_types::tls::{Conn, Tls, dialled};
use koala_types::{ChannelMessage, TaskId};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;
use crate::queue::DataSender;

pub use koala_types::InputChannel;

/// Input index of the peer lane between tasks of one operator (hand-overs, forwarded records,
/// stop-and-restart state): bounded, see [`crate::peer`].
pub const PEER_INPUT: usize = usize::MAX;

/// Input index of the fetch lane between tasks of one operator (Koala fetch requests and
/// responses): bounded by credit, never waited on, see [`crate::peer`].
pub const FETCH_INPUT: usize = usize::MAX - 1;

/// First frame on every data connection: which channel this connection carries.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChannelHello {
    /// Receiving task.
    pub to: TaskId,
    /// The channel at the receiver.
    pub channel: InputChannel,
}

/// One item in a task's input queues. All data channels of a task share one bounded queue, so
/// per-channel FIFO order is kept; peer channels have their own queues (`net::TaskInboxes`).
#[derive(Debug)]
pub struct TaskInput {
    /// The channel the message arrived on.
    pub channel: InputChannel,
    /// The message.
    pub message: ChannelMessage,
}

/// The sending half of one channel.
pub enum ChannelSender {
    /// To a task of the same worker: its input queue.
    Local {
        /// The receiver.
        to: TaskId,
        /// Its input queue.
        inbox: LocalQueue,
        /// How the receiver names this channel.
        channel: InputChannel,
    },
    /// To a task of another worker: a dedicated TCP (or TLS) connection.
    Remote {
        /// The receiver.
        to: TaskId,
        /// The connection.
        stream: BufWriter<Conn>,
    },
}

impl ChannelSender {
    /// Opens a channel to a task of another worker.
    pub fn connect(
        addr: &str,
        to: TaskId,
        channel: InputChannel,
        token: Option<&Token>,
        tls: Option<&Tls>,
    ) -> Result<Self, RuntimeError> {
        let stream = connect(addr, to, channel, token, tls)?;
        Ok(Self::Remote { to, stream })
    }

    /// The receiving task.
    pub fn to(&self) -> TaskId {
        match self {
            Self::Local { to, .. } | Self::Remote { to, .. } => *to,
        }
    }

    /// Sends one message, blocking while the receiver is full. Returns how long it blocked
    /// (backpressure).
    pub fn send(&mut self, message: ChannelMessage) -> Result<Duration, RuntimeError> {
        match self {
            Self::Local { to, inbox, channel } => {
                match inbox.send(TaskInput { channel: *channel, message }) {
                    Ok(blocked) => Ok(blocked),
                    // The receiver finished. Records would be lost: an error. Anything else is
                    // dropped: a consumer finishes once every input it knew ended, and one that
                    // finished while its upstream operator was being reconfigured is sent a new
                    // task's watermarks and end of stream, never records (`net::read_channel`).
                    Err(item) if matches!(item.message, ChannelMessage::Batch(_)) => {
                        Err(RuntimeError::ChannelClosed(*to))
                    }
                    Err(_) => Ok(Duration::ZERO),
                }
            }
            Self::Remote { to, stream } => {
                let started = Instant::now();
                write_frame(stream, &message)
                    .and_then(|_| stream.flush())
                    .map_err(|e| RuntimeError::io(format!("sending to {to}"), e))?;
                // A socket write returns once the kernel buffer takes the bytes; anything
                // noticeably longer was the receiver pushing back.
                let blocked = started.elapsed();
                Ok(if blocked > Duration::from_micros(200) { blocked } else { Duration::ZERO })
            }
        }
    }
}

/// One of a co-located task's queues, as a channel's sender sees it.
#[derive(Clone, Debug)]
pub enum LocalQueue {
    /// Its data queue (all data channels; room handed out in turn, `crate::queue`).
    Data(DataSender),
    /// Its peer lane (bounded) or fetch lane (unbounded: bounded by credit, `crate::peer`).
    Lane(Sender<TaskInput>),
}

impl LocalQueue {
    /// Puts one message in, blocking while there is no room for it. Returns how long it
    /// blocked (backpressure); hands the message back if the receiving task is gone.
    pub fn send(&self, item: TaskInput) -> Result<Duration, TaskInput> {
        match self {
            Self::Data(queue) => queue.send(item),
            Self::Lane(lane) => match lane.try_send(item) {
                Ok(()) => Ok(Duration::ZERO),
                Err(TrySendError::Full(item)) => {
                    let started = Instant::now();
                    lane.send(item).map_err(|e| e.into_inner())?;
                    Ok(started.elapsed())
                }
                Err(TrySendError::Disconnected(item)) => Err(item),
            },
        }
    }
}

/// Opens the connection of one channel to a task of another worker (over TLS with `tls`),
/// passes its worker's gate (version, `token`) and greets the task.
pub(crate) fn connect(
    addr: &str,
    to: TaskId,
    channel: InputChannel,
    token: Option<&Token>,
    tls: Option<&Tls>,
) -> Result<BufWriter<Conn>, RuntimeError> {
    let tcp =
        TcpStream::connect(addr).map_err(|e| RuntimeError::io(format!("connecting to {to} at {addr}"), e))?;
    let mut stream =
        dialled(tls, tcp, addr).map_err(|e| RuntimeError::io(format!("connecting to {to}"), e))?;
    greet(&mut stream, Role::Channel, token)
        .map_err(|e| RuntimeError::io(format!("opening a channel to {to} at {addr}"), e))?;
    stream.tcp().set_nodelay(true).map_err(|e| RuntimeError::io("setting TCP_NODELAY", e))?;
    let mut stream = BufWriter::with_capacity(64 * 1024, stream);
    write_frame(&mut stream, &ChannelHello { to, channel })
        .map_err(|e| RuntimeError::io(format!("greeting {to}"), e))?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use koala_types::{OperatorId, Record};

    use super::*;

    /// A receiver that finished takes no more: its new upstream's watermarks and end of stream
    /// are dropped (a consumer that finished while its upstream operator was reconfigured), but
    /// records sent to it would be lost, so they fail the sender.
    #[test]
    fn a_finished_receiver_drops_all_but_records() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        drop(rx);
        let to = TaskId::new(OperatorId(2), 0);
        let channel = InputChannel { input: 0, from: TaskId::new(OperatorId(1), 3) };
        let mut sender = ChannelSender::Local { to, inbox: LocalQueue::Lane(tx), channel };
        assert_eq!(sender.send(ChannelMessage::Watermark(5)).ok(), Some(Duration::ZERO));
        assert_eq!(sender.send(ChannelMessage::EndOfStream).ok(), Some(Duration::ZERO));
        let record = Record { key: vec![1], value: vec![2], time: 5, due_ms: 0 };
        let lost = sender.send(ChannelMessage::Batch(vec![record]));
        assert!(matches!(lost, Err(RuntimeError::ChannelClosed(t)) if t == to), "{lost:?}");
    }
}
