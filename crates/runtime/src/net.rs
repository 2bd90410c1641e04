//! The worker's data-plane listener: one reader thread per incoming channel connection, feeding
//! the receiving task's input queue. A malformed frame drops that connection with a logged error;
//! the worker keeps running.

use std::collections::HashMap;
use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, RwLock};

use crossbeam_channel::Sender;
use koala_types::frame::read_frame;
use koala_types::{ChannelMessage, TaskId};

use crate::channel::{ChannelHello, TaskInput};
use crate::links::PEER_INPUT;

/// The two input queues of a task: data channels (bounded: backpressure) and peer channels
/// (unbounded: state transfer and fetches must never wait behind data, or two tasks fetching
/// from each other could block each other).
#[derive(Clone)]
pub struct TaskInboxes {
    /// Data channels from upstream tasks.
    pub data: Sender<TaskInput>,
    /// Peer channels from tasks of the same operator.
    pub peer: Sender<TaskInput>,
}

impl TaskInboxes {
    /// The queue a channel with input index `input` feeds.
    pub fn for_input(&self, input: usize) -> &Sender<TaskInput> {
        if input == PEER_INPUT { &self.peer } else { &self.data }
    }
}

/// Input queues of the tasks of this worker, by task.
pub type Inboxes = Arc<RwLock<HashMap<TaskId, TaskInboxes>>>;

/// Accepts data connections forever (until the process exits).
pub fn serve(listener: TcpListener, inboxes: Inboxes) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let inboxes = inboxes.clone();
                let spawned = std::thread::Builder::new()
                    .name("koala-data-in".into())
                    .spawn(move || read_channel(stream, &inboxes));
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "cannot spawn a reader thread; connection dropped");
                }
            }
            Err(e) => tracing::warn!(error = %e, "accepting a data connection failed"),
        }
    }
}

fn read_channel(stream: TcpStream, inboxes: &Inboxes) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let _ = stream.set_nodelay(true);
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
        Ok(map) => map.get(&hello.to).map(|i| i.for_input(hello.channel.input).clone()),
        Err(_) => None,
    };
    let Some(inbox) = inbox else {
        tracing::error!(%peer, to = %hello.to, "channel to a task this worker does not host; dropping connection");
        return;
    };
    loop {
        match read_frame::<_, ChannelMessage>(&mut reader) {
            Ok(Some(message)) => {
                let end = message == ChannelMessage::EndOfStream;
                if inbox.send(TaskInput { channel: hello.channel, message }).is_err() || end {
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
