//! Connections from a [`RemoteEnv`](super::RemoteEnv) to its state servers: one per server,
//! opened on first use, each admitted by the server's gate with the job token
//! (`koala_types::handshake`, docs/deploy.md §Security), every frame paced by the worker's
//! emulated link.

use std::io::{BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};

use koala_types::BucketId;
use koala_types::frame::{read_frame_sized, write_frame};
use koala_types::handshake::{Role, Token, greet};
use koala_types::tls::{ConnReader, ConnWriter, Tls, dialled};

use super::{LinkHook, StateRequest, StateResponse};
use crate::StateError;

/// A connection to one server.
pub(super) struct Conn {
    reader: BufReader<ConnReader>,
    writer: BufWriter<ConnWriter>,
}

impl Conn {
    /// Connects to the server at `addr` (over TLS with `tls`) and passes its gate, presenting
    /// `token`.
    pub(super) fn open(addr: &str, token: Option<&Token>, tls: Option<&Tls>) -> std::io::Result<Self> {
        let mut stream = dialled(tls, TcpStream::connect(addr)?, addr)?;
        greet(&mut stream, Role::State, token)?;
        let _ = stream.tcp().set_nodelay(true);
        let (reader, writer) = stream.split()?;
        Ok(Self {
            reader: BufReader::with_capacity(64 * 1024, reader),
            writer: BufWriter::with_capacity(64 * 1024, writer),
        })
    }

    pub(super) fn send(&mut self, request: &StateRequest) -> std::io::Result<usize> {
        let bytes = write_frame(&mut self.writer, request)?;
        self.writer.flush()?;
        Ok(bytes)
    }

    pub(super) fn receive(&mut self) -> std::io::Result<(StateResponse, usize)> {
        read_frame_sized(&mut self.reader)?.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the server closed the connection")
        })
    }
}

/// The servers of an env and how to reach them.
pub(super) struct Servers {
    /// Their addresses: bucket `b` lives on `addrs[b % addrs.len()]`.
    pub(super) addrs: Vec<String>,
    /// The job token each connection presents.
    pub(super) token: Option<Token>,
    /// TLS, if the job runs it: connections check each server's certificate.
    pub(super) tls: Option<Tls>,
    /// The worker's emulated link.
    pub(super) link: Option<LinkHook>,
}

impl Servers {
    pub(super) fn of(&self, bucket: BucketId) -> usize {
        usize::from(bucket) % self.addrs.len()
    }

    pub(super) fn pace(&self, bytes: usize) {
        if let Some(link) = &self.link {
            link(bytes);
        }
    }

    pub(super) fn error(&self, server: usize, op: &'static str, message: impl ToString) -> StateError {
        StateError::Remote { server: self.addrs[server].clone(), op, message: message.to_string() }
    }
}

/// One connection per server, opened on first use; a failed connection is dropped (the error is
/// fatal for the task anyway, but a later handle starts afresh).
pub(super) struct Pool {
    pub(super) servers: Arc<Servers>,
    conns: Vec<Mutex<Option<Conn>>>,
}

impl Pool {
    pub(super) fn new(servers: Arc<Servers>) -> Self {
        let conns = servers.addrs.iter().map(|_| Mutex::new(None)).collect();
        Self { servers, conns }
    }

    fn lock(&self, server: usize, op: &'static str) -> Result<MutexGuard<'_, Option<Conn>>, StateError> {
        let mut guard = self.conns[server].lock().map_err(|_| StateError::Poisoned {
            store: format!("connection to state server {}", self.servers.addrs[server]),
            op,
        })?;
        if guard.is_none() {
            let conn = Conn::open(
                &self.servers.addrs[server],
                self.servers.token.as_ref(),
                self.servers.tls.as_ref(),
            )
            .map_err(|e| self.servers.error(server, op, e))?;
            *guard = Some(conn);
        }
        Ok(guard)
    }

    /// Sends one request per (server, request), all before reading any answer (one round trip
    /// over every server involved); returns the answers in the same order.
    pub(super) fn round_trip(
        &self,
        op: &'static str,
        requests: Vec<(usize, StateRequest)>,
    ) -> Result<Vec<StateResponse>, StateError> {
        let mut guards = Vec::with_capacity(requests.len());
        let mut bytes = 0;
        for (server, request) in &requests {
            let mut guard = self.lock(*server, op)?;
            let sent = guard.as_mut().map(|c| c.send(request));
            match sent {
                Some(Ok(n)) => bytes += n,
                Some(Err(e)) => {
                    *guard = None;
                    return Err(self.servers.error(*server, op, e));
                }
                None => return Err(self.servers.error(*server, op, "no connection")),
            }
            guards.push((*server, guard));
        }
        let mut answers = Vec::with_capacity(guards.len());
        for (server, mut guard) in guards {
            let received = guard.as_mut().map(Conn::receive);
            match received {
                Some(Ok((StateResponse::Failed(message), _))) => {
                    return Err(self.servers.error(server, op, message));
                }
                Some(Ok((answer, n))) => {
                    bytes += n;
                    answers.push(answer);
                }
                Some(Err(e)) => {
                    *guard = None;
                    return Err(self.servers.error(server, op, e));
                }
                None => return Err(self.servers.error(server, op, "no connection")),
            }
        }
        self.servers.pace(bytes);
        Ok(answers)
    }

    pub(super) fn one(
        &self,
        op: &'static str,
        server: usize,
        request: StateRequest,
    ) -> Result<StateResponse, StateError> {
        let mut answers = self.round_trip(op, vec![(server, request)])?;
        answers.pop().ok_or_else(|| self.servers.error(server, op, "no answer"))
    }
}
