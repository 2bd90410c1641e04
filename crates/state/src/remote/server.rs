//! The state server (`koala state-server`): an fjall database ([`FjallEnv`]) with one keyspace
//! per operator, serving [`StateRequest`]s over framed TCP, one thread per connection. A malformed
//! frame drops that connection with a logged error; the server keeps running.

use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;

use koala_types::frame::{read_frame, write_frame};
use koala_types::handshake::{Gate, GateLimits, Role};
use koala_types::{OperatorId, TaskId};

use super::{SERVER_SCAN_CHUNK, StateRequest, StateResponse};
use crate::{FjallBackend, FjallEnv, StateBackend, StateEnv, StateError};

/// A running state server. Its threads live as long as the process (a `koala state-server`
/// process, or a test).
#[derive(Debug)]
pub struct StateServer {
    addr: SocketAddr,
    env: Arc<FjallEnv>,
}

impl StateServer {
    /// Opens (creating if needed) the database in `data_dir`, binds `listen` (port 0 = any free
    /// port) and serves connections on a background thread.
    ///
    /// # Errors
    /// [`StateError::Open`] if the database cannot be opened, [`StateError::Env`] if the address
    /// cannot be bound.
    pub fn start(listen: &str, data_dir: &Path) -> Result<Self, StateError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| StateError::Open { path: data_dir.to_path_buf(), source: Box::new(e) })?;
        let env = Arc::new(FjallEnv::open(data_dir)?);
        let bind_error = |e: std::io::Error| StateError::Env {
            path: data_dir.to_path_buf(),
            op: "bind",
            source: Box::new(e),
        };
        let listener = TcpListener::bind(listen).map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let served = env.clone();
        std::thread::Builder::new()
            .name("koala-state-server".into())
            .spawn(move || accept(&listener, &served))
            .map_err(bind_error)?;
        Ok(Self { addr, env })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Makes every write durable (what a `Persist` request does).
    ///
    /// # Errors
    /// What fjall reports.
    pub fn persist(&self) -> Result<(), StateError> {
        self.env.persist()
    }
}

/// Serves connections, each admitted first by the protocol-version greeting
/// (`koala_types::handshake`; no job token yet: keep state servers on a private network).
fn accept(listener: &TcpListener, env: &Arc<FjallEnv>) {
    let gate = Gate::new("state server", None, false, GateLimits::default());
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let pending = match gate.enter(&stream) {
                    Ok(pending) => pending,
                    Err(refusal) => {
                        tracing::warn!(reason = %refusal, "state server: refused a connection");
                        continue;
                    }
                };
                let env = env.clone();
                let spawned =
                    std::thread::Builder::new().name("koala-state-conn".into()).spawn(move || match pending
                        .admit(&stream)
                    {
                        Ok(Role::State) => serve(stream, &env),
                        Ok(role) => tracing::error!(?role, "state server: not a state client; dropped"),
                        Err(refusal) => {
                            tracing::warn!(reason = %refusal, "state server: refused a connection")
                        }
                    });
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "cannot spawn a state connection thread; connection dropped");
                }
            }
            Err(e) => tracing::warn!(error = %e, "accepting a state connection failed"),
        }
    }
}

/// The key space of `operator`: the fjall keyspace of "task" (operator, 0) — one per operator,
/// shared by all its tasks.
fn space(env: &FjallEnv, operator: OperatorId) -> Result<FjallBackend, StateError> {
    env.open_fjall_task(TaskId::new(operator, 0))
}

fn serve(stream: TcpStream, env: &FjallEnv) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let _ = stream.set_nodelay(true);
    let Ok(read_half) = stream.try_clone() else { return };
    let mut reader = BufReader::with_capacity(64 * 1024, read_half);
    let mut writer = BufWriter::with_capacity(64 * 1024, stream);
    loop {
        let request: StateRequest = match read_frame(&mut reader) {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(%peer, error = %e, "malformed state request; dropping connection");
                return;
            }
        };
        let sent = answer(env, request, &mut writer).and_then(|()| writer.flush());
        if let Err(e) = sent {
            tracing::debug!(%peer, error = %e, "state connection closed while answering");
            return;
        }
    }
}

/// Answers one request (a scan with several frames); a store error becomes `Failed`.
fn answer(env: &FjallEnv, request: StateRequest, w: &mut impl Write) -> std::io::Result<()> {
    let result = match request {
        StateRequest::Get { operator, keys } => {
            space(env, operator).and_then(|s| s.get_many(&keys)).map(StateResponse::Values)
        }
        StateRequest::Write { operator, writes } => {
            space(env, operator).and_then(|s| s.write_many(writes)).map(|()| StateResponse::Done)
        }
        StateRequest::Scan { operator, bucket } => {
            let mut io_error = None;
            let scanned = space(env, operator).and_then(|s| {
                s.scan_buckets(&[bucket], SERVER_SCAN_CHUNK, &mut |chunk| {
                    write_frame(w, &StateResponse::Chunk(chunk)).map(drop).map_err(|e| {
                        let message = e.to_string();
                        io_error = Some(e);
                        StateError::sink(message)
                    })
                })
            });
            if let Some(e) = io_error {
                return Err(e);
            }
            scanned.map(|_| StateResponse::ScanEnd)
        }
        StateRequest::KeysAfter { operator, bucket, after, limit } => space(env, operator)
            .and_then(|s| s.bucket_keys_after(bucket, after.as_ref(), limit as usize))
            .map(StateResponse::Keys),
        StateRequest::DeleteBuckets { operator, buckets } => {
            space(env, operator).and_then(|s| s.delete_buckets(&buckets)).map(|()| StateResponse::Done)
        }
        StateRequest::Len { operator } => {
            space(env, operator).and_then(|s| s.approximate_len()).map(StateResponse::Len)
        }
        StateRequest::Persist => env.persist().map(|()| StateResponse::Done),
    };
    let response = result.unwrap_or_else(|e| StateResponse::Failed(error_chain(&e)));
    write_frame(w, &response).map(drop)
}

/// An error with its sources, for the client's message.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}
