//! The worker's data-plane listener: one reader thread per incoming channel connection, feeding
//! the receiving task's input queue of that channel's kind (data, peer or fetch lane). A reader
//! blocked on a full queue stalls only its own connection, hence its own channel. A malformed
//! frame drops that connection with a logged error; the worker keeps running. Every connection
//! is admitted by the data port's [`Gate`] first (protocol version, the job token when the port
//! is not on loopback, bounds on unadmitted connections: `koala_types::handshake`).

use std::collections::HashMap;
use std::io::BufReader;
use std::net::TcpListener;
use std::sync::{Arc, RwLock};

use crossbeam_channel::Sender;
use koala_types::frame::{read_frame, read_frame_sized};
use koala_types::handshake::{Gate, Role};
use koala_types::tls::{Conn, Tls, accepted};
use koala_types::{ChannelMessage, TaskId};

use crate::channel::{ChannelHello, FETCH_INPUT, LocalQueue, PEER_INPUT, TaskInput};
use crate::queue::DataSender;
use crate::throttle::SharedLink;

/// The three input queues of a task (docs/architecture.md §4). Data and peer messages never
/// share a queue, so state transfer and fetches never wait behind data.
#[derive(Clone)]
pub struct TaskInboxes {
    /// Data channels from upstream tasks: bounded (`channel_capacity`), backpressure upstream.
    pub data: DataSender,
    /// The peer lane from tasks of the same operator (hand-overs, forwarded records, state
    /// chunks): bounded ([`crate::peer::peer_capacity`]). Senders never block on it while not
    /// draining their own (see [`crate::peer`]).
    pub peer: Sender<TaskInput>,
    /// The fetch lane (Koala fetch requests and responses): unbounded as a queue, bounded by
    /// credit — a task has at most one fetch outstanding per location — so a sender never waits
    /// on it and a fetch can never be part of a deadlock.
    pub fetch: Sender<TaskInput>,
}

impl TaskInboxes {
    /// The queue a channel with input index `input` feeds.
    pub fn for_input(&self, input: usize) -> LocalQueue {
        match input {
            PEER_INPUT => LocalQueue::Lane(self.peer.clone()),
            FETCH_INPUT => LocalQueue::Lane(self.fetch.clone()),
            _ => LocalQueue::Data(self.data.clone()),
        }
    }
}

/// Input queues of the tasks of this worker, by task.
pub type Inboxes = Arc<RwLock<HashMap<TaskId, TaskInboxes>>>;

/// Accepts data connections forever (until the process exits), each admitted by `gate` (after
/// a TLS handshake, with `tls`). Frames arriving on peer and fetch lanes cross `link`, the
/// worker's emulated network link (`crate::throttle`).
pub fn serve(listener: TcpListener, inboxes: Inboxes, link: Arc<SharedLink>, gate: Gate, tls: Option<Tls>) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let pending = match gate.enter(&stream) {
                    Ok(pending) => pending,
                    Err(refusal) => {
                        let peer = stream.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
                        tracing::warn!(%peer, reason = %refusal, "data port: refused a connection");
                        continue;
                    }
                };
                let inboxes = inboxes.clone();
                let link = link.clone();
                let (tls, idle) = (tls.clone(), gate.idle());
                let spawned = std::thread::Builder::new().name("koala-data-in".into()).spawn(move || {
                    let peer = stream.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
                    let mut stream = match accepted(tls.as_ref(), stream, idle) {
                        Ok(stream) => stream,
                        Err(e) => {
                            return tracing::warn!(%peer, error = %e, "data port: refused a connection (TLS)");
                        }
                    };
                    match pending.admit(&mut stream) {
                        Ok(Role::Channel) => read_channel(stream, &inboxes, &link),
                        Ok(role) => tracing::error!(%peer, ?role, "data port: not a channel; dropped"),
                        Err(refusal) => {
                            tracing::warn!(%peer, reason = %refusal, "data port: refused a connection")
                        }
                    }
                });
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "cannot spawn a reader thread; connection dropped");
                }
            }
            Err(e) => tracing::warn!(error = %e, "accepting a data connection failed"),
        }
    }
}

fn read_channel(stream: Conn, inboxes: &Inboxes, link: &SharedLink) {
    let peer = stream.tcp().peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let _ = stream.tcp().set_nodelay(true);
    let Ok(stream) = stream.into_reader() else { return };
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let hello: ChannelHello = match read_frame(&mut reader) {
        Ok(Some(h)) => h,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(%peer, error = %e, "malformed channel greeting; dropping connection");
            return;
        }
    };
    let inbox = match inboxes.read() {
        Ok(map) => map.get(&hello.to).map(|i| i.for_input(hello.channel.input)),
        Err(_) => None,
    };
    let Some(inbox) = inbox else {
        tracing::error!(%peer, to = %hello.to, "channel to a task this worker does not host; dropping connection");
        return;
    };
    // Peer traffic between workers is what the emulated link carries; data channels are not.
    let over_link = matches!(hello.channel.input, PEER_INPUT | FETCH_INPUT);
    loop {
        match read_frame_sized::<_, ChannelMessage>(&mut reader) {
            Ok(Some((message, bytes))) => {
                if over_link {
                    link.pace(bytes);
                }
                let end = message == ChannelMessage::EndOfStream;
                let records = matches!(message, ChannelMessage::Batch(_));
                if inbox.send(TaskInput { channel: hello.channel, message }).is_err() && records {
                    // The task finished: dropping the connection fails the sender, loudly.
                    tracing::error!(%peer, to = %hello.to, from = %hello.channel.from,
                        "records for a task that finished; dropping the connection");
                    return;
                }
                // Anything else for a finished task is read and dropped, so its sender does not
                // fail: a consumer that finished while its upstream operator was being
                // reconfigured is sent a new task's watermarks and end of stream, never records
                // (`ChannelSender::send`).
                if end {
                    return;
                }
            }
            Ok(None) => {
                // Expected when a reconfiguration replaces a drained channel; a lost worker is
                // noticed by the coordinator through its control connection.
                tracing::debug!(%peer, to = %hello.to, from = %hello.channel.from, "channel closed before end of stream");
                return;
            }
            Err(e) => {
                tracing::error!(%peer, to = %hello.to, from = %hello.channel.from, error = %e,
                    "malformed frame on data channel; dropping connection");
                return;
            }
        }
    }
}
