//! A connection's reader and writer for two threads ([`Conn::split`](super::Conn::split)): the
//! control connections (a reader thread and a writer thread each side) and the state servers'.
//!
//! Plain TCP clones the socket. A TLS session cannot be cloned: both halves share one rustls
//! `Connection` behind a mutex, and each has its own clone of the socket. The rule that keeps
//! them from blocking each other: **the session lock is never held across a blocking socket
//! call.** The reader reads ciphertext from its socket unlocked, then locks to decrypt; the
//! writer locks to encrypt, takes the records out, unlocks, then writes them. Socket writes are
//! ordered by a second lock (`out`), taken before the session lock, so records leave in the order
//! the session made them — also the rare ones the reading side must send (an alert, a key
//! update answer). Lock order: `out`, then `session`; the reader takes `out` only to send such a
//! record, never while holding `session`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};

use super::RECORD_BYTES;
use super::conn::eof_is_end;

/// The reading half of a split [`Conn`](super::Conn).
pub enum ConnReader {
    /// Plain TCP: a clone of the socket.
    Plain(TcpStream),
    /// TLS: the shared session and this half's socket.
    Tls(TlsReader),
}

/// The writing half of a split [`Conn`](super::Conn).
pub enum ConnWriter {
    /// Plain TCP: the socket.
    Plain(TcpStream),
    /// TLS: the shared session.
    Tls(TlsWriter),
}

struct Shared {
    session: Mutex<rustls::Connection>,
    /// The socket records are written to, and a buffer reused for them.
    out: Mutex<(TcpStream, Vec<u8>)>,
}

impl Shared {
    fn session(&self) -> io::Result<MutexGuard<'_, rustls::Connection>> {
        self.session.lock().map_err(|_| io::Error::other("a thread failed while holding the TLS session"))
    }

    fn out(&self) -> io::Result<MutexGuard<'_, (TcpStream, Vec<u8>)>> {
        self.out.lock().map_err(|_| io::Error::other("a thread failed while writing the TLS connection"))
    }

    /// Takes whatever records the session has ready and writes them, in order. `plaintext`:
    /// bytes to encrypt first (the writer's); returns how many the session took.
    fn send(&self, plaintext: &[u8]) -> io::Result<usize> {
        let mut out = self.out()?;
        let (sock, records) = &mut *out;
        records.clear();
        let taken = {
            let mut session = self.session()?;
            let taken = if plaintext.is_empty() { 0 } else { session.writer().write(plaintext)? };
            while session.wants_write() {
                session.write_tls(records)?;
            }
            taken
        };
        sock.write_all(records)?;
        Ok(taken)
    }
}

/// The TLS reading half.
pub struct TlsReader {
    shared: Arc<Shared>,
    sock: TcpStream,
    /// Ciphertext read from the socket and not yet given to the session.
    raw: Box<[u8]>,
    start: usize,
    end: usize,
}

/// The TLS writing half.
pub struct TlsWriter {
    shared: Arc<Shared>,
}

pub(super) fn split_tls(
    session: rustls::Connection,
    sock: TcpStream,
) -> io::Result<(ConnReader, ConnWriter)> {
    let read_sock = sock.try_clone()?;
    let shared = Arc::new(Shared { session: Mutex::new(session), out: Mutex::new((sock, Vec::new())) });
    let reader = TlsReader {
        shared: shared.clone(),
        sock: read_sock,
        raw: vec![0u8; 4 * (RECORD_BYTES + 64)].into_boxed_slice(),
        start: 0,
        end: 0,
    };
    Ok((ConnReader::Tls(reader), ConnWriter::Tls(TlsWriter { shared })))
}

impl ConnReader {
    /// The socket under it (timeouts, addresses).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Tls(r) => &r.sock,
        }
    }
}

impl ConnWriter {
    /// The socket under it (addresses, shutting the connection down).
    pub fn tcp(&self) -> io::Result<TcpStream> {
        match self {
            Self::Plain(s) => s.try_clone(),
            Self::Tls(w) => w.shared.out()?.0.try_clone(),
        }
    }
}

impl Read for ConnReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Plain(s) => s.read(buf),
            Self::Tls(r) => eof_is_end(r.read_tls(buf)),
        }
    }
}

impl TlsReader {
    fn read_tls(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let shared = self.shared.clone();
        loop {
            {
                let mut session = shared.session()?;
                match session.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.start < self.end {
                    let fed = self.feed(&mut session);
                    let answer = session.wants_write();
                    drop(session);
                    if answer || fed.is_err() {
                        // An alert saying why it failed, or a record the session must answer.
                        let sent = shared.send(&[]);
                        fed?;
                        sent?;
                    }
                    // What was fed may have made plaintext: read it first.
                    continue;
                }
            }
            // Nothing buffered: wait for the socket, unlocked.
            let n = self.sock.read(&mut self.raw)?;
            (self.start, self.end) = (0, n);
            if n == 0 {
                let mut session = self.shared.session()?;
                session.read_tls(&mut &[][..])?;
                session.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                return session.reader().read(buf);
            }
        }
    }

    /// Gives buffered ciphertext to the session until it is all taken or the session's
    /// plaintext buffer is full (the caller reads that first).
    fn feed(&mut self, session: &mut rustls::Connection) -> io::Result<()> {
        while self.start < self.end {
            let mut slice = &self.raw[self.start..self.end];
            let taken = match session.read_tls(&mut slice) {
                Ok(taken) => taken,
                // The only error reading from a slice: "received plaintext buffer full". The
                // caller reads that plaintext first and comes back for the rest.
                Err(_) => break,
            };
            self.start += taken;
            session.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if taken == 0 {
                break;
            }
        }
        Ok(())
    }
}

impl ConnWriter {
    /// Tells the peer this side is done (TLS `close_notify`; nothing for plain TCP), so it reads
    /// a clean end rather than a cut.
    pub fn close_notify(&mut self) -> io::Result<()> {
        match self {
            Self::Plain(_) => Ok(()),
            Self::Tls(w) => {
                w.shared.session()?.send_close_notify();
                w.shared.send(&[]).map(|_| ())
            }
        }
    }
}

impl Write for ConnWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Plain(s) => s.write(buf),
            Self::Tls(w) => match w.shared.send(buf)? {
                // The session's send buffer is full only if a write failed half-way; say so
                // rather than spin.
                0 if !buf.is_empty() => {
                    Err(io::Error::new(io::ErrorKind::WriteZero, "the TLS session took no bytes"))
                }
                n => Ok(n),
            },
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Plain(s) => s.flush(),
            // Every write already left for the socket.
            Self::Tls(_) => Ok(()),
        }
    }
}
