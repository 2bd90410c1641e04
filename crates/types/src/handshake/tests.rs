//! The gate against fake peers over real sockets: each refusal reaches the peer with its reason.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::*;

fn token(text: &str) -> Token {
    Token::parse(text, "test").expect("token")
}

/// Runs `peer` against one accepted connection of `gate`: the listener's outcome and the peer's.
fn exchange<T: Send + 'static>(
    gate: &Gate,
    peer: impl FnOnce(TcpStream) -> T + Send + 'static,
) -> (Result<Role, Refusal>, T) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let peer = std::thread::spawn(move || peer(TcpStream::connect(addr).expect("connect")));
    let (stream, _) = listener.accept().expect("accept");
    let outcome = gate.enter(&stream).and_then(|p| p.admit(&stream));
    (outcome, peer.join().expect("peer"))
}

fn strict(limits: GateLimits) -> Gate {
    Gate::new("test listener", Some(token("0123456789abcdef-job")), true, limits)
}

#[test]
fn the_right_token_and_version_are_admitted_with_their_role() {
    let t = token("0123456789abcdef-job");
    let (outcome, peer) =
        exchange(&strict(GateLimits::default()), move |s| greet(&s, Role::Worker, Some(&t)));
    assert_eq!(outcome, Ok(Role::Worker));
    peer.expect("admitted");
}

#[test]
fn another_version_is_refused_and_both_sides_name_both_versions() {
    let theirs = PROTOCOL_VERSION + 7;
    let (outcome, peer) = exchange(&strict(GateLimits::default()), move |mut s| {
        s.write_all(&greeting_bytes_of(theirs, Role::Worker, b"0123456789abcdef-job").expect("bytes"))
            .expect("send");
        read_verdict(&mut s)
    });
    let refusal = outcome.expect_err("refused");
    assert_eq!(refusal, Refusal::Version { ours: PROTOCOL_VERSION, theirs, role: Role::Worker });
    let listener_says = refusal.to_string();
    assert!(listener_says.contains(&format!("version {PROTOCOL_VERSION}")), "{listener_says}");
    assert!(listener_says.contains(&format!("version {theirs}")), "{listener_says}");
    let peer_says = peer.expect_err("the peer hears the refusal");
    assert_eq!(peer_says.kind(), ErrorKind::PermissionDenied);
    let text = peer_says.to_string();
    assert!(text.contains(&format!("the listener version {PROTOCOL_VERSION}")), "{text}");
    assert!(text.contains(&format!("the peer version {theirs}")), "{text}");
}

#[test]
fn a_missing_or_wrong_token_is_refused_on_a_listener_that_requires_one() {
    let (outcome, peer) = exchange(&strict(GateLimits::default()), |s| greet(&s, Role::Client, None));
    assert_eq!(outcome, Err(Refusal::NoToken));
    assert!(peer.expect_err("refused").to_string().contains("no job token"));
    let wrong = token("fedcba9876543210-job");
    let (outcome, peer) =
        exchange(&strict(GateLimits::default()), move |s| greet(&s, Role::Client, Some(&wrong)));
    assert_eq!(outcome, Err(Refusal::WrongToken));
    assert!(peer.expect_err("refused").to_string().contains("wrong job token"));
}

#[test]
fn loopback_accepts_no_token_but_still_checks_a_given_one() {
    let gate = Gate::for_listener(
        "test",
        Ipv4Addr::LOCALHOST.into(),
        Some(token("0123456789abcdef-job")),
        GateLimits::default(),
    )
    .expect("loopback");
    let (outcome, peer) = exchange(&gate, |s| greet(&s, Role::Channel, None));
    assert_eq!(outcome, Ok(Role::Channel));
    peer.expect("admitted");
    let wrong = token("fedcba9876543210-job");
    let (outcome, _) = exchange(&gate, move |s| greet(&s, Role::Channel, Some(&wrong)));
    assert_eq!(outcome, Err(Refusal::WrongToken));
    let err = Gate::for_listener("control port", Ipv4Addr::UNSPECIFIED.into(), None, GateLimits::default())
        .expect_err("0.0.0.0 without a token");
    assert!(err.contains("KOALA_TOKEN") && err.contains("0.0.0.0"), "{err}");
}

#[test]
fn an_oversize_length_prefix_is_refused_before_its_body_arrives() {
    // The peer announces 1 MiB and sends nothing more: the refusal must come from the length
    // alone, long before the idle limit.
    let limits = GateLimits { idle: Duration::from_secs(30), max_pending: 4 };
    let started = Instant::now();
    let (outcome, peer) = exchange(&strict(limits), |mut s| {
        s.write_all(&(1u32 << 20).to_le_bytes()).expect("send");
        read_verdict(&mut s)
    });
    assert_eq!(outcome, Err(Refusal::Oversize(1 << 20)));
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(peer.expect_err("refused").to_string().contains("exceeds the 4096-byte limit"));
}

#[test]
fn a_silent_or_trickling_peer_is_refused_at_the_idle_limit() {
    let limits = GateLimits { idle: Duration::from_millis(300), max_pending: 4 };
    let (outcome, peer) = exchange(&strict(limits), |mut s| {
        // One byte now and then: each read is short, the whole greeting is late.
        for b in 20u32.to_le_bytes() {
            s.write_all(&[b]).expect("send");
            std::thread::sleep(Duration::from_millis(120));
        }
        read_verdict(&mut s)
    });
    assert_eq!(outcome, Err(Refusal::Idle(Duration::from_millis(300))));
    assert!(peer.expect_err("refused").to_string().contains("no greeting within 300 ms"));
}

#[test]
fn connections_beyond_the_pending_limit_are_refused_at_once() {
    let gate = strict(GateLimits { idle: Duration::from_secs(30), max_pending: 2 });
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).expect("connect")).collect();
    let accepted: Vec<TcpStream> = (0..3).map(|_| listener.accept().expect("accept").0).collect();
    let first = gate.enter(&accepted[0]).expect("1st waits");
    let _second = gate.enter(&accepted[1]).expect("2nd waits");
    assert_eq!(gate.enter(&accepted[2]).map(|_| ()), Err(Refusal::TooMany(2)));
    let err = read_verdict(&mut &idle[2]).expect_err("refused");
    assert!(err.to_string().contains("2 connections are already waiting"), "{err}");
    // A slot frees when a waiting connection is done with.
    drop(first);
    assert!(gate.enter(&accepted[2]).is_ok());
}

#[test]
fn tokens_are_redacted_in_debug_and_display() {
    let t = Token::generate().expect("generate");
    assert_eq!(t.expose().len(), 64);
    assert!(!format!("{t:?}{t}").contains(t.expose()));
    assert!(Token::parse("short", "KOALA_TOKEN").expect_err("short").contains("KOALA_TOKEN"));
}

/// A reader that holds a 4-byte length prefix and fails the test if anything past it is read.
struct PrefixOnly([u8; 4], usize);

impl Read for PrefixOnly {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        assert!(self.1 < 4, "the body of an oversize greeting was read");
        let n = buf.len().min(4 - self.1);
        buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
        self.1 += n;
        Ok(n)
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Random bytes, and a valid greeting with bytes flipped or cut, are read as a greeting or a
    /// verdict: admitted or refused, never a panic.
    #[test]
    fn hostile_greetings_and_verdicts_never_panic(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128),
        flips in proptest::collection::vec((0usize..64, 1u8..=255), 0..6),
        cut in 0usize..64,
    ) {
        let idle = Duration::from_secs(1);
        let _ = read_greeting(&mut &bytes[..], idle);
        let _ = read_verdict(&mut &bytes[..]);
        let mut greeting = greeting_bytes(Role::State, Some(&token("0123456789abcdef-job"))).expect("bytes");
        for (at, mask) in &flips {
            let i = at % greeting.len();
            greeting[i] ^= mask;
        }
        let _ = read_greeting(&mut &greeting[..], idle);
        let _ = read_greeting(&mut &greeting[..cut.min(greeting.len())], idle);
    }

    /// A length prefix above the limit is refused from the prefix alone, before a buffer is
    /// allocated or a byte of the body is read.
    #[test]
    fn an_oversize_greeting_is_refused_from_its_prefix(len in (MAX_GREETING_BYTES as u32 + 1)..=u32::MAX) {
        let outcome = read_greeting(&mut PrefixOnly(len.to_le_bytes(), 0), Duration::from_secs(1));
        proptest::prop_assert_eq!(outcome, Err(Refusal::Oversize(len as usize)));
    }
}
