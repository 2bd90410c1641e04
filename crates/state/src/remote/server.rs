//! The state server (`koala state-server`): an fjall database ([`FjallEnv`]) with one keyspace
//! per operator, serving [`StateRequest`]s over framed TCP, one thread per connection. Every
//! connection passes the listener's gate first (`koala_types::handshake`: protocol version, and
//! the job token, required when the server does not listen on loopback — docs/deploy.md
//! §Security). A malformed frame drops that connection with a logged error; the server keeps
//! running.

use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;

use koala_types::frame::{read_frame, write_frame};
use koala_types::handshake::{Gate, GateLimits, Role, Token};
use koala_types::tls::{Conn, Tls, accepted};
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
    /// port) and serves connections on a background thread. Clients present the job `token`;
    /// it is required when `listen` is not loopback, and a wrong one is refused everywhere. With
    /// `tls` (which must hold a certificate), every connection is TLS; plaintext is refused.
    ///
    /// # Errors
    /// [`StateError::Open`] if the database cannot be opened, [`StateError::Env`] if the address
    /// cannot be bound, [`StateError::Remote`] (naming the fix) if it is not loopback and there is
    /// no token.
    pub fn start(
        listen: &str,
        data_dir: &Path,
        token: Option<Token>,
        tls: Option<Tls>,
    ) -> Result<Self, StateError> {
        let bind_error = |e: std::io::Error| StateError::Env {
            path: data_dir.to_path_buf(),
            op: "bind",
            source: Box::new(e),
        };
        // Bound first: the gate's rule depends on the address, and a refusal opens no database.
        let listener = TcpListener::bind(listen).map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let gate = Gate::for_listener("state server", addr.ip(), token, GateLimits::default())
            .map_err(|message| StateError::Remote { server: addr.to_string(), op: "start", message })?;
        if tls.as_ref().is_some_and(|t| !t.can_listen()) {
            return Err(StateError::Remote {
                server: addr.to_string(),
                op: "start",
                message: "TLS is on (--tls-ca) but there is no certificate to listen with: give \
                          --tls-cert and --tls-key too"
                    .into(),
            });
        }
        std::fs::create_dir_all(data_dir)
            .map_err(|e| StateError::Open { path: data_dir.to_path_buf(), source: Box::new(e) })?;
        let env = Arc::new(FjallEnv::open(data_dir)?);
        let served = env.clone();
        std::thread::Builder::new()
            .name("koala-state-server".into())
            .spawn(move || accept(&listener, &gate, tls.as_ref(), &served))
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

/// Serves connections, each admitted first by `gate` (the greeting: protocol version and job
/// token), on a thread of its own so a slow greeting holds nobody up.
fn accept(listener: &TcpListener, gate: &Gate, tls: Option<&Tls>, env: &Arc<FjallEnv>) {
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
                let tls = tls.cloned();
                let idle = gate.idle();
                let spawned = std::thread::Builder::new().name("koala-state-conn".into()).spawn(move || {
                    let mut stream = match accepted(tls.as_ref(), stream, idle) {
                        Ok(stream) => stream,
                        Err(e) => {
                            return tracing::warn!(error = %e, "state server: refused a connection (TLS)");
                        }
                    };
                    match pending.admit(&mut stream) {
                        Ok(Role::State) => serve(stream, &env),
                        Ok(role) => tracing::error!(?role, "state server: not a state client; dropped"),
                        Err(refusal) => {
                            tracing::warn!(reason = %refusal, "state server: refused a connection")
                        }
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

fn serve(stream: Conn, env: &FjallEnv) {
    let peer = stream.tcp().peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let _ = stream.tcp().set_nodelay(true);
    let Ok((read_half, write_half)) = stream.split() else { return };
    let mut reader = BufReader::with_capacity(64 * 1024, read_half);
    let mut writer = BufWriter::with_capacity(64 * 1024, write_half);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RemoteEnv, StateKey, StateWrite};

    fn token(text: &str) -> Token {
        Token::parse(text, "test").expect("token")
    }

    /// A server listening on every interface (not loopback, so the gate requires the token; it
    /// is reached over 127.0.0.1, which does not change what the listener requires): it does not
    /// start without a token, refuses a client without it or with another one, and serves one
    /// that presents it.
    #[test]
    fn a_server_off_loopback_serves_only_clients_with_the_job_token() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        match StateServer::start("0.0.0.0:0", dir.path(), None, None) {
            Err(StateError::Remote { op: "start", message, .. }) => {
                assert!(message.contains("KOALA_TOKEN") && message.contains("0.0.0.0"), "{message}");
            }
            other => panic!("expected a refusal to start without a token, got {other:?}"),
        }
        let job = token("0123456789abcdef-state");
        let server = StateServer::start("0.0.0.0:0", dir.path(), Some(job.clone()), None)?;
        assert!(server.addr().ip().is_unspecified());
        let addr = format!("127.0.0.1:{}", server.addr().port());
        let task = TaskId::new(OperatorId(1), 0);
        let key = StateKey::new(3, 0, b"user-1".to_vec());
        let refused = |presented: Option<Token>, expected: &str| -> Result<(), Box<dyn std::error::Error>> {
            let store = RemoteEnv::new(vec![addr.clone()], presented).open_task(task)?;
            match store.get_many(std::slice::from_ref(&key)) {
                Err(StateError::Remote { message, .. }) => {
                    assert!(message.contains(expected), "{message}");
                }
                other => panic!("expected a refusal ({expected}), got {other:?}"),
            }
            Ok(())
        };
        refused(None, "no job token")?;
        refused(Some(token("fedcba9876543210-state")), "wrong job token")?;
        let store = RemoteEnv::new(vec![addr.clone()], Some(job)).open_task(task)?;
        store.write_many(vec![StateWrite::Put(key.clone(), b"v".to_vec())])?;
        assert_eq!(store.get_many(&[key])?, vec![Some(b"v".to_vec())]);
        Ok(())
    }

    /// On loopback the token is not required (a client without one is served), but a given one
    /// is checked.
    #[test]
    fn a_server_on_loopback_needs_no_token_but_refuses_a_wrong_one() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let server =
            StateServer::start("127.0.0.1:0", dir.path(), Some(token("0123456789abcdef-state")), None)?;
        let task = TaskId::new(OperatorId(1), 0);
        let key = StateKey::new(3, 0, b"user-1".to_vec());
        let open = RemoteEnv::new(vec![server.addr().to_string()], None).open_task(task)?;
        assert_eq!(open.get_many(std::slice::from_ref(&key))?, vec![None]);
        let wrong = RemoteEnv::new(vec![server.addr().to_string()], Some(token("fedcba9876543210-state")))
            .open_task(task)?;
        match wrong.get_many(&[key]) {
            Err(StateError::Remote { message, .. }) => {
                assert!(message.contains("wrong job token"), "{message}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        Ok(())
    }
}
