//! The greeting every koala connection opens with (control plane, data plane, state servers):
//! the build's protocol version and, where the listener demands one, the job token. It is the
//! only thing a listener reads from a peer it does not trust yet, so it is small, fixed in
//! layout across versions, and bounded in size ([`MAX_GREETING_BYTES`]), time and number
//! ([`GateLimits`]) — docs/deploy.md §Security.
//!
//! On the wire both the greeting and the listener's verdict are one length-prefixed frame
//! (`u32` little-endian length, then the payload) with a layout that never changes, so two
//! builds of different versions still understand each other well enough to say why they cannot
//! talk:
//!
//! - greeting: `b"KOAL"`, version `u32`, role `u8` ([`Role`]), token length `u16`, token bytes;
//! - verdict: `b"KOAL"`, version `u32`, status `u8` (0 admitted, 1 refused), reason length `u16`,
//!   reason (UTF-8).
//!
//! ```
//! use koala_types::handshake::{Gate, GateLimits, Role, Token, greet};
//! use std::net::{TcpListener, TcpStream};
//!
//! let token = Token::parse("correct-horse-battery-staple", "KOALA_TOKEN").unwrap();
//! let listener = TcpListener::bind("127.0.0.1:0").unwrap();
//! let gate = Gate::new("example", Some(token.clone()), true, GateLimits::default());
//! let addr = listener.local_addr().unwrap();
//! let peer = std::thread::spawn(move || greet(&TcpStream::connect(addr).unwrap(), Role::Client, Some(&token)));
//! let (stream, _) = listener.accept().unwrap();
//! let pending = gate.enter(&stream).unwrap();
//! assert_eq!(pending.admit(&stream).unwrap(), Role::Client);
//! peer.join().unwrap().unwrap();
//! ```

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};

use crate::tls::Transport;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The version of everything koala sends over a socket (control messages, channel messages,
/// state-server requests). **Bump it by hand in every change that alters a wire type** (any
/// serde type in `koala_protocol::control`, `koala_types::message`, `koala_state::remote`, the
/// protocols' peer messages), and pin [`WIRE_SCHEMA_DIGEST`] again: two builds with different
/// numbers refuse each other at the greeting instead of misreading frames.
pub const PROTOCOL_VERSION: u32 = 5;

/// The digest of the wire schema [`PROTOCOL_VERSION`] stands for, and the version it was pinned
/// with. A test (`koala-runtime`'s `wire_schema`) recomputes it from the wire types themselves —
/// every field and variant, in order, down to nested types — and fails naming the new digest
/// when a wire type changed: then bump the version and pin the new digest with it, never the
/// digest alone (docs/deploy.md §Security).
pub const WIRE_SCHEMA_DIGEST: WireSchemaPin = WireSchemaPin { version: 5, digest: 0x758e_b28d_4cf8_bce7 };

/// A wire schema digest and the protocol version it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireSchemaPin {
    /// The [`PROTOCOL_VERSION`] it was pinned with.
    pub version: u32,
    /// xxh3-64 of the schema's text.
    pub digest: u64,
}

/// Largest greeting a listener reads; a longer length prefix is refused before anything is
/// allocated for it.
pub const MAX_GREETING_BYTES: usize = 4096;

const MAGIC: [u8; 4] = *b"KOAL";
/// Shortest token accepted (bytes): guessing it must be hopeless.
const MIN_TOKEN_BYTES: usize = 16;
/// Longest token accepted (it must fit the greeting).
const MAX_TOKEN_BYTES: usize = 1024;

/// Who is greeting: tells the listener what frames follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A worker registering with the coordinator.
    Worker,
    /// A client (`koala rescale` …) submitting one request to the coordinator.
    Client,
    /// A task's channel to a task of another worker.
    Channel,
    /// A worker's connection to a state server.
    State,
}

impl Role {
    fn byte(self) -> u8 {
        match self {
            Self::Worker => 0,
            Self::Client => 1,
            Self::Channel => 2,
            Self::State => 3,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0 => Self::Worker,
            1 => Self::Client,
            2 => Self::Channel,
            3 => Self::State,
            _ => return None,
        })
    }
}

/// The job token: a shared secret every connection presents. `Debug` and `Display` show only
/// [`Token::redacted`], so it never reaches a log in full.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

impl Token {
    /// A fresh random token: 32 bytes of `/dev/urandom`, hex-encoded.
    pub fn generate() -> io::Result<Self> {
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(|e| io::Error::new(e.kind(), format!("reading /dev/urandom for a job token: {e}")))?;
        Ok(Self(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>().into()))
    }

    /// A token given by the user (`source` names where it came from, for errors): surrounding
    /// whitespace is trimmed; it must be 16 to 1024 printable ASCII characters.
    pub fn parse(text: &str, source: &str) -> Result<Self, String> {
        let t = text.trim();
        if t.len() < MIN_TOKEN_BYTES || t.len() > MAX_TOKEN_BYTES {
            return Err(format!(
                "{source}: a token of {} characters; it must have {MIN_TOKEN_BYTES} to {MAX_TOKEN_BYTES} \
                 (e.g. `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'`)",
                t.len()
            ));
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!("{source}: the token must be printable ASCII without spaces"));
        }
        Ok(Self(t.into()))
    }

    /// The token in full, to hand to a worker process (environment `KOALA_TOKEN`).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Its first 4 characters and its length, for logs.
    pub fn redacted(&self) -> String {
        format!("{}… ({} chars)", &self.0[..4.min(self.0.len())], self.0.len())
    }

    /// Whether `other` is this token, compared in time independent of where the first
    /// difference is.
    pub fn matches(&self, other: &[u8]) -> bool {
        let ours = self.0.as_bytes();
        ours.len() == other.len() && ours.iter().zip(other).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({})", self.redacted())
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Whether a listener on `ip` is reachable from this host only (then the token is not required).
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}

/// Why a listener refused a connection; the text is sent to the peer and logged by both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The peer speaks another protocol version.
    Version {
        /// The listener's.
        ours: u32,
        /// The peer's.
        theirs: u32,
        /// What the peer greeted as.
        role: Role,
    },
    /// No token, on a listener that requires one.
    NoToken,
    /// A token that is not the job's.
    WrongToken,
    /// A greeting whose length prefix exceeds [`MAX_GREETING_BYTES`].
    Oversize(usize),
    /// No complete greeting within the idle limit.
    Idle(Duration),
    /// Too many connections were already waiting for their greeting.
    TooMany(usize),
    /// Not a koala greeting (another program, or a build older than the greeting).
    Malformed(String),
    /// A plaintext greeting on a listener that runs TLS.
    NeedsTls,
    /// A TLS handshake on a listener that runs without TLS.
    UnexpectedTls,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Version { ours, theirs, .. } => write!(
                f,
                "protocol version mismatch: the listener speaks version {ours}, the peer version {theirs}; \
                 run the same koala build on every host"
            ),
            Self::NoToken => f.write_str(
                "no job token: this listener is not on loopback and requires one \
                 (KOALA_TOKEN, --token-file or [coordinator] token_file)",
            ),
            Self::WrongToken => {
                f.write_str("wrong job token: it is not this job's (KOALA_TOKEN, --token-file)")
            }
            Self::Oversize(len) => write!(
                f,
                "a greeting of {len} bytes exceeds the {MAX_GREETING_BYTES}-byte limit before authentication"
            ),
            Self::Idle(d) => write!(f, "no greeting within {} ms of connecting", d.as_millis()),
            Self::TooMany(n) => write!(f, "{n} connections are already waiting to be admitted; retry later"),
            Self::Malformed(why) => {
                write!(f, "not a koala greeting ({why}); is the peer an older koala build?")
            }
            Self::NeedsTls => f.write_str(
                "this listener runs TLS and the peer greeted in plaintext: give the peer the job's CA                  ([tls] ca, --tls-ca)",
            ),
            Self::UnexpectedTls => f.write_str(
                "the peer opened a TLS handshake and this listener runs without TLS: give the listener                  [tls] cert, key and ca (--tls-cert, --tls-key, --tls-ca), or the peer none",
            ),
        }
    }
}

/// Bounds on connections that have not been admitted yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateLimits {
    /// How long a new connection may take to send its greeting.
    pub idle: Duration,
    /// Connections waiting for their greeting at once; more are refused at once.
    pub max_pending: usize,
}

impl Default for GateLimits {
    fn default() -> Self {
        Self { idle: Duration::from_secs(5), max_pending: 64 }
    }
}

/// A listener's admission rule: version, token, limits. Cheap to clone (shared counter).
#[derive(Clone, Debug)]
pub struct Gate {
    name: &'static str,
    token: Option<Token>,
    required: bool,
    limits: GateLimits,
    pending: Arc<AtomicUsize>,
}

impl Gate {
    /// The gate of listener `name` (for messages). `required`: whether a peer without the token
    /// is refused (listeners not on loopback); a given token is checked either way.
    pub fn new(name: &'static str, token: Option<Token>, required: bool, limits: GateLimits) -> Self {
        Self { name, token, required, limits, pending: Arc::new(AtomicUsize::new(0)) }
    }

    /// The gate of a listener bound to `ip`: the token is required unless `ip` is loopback.
    /// Errors (naming the fix) when it is required and there is none.
    pub fn for_listener(
        name: &'static str,
        ip: IpAddr,
        token: Option<Token>,
        limits: GateLimits,
    ) -> Result<Self, String> {
        let required = !is_loopback(ip);
        if required && token.is_none() {
            return Err(format!(
                "the {name} listens on {ip}, which is not loopback: give a job token \
                 (environment KOALA_TOKEN, --token-file, or [coordinator] token_file), or listen on 127.0.0.1"
            ));
        }
        Ok(Self::new(name, token, required, limits))
    }

    /// How long a new connection may take to be admitted (its TLS handshake, then its greeting).
    pub fn idle(&self) -> Duration {
        self.limits.idle
    }

    /// The listener's name, for logs.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Counts a new connection as waiting for its greeting, on the accepting thread. Refuses it
    /// (answering the peer why) if [`GateLimits::max_pending`] already wait.
    pub fn enter(&self, stream: &TcpStream) -> Result<Pending, Refusal> {
        if self.pending.fetch_add(1, Ordering::SeqCst) >= self.limits.max_pending {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            let refusal = Refusal::TooMany(self.limits.max_pending);
            // The peer may not read; never let it hold the accepting thread.
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = write_verdict(&mut &*stream, Some(&refusal));
            return Err(refusal);
        }
        Ok(Pending { gate: self.clone() })
    }
}

/// A connection counted against [`GateLimits::max_pending`] until it is admitted or dropped.
#[derive(Debug)]
pub struct Pending {
    gate: Gate,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.gate.pending.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pending {
    /// Reads the greeting (within the idle limit, at most [`MAX_GREETING_BYTES`]), checks it
    /// and answers the verdict. The caller logs a refusal (the peer prints it too).
    pub fn admit(self, mut stream: impl Transport) -> Result<Role, Refusal> {
        let gate = &self.gate;
        let mut timed = DeadlineReader { stream: &mut stream, until: Instant::now() + gate.limits.idle };
        let outcome = read_greeting(&mut timed, gate.limits.idle).and_then(|(version, role, token)| {
            match (&gate.token, token.as_deref()) {
                (Some(ours), Some(theirs)) if !ours.matches(theirs) => return Err(Refusal::WrongToken),
                (None, Some(_)) if gate.required => return Err(Refusal::WrongToken),
                (_, None) if gate.required => return Err(Refusal::NoToken),
                _ => {}
            }
            // After the token: an unauthenticated peer learns nothing, not even our version.
            if version != PROTOCOL_VERSION {
                return Err(Refusal::Version { ours: PROTOCOL_VERSION, theirs: version, role });
            }
            Ok(role)
        });
        let _ = stream.tcp().set_read_timeout(None);
        // Its place frees before the verdict goes out: a peer that connects again on reading it
        // must find the place free.
        drop(self);
        let _ = stream.tcp().set_write_timeout(Some(Duration::from_secs(1)));
        let _ = write_verdict(&mut stream, outcome.as_ref().err());
        let _ = stream.tcp().set_write_timeout(None);
        outcome
    }
}

/// Reads from a stream until a deadline, however the peer trickles its bytes.
struct DeadlineReader<'a, T: Transport> {
    stream: &'a mut T,
    until: Instant,
}

impl<T: Transport> Read for DeadlineReader<'_, T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "greeting deadline"));
        }
        self.stream.tcp().set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Reads and parses a greeting: (version, role, token). What [`Pending::admit`] reads from a
/// peer it does not trust yet (public for the fuzz targets).
pub fn read_greeting(r: &mut impl Read, idle: Duration) -> Result<(u32, Role, Option<Vec<u8>>), Refusal> {
    let timed_out = |e: &io::Error| matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut);
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(|e| {
        if timed_out(&e) { Refusal::Idle(idle) } else { Refusal::Malformed(format!("no length: {e}")) }
    })?;
    let header = len;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_GREETING_BYTES {
        // A TLS record header: content type 22 (handshake), version 3.x (never a greeting's
        // length, which is at most 4 KiB).
        if header[0] == 0x16 && header[1] == 0x03 {
            return Err(Refusal::UnexpectedTls);
        }
        return Err(Refusal::Oversize(len));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).map_err(|e| {
        if timed_out(&e) { Refusal::Idle(idle) } else { Refusal::Malformed(format!("truncated: {e}")) }
    })?;
    let short = || Refusal::Malformed(format!("{len} bytes are too few"));
    if buf.get(..4) != Some(&MAGIC[..]) {
        return Err(Refusal::Malformed("it does not start with KOAL".into()));
    }
    let version = u32::from_le_bytes(buf.get(4..8).ok_or_else(short)?.try_into().map_err(|_| short())?);
    let role = *buf.get(8).ok_or_else(short)?;
    let role = Role::from_byte(role).ok_or_else(|| Refusal::Malformed(format!("unknown role {role}")))?;
    let token_len = u16::from_le_bytes(buf.get(9..11).ok_or_else(short)?.try_into().map_err(|_| short())?);
    let token = buf.get(11..11 + token_len as usize).ok_or_else(short)?;
    Ok((version, role, (!token.is_empty()).then(|| token.to_vec())))
}

/// Writes the verdict refusing a connection (a listener that refuses before the greeting: TLS).
pub(crate) fn write_refusal(w: &mut impl Write, refusal: &Refusal) -> io::Result<()> {
    write_verdict(w, Some(refusal))
}

fn write_verdict(w: &mut impl Write, refusal: Option<&Refusal>) -> io::Result<()> {
    let reason = refusal.map(ToString::to_string).unwrap_or_default();
    let reason = &reason.as_bytes()[..reason.len().min(MAX_GREETING_BYTES - 16)];
    let mut payload = Vec::with_capacity(11 + reason.len());
    payload.extend_from_slice(&MAGIC);
    payload.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    payload.push(u8::from(refusal.is_some()));
    payload.extend_from_slice(&(reason.len() as u16).to_le_bytes());
    payload.extend_from_slice(reason);
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&payload);
    w.write_all(&frame)?;
    w.flush()
}

/// The connecting side: sends the greeting as `role` (with `token`, if any) and waits for the
/// verdict. A refusal is an error of kind `PermissionDenied` whose text names both versions and
/// the listener's reason.
pub fn greet(mut stream: impl Transport, role: Role, token: Option<&Token>) -> io::Result<()> {
    greeting_bytes(role, token).and_then(|g| stream.write_all(&g))?;
    stream.flush()?;
    // The verdict comes at once from a koala listener; bound the wait for anything else.
    let previous = stream.tcp().read_timeout()?;
    stream.tcp().set_read_timeout(Some(Duration::from_secs(30)))?;
    let verdict = read_verdict(&mut stream);
    stream.tcp().set_read_timeout(previous)?;
    verdict
}

/// The greeting as bytes (tests send it by hand, with other versions).
pub fn greeting_bytes(role: Role, token: Option<&Token>) -> io::Result<Vec<u8>> {
    greeting_bytes_of(PROTOCOL_VERSION, role, token.map(|t| t.expose().as_bytes()).unwrap_or_default())
}

/// A greeting with any version and token bytes (tests: a peer of another build).
pub fn greeting_bytes_of(version: u32, role: Role, token: &[u8]) -> io::Result<Vec<u8>> {
    let token_len = u16::try_from(token.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the token exceeds 64 KiB"))?;
    let mut payload = Vec::with_capacity(11 + token.len());
    payload.extend_from_slice(&MAGIC);
    payload.extend_from_slice(&version.to_le_bytes());
    payload.push(role.byte());
    payload.extend_from_slice(&token_len.to_le_bytes());
    payload.extend_from_slice(token);
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Reads a listener's verdict: `Ok` if admitted; a refusal as `PermissionDenied` naming both
/// versions (`this build speaks …, the listener …`) and the listener's reason.
pub fn read_verdict(r: &mut impl Read) -> io::Result<()> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!(
                "the listener closed the connection without answering the greeting (this build speaks \
                 protocol version {PROTOCOL_VERSION}; a koala build older than the greeting closes it so)"
            ),
        ),
        _ => e,
    })?;
    let len = u32::from_le_bytes(len) as usize;
    let bad =
        |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("the listener's verdict: {why}"));
    if !(11..=MAX_GREETING_BYTES).contains(&len) {
        return Err(bad(&format!("{len} bytes is not a koala verdict")));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    if buf[..4] != MAGIC {
        return Err(bad("it does not start with KOAL"));
    }
    let theirs = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let reason_len = u16::from_le_bytes([buf[9], buf[10]]) as usize;
    let reason = String::from_utf8_lossy(buf.get(11..11 + reason_len).unwrap_or_default());
    match buf[8] {
        0 => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refused by the listener (this build speaks protocol version {PROTOCOL_VERSION}, \
                 the listener version {theirs}): {reason}"
            ),
        )),
    }
}

mod client;
pub use client::{ControlLimits, connect_control};

#[cfg(test)]
mod tests;
