//! The connecting side of a coordinator's control port (`koala worker --coordinator`, `koala
//! rescale|rebalance|migrate --coordinator`): every step is bounded, and a peer that is not a
//! control port is named. The usual mistake is the coordinator's other port, its HTTP API
//! (dashboard), which `koala run` prints beside the control address: it reads the binary greeting
//! as the start of an HTTP request and waits for the rest, so without a bound the command would
//! hang silently. A koala listener answers the greeting at once; one that has not answered
//! within [`ControlLimits::probe_after`] is asked, on a second connection, whether it speaks
//! HTTP, and if so the error says so and gives the control address the API reports.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::{Role, Token, greeting_bytes, read_verdict};
use crate::tls::{Conn, Tls};

/// Bounds on connecting to a control port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlLimits {
    /// Connecting, per address the name resolves to.
    pub connect: Duration,
    /// Waiting for the verdict before asking whether the peer speaks HTTP.
    pub probe_after: Duration,
    /// Waiting for the verdict in all.
    pub verdict: Duration,
}

impl Default for ControlLimits {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            probe_after: Duration::from_secs(1),
            verdict: Duration::from_secs(15),
        }
    }
}

/// Connects to the control port at `addr` (over TLS when `tls` is given, checking the port's
/// certificate) and passes its greeting as `role` (presenting `token`), within `limits`. Errors say what was reached when it is not a control port: the
/// coordinator's HTTP API (kind `InvalidInput`, naming the control address), another program
/// that answered something else, or one that answered nothing (kind `TimedOut`).
pub fn connect_control(
    addr: &str,
    role: Role,
    token: Option<&Token>,
    tls: Option<&Tls>,
    limits: ControlLimits,
) -> io::Result<Conn> {
    let tcp = connect_any(addr, limits.connect)?;
    let _ = tcp.set_nodelay(true);
    let mut stream = match tls {
        Some(tls) => tls.connect(tcp, addr)?,
        None => Conn::Plain(tcp),
    };
    stream.write_all(&greeting_bytes(role, token)?)?;
    stream.flush()?;
    let started = Instant::now();
    let mut first = [0u8; 5];
    stream.tcp().set_read_timeout(Some(limits.probe_after))?;
    let mut answered = first_bytes(&mut stream, &mut first)?;
    if answered.is_none() {
        if let Some(http) = http_answer(addr, limits.connect, token, tls) {
            return Err(http_api_error(addr, &http));
        }
        let left = limits.verdict.saturating_sub(started.elapsed()).max(Duration::from_millis(1));
        stream.tcp().set_read_timeout(Some(left))?;
        answered = first_bytes(&mut stream, &mut first)?;
    }
    // `Some(0)`, closed without a word, goes on to `read_verdict`, which says what that means.
    let Some(answered) = answered else {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "{addr} accepted the connection but did not answer the koala greeting within {:.1} s: it \
                 is not a koala coordinator's control port (or the coordinator is stuck); give \
                 --coordinator the control address, which `koala run` prints as `coordinator at ADDR` \
                 and `koala coordinator` as `coordinator listening on ADDR`",
                limits.verdict.as_secs_f64()
            ),
        ));
    };
    // A verdict's second byte is its length's, at most 0x10: never the `T` of `HTTP/`.
    if answered >= 2 && b"HTTP/".starts_with(&first[..answered]) {
        return Err(http_api_error(addr, &String::from_utf8_lossy(&first[..answered])));
    }
    let verdict = read_verdict(&mut (&first[..answered]).chain(&mut stream));
    stream.tcp().set_read_timeout(None)?;
    verdict.map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{addr} is not a koala control port ({e}); check --coordinator"),
        ),
        _ => e,
    })?;
    Ok(stream)
}

/// Connects to the first address `addr` resolves to that accepts within `limit`.
fn connect_any(addr: &str, limit: Duration) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr} resolves to no address"));
    for a in addrs {
        match TcpStream::connect_timeout(&a, limit) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The peer's first bytes (at most `buf.len()`): `None` if none came within the read timeout,
/// `Some(0)` if it closed the connection. The caller reads the rest after them.
fn first_bytes(stream: &mut Conn, buf: &mut [u8]) -> io::Result<Option<usize>> {
    match stream.read(buf) {
        Ok(n) => Ok(Some(n)),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Asks `addr`, on a new connection, for the coordinator API's `/api/job` (presenting `token`,
/// which an API off loopback requires; the greeting already gave it to `addr`); its answer if
/// it speaks HTTP.
fn http_answer(addr: &str, limit: Duration, token: Option<&Token>, tls: Option<&Tls>) -> Option<String> {
    let tcp = connect_any(addr, limit).ok()?;
    tcp.set_read_timeout(Some(limit)).ok()?;
    tcp.set_write_timeout(Some(limit)).ok()?;
    let mut stream = match tls {
        Some(tls) => tls.connect(tcp, addr).ok()?,
        None => Conn::Plain(tcp),
    };
    let auth = token.map(|t| format!("Authorization: Bearer {}\r\n", t.expose())).unwrap_or_default();
    stream.write_all(format!("GET /api/job HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n").as_bytes()).ok()?;
    let mut answer = Vec::new();
    let _ = stream.take(64 * 1024).read_to_end(&mut answer);
    answer.starts_with(b"HTTP/").then(|| String::from_utf8_lossy(&answer).into_owned())
}

/// The error for a peer that answered in HTTP: with the control address the API reports, if it
/// is a koala coordinator's.
fn http_api_error(addr: &str, answer: &str) -> io::Error {
    let fix = match control_addr_in(answer) {
        Some(control) => format!("use --coordinator {}", reachable(&control, addr)),
        None => "give --coordinator the control address".to_string(),
    };
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{addr} answers in HTTP: it is the coordinator's HTTP API (dashboard), not its control \
             port; {fix} (`koala run` prints it as `coordinator at ADDR`, `koala coordinator` as \
             `coordinator listening on ADDR`)"
        ),
    )
}

/// `"control_addr": "…"` of an `/api/job` answer.
fn control_addr_in(answer: &str) -> Option<String> {
    let rest = &answer[answer.find("\"control_addr\"")? + "\"control_addr\"".len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_string())
}

/// `control` as reached from here: a wildcard host (`0.0.0.0:7000`) is replaced by the host of
/// `asked` (the address the user gave).
fn reachable(control: &str, asked: &str) -> String {
    let Ok(control_addr) = control.parse::<SocketAddr>() else { return control.to_string() };
    if !control_addr.ip().is_unspecified() {
        return control.to_string();
    }
    let host = asked.rsplit_once(':').map_or(asked, |(host, _)| host);
    format!("{host}:{}", control_addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_address_is_read_from_the_api_answer() {
        let answer =
            "HTTP/1.1 200 OK\r\n\r\n{\"run\":\"r\",\"control_addr\": \"0.0.0.0:7000\",\"query\":\"q\"}";
        let control = control_addr_in(answer);
        assert_eq!(control.as_deref(), Some("0.0.0.0:7000"));
        assert_eq!(reachable("0.0.0.0:7000", "10.0.0.1:8080"), "10.0.0.1:7000");
        assert_eq!(reachable("127.0.0.1:7000", "127.0.0.1:8080"), "127.0.0.1:7000");
        let e = http_api_error("10.0.0.1:8080", answer).to_string();
        assert!(
            e.contains("HTTP API (dashboard), not its control port; use --coordinator 10.0.0.1:7000"),
            "{e}"
        );
    }

    /// A peer that accepts and never answers (an HTTP server waiting for the rest of a request)
    /// ends the attempt within the bound, with an error naming what to check.
    #[test]
    fn a_silent_peer_is_named_within_the_bound() -> io::Result<()> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        let held = std::thread::spawn(move || {
            let mut open = Vec::new();
            // The greeting's connection and the HTTP probe's; both kept open and unanswered.
            for _ in 0..2 {
                if let Ok((s, _)) = listener.accept() {
                    open.push(s);
                }
            }
            std::thread::sleep(Duration::from_millis(1500));
        });
        let limits = ControlLimits {
            connect: Duration::from_millis(200),
            probe_after: Duration::from_millis(100),
            verdict: Duration::from_millis(500),
        };
        let started = Instant::now();
        let e = connect_control(&addr, Role::Client, None, None, limits).expect_err("no verdict");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("not a koala coordinator's control port"), "{e}");
        let _ = held.join();
        Ok(())
    }
}
