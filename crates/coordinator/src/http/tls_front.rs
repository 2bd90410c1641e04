//! HTTPS for the coordinator's API: a TLS front on the public port that relays each connection,
//! decrypted, to `tiny_http` listening on a loopback port of its own.
//!
//! Why a relay: tiny_http 0.12 takes only a `TcpListener` (or a Unix socket) and its own TLS
//! feature pins rustls 0.20, a second, older rustls beside the one every other koala listener
//! uses. The relay keeps one rustls, one certificate loader and one handshake path, for two
//! threads per open HTTP connection — the API is for people and Prometheus, a few requests a
//! second. The loopback port carries plaintext, but every route there still asks for the job
//! token when the public port is not on loopback (the rule is the public port's, `super::auth`).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use koala_types::tls::{ConnReader, ConnWriter, Tls};

/// How long a new connection may take for its TLS handshake.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);
/// Connections relayed at once; more are closed at once.
const MAX_CONNECTIONS: usize = 2 * super::MAX_IN_FLIGHT;

/// The TLS front of one HTTP server; stops (and closes its port) when dropped.
pub struct TlsFront {
    public: SocketAddr,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TlsFront {
    /// Accepts TLS on `listener` and relays every connection to `inner`.
    pub fn start(listener: TcpListener, inner: SocketAddr, tls: Tls) -> io::Result<Self> {
        let public = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("koala-https".into())
            .spawn(move || accept(&listener, inner, &tls, &stop))?;
        Ok(Self { public, stopping, thread: Some(thread) })
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees `stopping`.
        let mut wake = self.public;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() {
                [127, 0, 0, 1].into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept(listener: &TcpListener, inner: SocketAddr, tls: &Tls, stopping: &AtomicBool) {
    let open = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(tcp) = conn else { continue };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (tls, open) = (tls.clone(), open.clone());
        let spawned = std::thread::Builder::new().name("koala-https-conn".into()).spawn(move || {
            let peer = tcp.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
            if let Err(e) = relay(tcp, inner, &tls) {
                tracing::debug!(%peer, error = %e, "HTTPS connection ended");
            }
            open.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot spawn an HTTPS relay thread; connection dropped");
        }
    }
}

/// Runs one connection: the handshake, then bytes both ways until either side closes.
fn relay(tcp: TcpStream, inner: SocketAddr, tls: &Tls) -> io::Result<()> {
    let conn = tls.accept(tcp, HANDSHAKE_LIMIT)?;
    let _ = conn.tcp().set_nodelay(true);
    let plain = TcpStream::connect(inner)?;
    let _ = plain.set_nodelay(true);
    let (from_client, to_client) = conn.split()?;
    let plain_in = plain.try_clone()?;
    let upstream = std::thread::Builder::new()
        .name("koala-https-up".into())
        .spawn(move || client_to_server(from_client, plain_in))?;
    let down = server_to_client(plain, to_client);
    let _ = upstream.join();
    down
}

fn client_to_server(mut from: ConnReader, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    // The request side is done: tiny_http answers what it has, then closes.
    let _ = to.shutdown(Shutdown::Write);
}

fn server_to_client(mut from: TcpStream, mut to: ConnWriter) -> io::Result<()> {
    let mut buf = vec![0u8; koala_types::tls::RECORD_BYTES];
    let copied = loop {
        match from.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                if let Err(e) = to.write_all(&buf[..n]) {
                    break Err(e);
                }
            }
            Err(e) => break Err(e),
        }
    };
    // Ends the client's side too, so the reading thread (and `relay`) finish.
    let _ = to.close_notify();
    if let Ok(tcp) = to.tcp() {
        let _ = tcp.shutdown(Shutdown::Both);
    }
    let _ = from.shutdown(Shutdown::Both);
    copied
}
