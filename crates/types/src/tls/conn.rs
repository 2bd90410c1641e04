//! [`Conn`]: one koala connection, plain TCP or TLS, read and written like a `TcpStream`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use rustls::{ClientConnection, ServerConnection, StreamOwned};

use super::split::{ConnReader, ConnWriter, split_tls};

/// A connection the handshake ([`crate::handshake`]) runs on: bytes both ways, and the socket
/// under it for timeouts and addresses.
pub trait Transport: Read + Write {
    /// The TCP socket under the connection.
    fn tcp(&self) -> &TcpStream;
}

impl Transport for &TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Transport for &mut Conn {
    fn tcp(&self) -> &TcpStream {
        Conn::tcp(self)
    }
}

/// One connection: plain TCP (TLS off, the default) or TLS (either side). The plain variant
/// costs a match per call over a bare `TcpStream`; callers buffer (`BufReader`/`BufWriter`), so
/// that is a match per 64 KiB.
pub enum Conn {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS, dialling side.
    Client(Box<StreamOwned<ClientConnection, TcpStream>>),
    /// TLS, listening side.
    Server(Box<StreamOwned<ServerConnection, TcpStream>>),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Self::Plain(_) => "plain",
            Self::Client(_) => "tls-client",
            Self::Server(_) => "tls-server",
        };
        write!(f, "Conn({kind}, {:?})", self.tcp().peer_addr().ok())
    }
}

impl From<TcpStream> for Conn {
    fn from(tcp: TcpStream) -> Self {
        Self::Plain(tcp)
    }
}

impl Conn {
    /// The TCP socket under it (timeouts, addresses, `TCP_NODELAY`).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Client(s) => &s.sock,
            Self::Server(s) => &s.sock,
        }
    }

    /// Whether it is TLS.
    pub fn is_tls(&self) -> bool {
        !matches!(self, Self::Plain(_))
    }

    /// A reader and a writer for two threads. Plain TCP: the socket cloned, as before TLS. TLS:
    /// one session shared by both, never locked across a blocking socket call (`split`).
    pub fn split(self) -> io::Result<(ConnReader, ConnWriter)> {
        match self {
            Self::Plain(s) => Ok((ConnReader::Plain(s.try_clone()?), ConnWriter::Plain(s))),
            Self::Client(s) => {
                let StreamOwned { conn, sock } = *s;
                split_tls(rustls::Connection::Client(conn), sock)
            }
            Self::Server(s) => {
                let StreamOwned { conn, sock } = *s;
                split_tls(rustls::Connection::Server(conn), sock)
            }
        }
    }

    /// The connection as a reader only (the receiving end of a data channel). Plain TCP: the
    /// socket itself. TLS: the reading half of [`Conn::split`], which reads ciphertext from the
    /// socket in 64 KiB chunks; rustls's own stream reads 4 KiB per system call.
    pub fn into_reader(self) -> io::Result<ConnReader> {
        match self {
            Self::Plain(s) => Ok(ConnReader::Plain(s)),
            tls => tls.split().map(|(reader, _)| reader),
        }
    }

    /// Completes a TLS handshake by `deadline` (the socket's read timeout bounds each read).
    pub(super) fn handshake(&mut self, deadline: Instant) -> io::Result<()> {
        loop {
            let done = match self {
                Self::Plain(_) => return Ok(()),
                Self::Client(s) if s.conn.is_handshaking() => s.conn.complete_io(&mut s.sock),
                Self::Server(s) if s.conn.is_handshaking() => s.conn.complete_io(&mut s.sock),
                Self::Client(_) | Self::Server(_) => return Ok(()),
            };
            if done? == (0, 0) {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed during the TLS handshake",
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no TLS handshake within the limit"));
            }
            self.tcp().set_read_timeout(Some(left))?;
        }
    }
}

impl Read for Conn {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Plain(s) => s.read(buf),
            Self::Client(s) => eof_is_end(s.read(buf)),
            Self::Server(s) => eof_is_end(s.read(buf)),
        }
    }
}

/// A TLS peer that closes its socket without `close_notify` ends the stream as a plain TCP peer
/// does (rustls reports `UnexpectedEof`): every koala stream is framed, so a cut inside a frame
/// is still an error (a short frame), and one between frames is the end, as without TLS.
pub(super) fn eof_is_end(read: io::Result<usize>) -> io::Result<usize> {
    match read {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
        other => other,
    }
}

impl Write for Conn {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Plain(s) => s.write(buf),
            Self::Client(s) => s.write(buf),
            Self::Server(s) => s.write(buf),
        }
    }

    #[inline]
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Plain(s) => s.flush(),
            Self::Client(s) => s.flush(),
            Self::Server(s) => s.flush(),
        }
    }
}
