//! Conn and its split over TLS: bytes both ways at once, refusals of plaintext and of another
//! CA's certificate, config errors naming the field.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use super::*;

fn made(dir: &Path) -> certs::Made {
    certs::write(&["127.0.0.1".to_string(), "localhost".to_string()], dir).expect("certs")
}

fn pair(server: &Tls, client: &Tls, host: &str) -> (io::Result<Conn>, io::Result<Conn>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let client = client.clone();
    let addr = format!("{host}:{port}");
    let dialled = std::thread::spawn(move || client.connect(TcpStream::connect(&addr)?, &addr));
    let (tcp, _) = listener.accept().expect("accept");
    let accepted = server.accept(tcp, Duration::from_secs(5));
    (accepted, dialled.join().expect("client thread"))
}

#[test]
fn a_split_connection_carries_both_ways_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tls = Tls::load(&made(dir.path()).files_of("127.0.0.1"), "[tls]").expect("load");
    let (server, client) = pair(&tls, &tls, "127.0.0.1");
    let (mut s_read, mut s_write) = server.expect("accepted").split().expect("split");
    let (mut c_read, mut c_write) = client.expect("dialled").split().expect("split");
    // Both sides write 8 MiB while reading the other's: a split that held the session across a
    // blocking read or write would deadlock here.
    const BYTES: usize = 8 << 20;
    let writer = |mut w: ConnWriter, byte: u8| {
        std::thread::spawn(move || {
            let chunk = vec![byte; 50_000];
            let mut sent = 0;
            while sent < BYTES {
                let n = chunk.len().min(BYTES - sent);
                w.write_all(&chunk[..n]).expect("write");
                sent += n;
            }
            w.flush().expect("flush");
            w
        })
    };
    let (sw, cw) = (writer(s_write, 1), writer(c_write, 2));
    let reader = |r: &mut ConnReader, byte: u8| {
        let mut got = 0;
        let mut buf = vec![0u8; 70_000];
        while got < BYTES {
            let n = r.read(&mut buf).expect("read");
            assert!(n > 0, "early end after {got}");
            assert!(buf[..n].iter().all(|b| *b == byte));
            got += n;
        }
    };
    reader(&mut c_read, 1);
    reader(&mut s_read, 2);
    s_write = sw.join().expect("server writer");
    c_write = cw.join().expect("client writer");
    // A peer that goes away ends the other's stream as plain TCP does.
    drop(c_write);
    drop(c_read);
    let mut rest = Vec::new();
    assert_eq!(s_read.read_to_end(&mut rest).expect("end"), 0);
    drop(s_write);
}

#[test]
fn a_name_the_certificate_lacks_and_another_ca_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let other = tempfile::tempdir().expect("tempdir");
    let certs = made(dir.path());
    let ours = Tls::load(&certs.files_of("127.0.0.1"), "[tls]").expect("load");
    let theirs = Tls::load(&made(other.path()).files_of("127.0.0.1"), "[tls]").expect("load");
    let (_, client) = pair(&ours, &theirs, "127.0.0.1");
    let e = client.expect_err("another CA");
    assert!(e.to_string().contains("TLS handshake with 127.0.0.1"), "{e}");
    // The listener's certificate names 127.0.0.1; `127.0.0.2` is not it.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = ours.clone();
    let accepting = std::thread::spawn(move || {
        let (tcp, _) = listener.accept().expect("accept");
        server.accept(tcp, Duration::from_secs(5)).map(|_| ())
    });
    let e = ours
        .connect(TcpStream::connect(("127.0.0.1", port)).expect("connect"), &format!("127.0.0.2:{port}"))
        .expect_err("wrong name");
    assert!(e.to_string().contains("127.0.0.2"), "{e}");
    assert!(accepting.join().expect("thread").is_err());
    let named = Tls::load(&certs.files_of("localhost"), "[tls]").expect("load");
    let (_, by_name) = pair(&named, &ours, "localhost");
    by_name.expect("localhost is named");
}

#[test]
fn a_plaintext_greeting_is_told_to_use_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tls = Tls::load(&made(dir.path()).files_of("127.0.0.1"), "[tls]").expect("load");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let greeting = std::thread::spawn(move || {
        let stream = TcpStream::connect(addr)?;
        crate::handshake::greet(&stream, crate::handshake::Role::Client, None)
    });
    let (tcp, _) = listener.accept().expect("accept");
    let e = tls.accept(tcp, Duration::from_secs(5)).expect_err("plaintext");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    let e = greeting.join().expect("thread").expect_err("refused");
    assert!(e.to_string().contains("runs TLS and the peer greeted in plaintext"), "{e}");
    // Not a koala greeting at all (an HTTP request): refused by rustls, nothing answered.
    let http = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("write");
        let mut line = String::new();
        let _ = BufReader::new(s).read_line(&mut line);
        line
    });
    let (tcp, _) = listener.accept().expect("accept");
    assert!(tls.accept(tcp, Duration::from_secs(5)).is_err());
    assert!(!http.join().expect("thread").starts_with("HTTP"));
}

#[test]
fn config_errors_name_the_field_and_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let made = made(dir.path());
    let missing = TlsFiles { ca: Some(dir.path().join("nope.pem")), ..made.files_of("127.0.0.1") };
    let e = Tls::load(&missing, "[tls]").expect_err("no such file").to_string();
    assert!(e.contains("[tls] ca") && e.contains("no such file"), "{e}");
    let mismatched = TlsFiles { key: Some(made.hosts[1].2.clone()), ..made.files_of("127.0.0.1") };
    let e = Tls::load(&mismatched, "--tls").expect_err("another key").to_string();
    assert!(e.contains("--tls-cert") && e.contains("--tls-key") && e.contains("do not go together"), "{e}");
    let no_key = TlsFiles { key: None, ..made.files_of("127.0.0.1") };
    let e = Tls::load(&no_key, "[tls]").expect_err("no key").to_string();
    assert!(e.contains("[tls] key: not given"), "{e}");
    let no_ca = TlsFiles { ca: None, ..made.files_of("127.0.0.1") };
    assert!(Tls::load(&no_ca, "[tls]").expect_err("no ca").to_string().contains("[tls] ca: not given"));
    let not_pem = TlsFiles { cert: Some(made.hosts[0].2.clone()), ..made.files_of("127.0.0.1") };
    let e = Tls::load(&not_pem, "[tls]").expect_err("a key as cert").to_string();
    assert!(e.contains("[tls] cert") && e.contains("no PEM certificate"), "{e}");
    assert_eq!(host_of("[::1]:7000"), "::1");
    assert_eq!(host_of("10.0.0.1:7000"), "10.0.0.1");
}
