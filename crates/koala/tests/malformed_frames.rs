//! A worker that receives a malformed frame on a data connection drops that connection with a
//! logged error and keeps running, whether the garbage comes before the greeting (refused by the
//! data port's gate, with a reason) or after it. The test plays the coordinator itself.

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use koala_protocol::{ControlHello, CoordinatorMessage};
use koala_types::WorkerId;
use koala_types::frame::{read_frame, write_frame};
use koala_types::handshake::{Gate, Role, greet, read_verdict};

#[test]
fn worker_survives_garbage_on_its_data_port() {
    let coordinator = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = coordinator.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut worker = Command::new(env!("CARGO_BIN_EXE_koala"))
        .args(["worker", "--coordinator", &addr, "--data-dir"])
        .arg(dir.path())
        .env("KOALA_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start worker");
    let (control, _) = coordinator.accept().expect("worker connects");
    let gate = Gate::new("test control port", None, false, Default::default());
    let role = gate.enter(&control).and_then(|p| p.admit(&control)).expect("the worker greets");
    assert_eq!(role, Role::Worker);
    let mut reader = BufReader::new(control.try_clone().expect("clone"));
    let mut writer = control;
    let data_addr = match read_frame::<_, ControlHello>(&mut reader).expect("read") {
        Some(ControlHello::Worker { data_addr, .. }) => data_addr,
        other => panic!("expected Register, got {other:?}"),
    };
    write_frame(&mut writer, &CoordinatorMessage::Welcome { worker: WorkerId(0) }).expect("welcome");

    // Before the greeting: 1: a frame that claims 4 GiB; 2: bytes that are no greeting. The
    // gate answers why, then drops the connection.
    for (garbage, reason) in [
        (u32::MAX.to_le_bytes().to_vec(), "exceeds the 4096-byte limit"),
        (vec![3, 0, 0, 0, 0xff, 0xff, 0xff], "not a koala greeting"),
    ] {
        let mut s = TcpStream::connect(&data_addr).expect("connect data port");
        s.write_all(&garbage).expect("write garbage");
        let refusal = read_verdict(&mut s).expect_err("refused");
        assert!(refusal.to_string().contains(reason), "{refusal}");
        assert_closed_by_peer(&mut s, &garbage);
    }
    // After the greeting: 1: a frame that claims 4 GiB; 2: bytes that do not decode.
    for garbage in [u32::MAX.to_le_bytes().to_vec(), vec![3, 0, 0, 0, 0xff, 0xff, 0xff]] {
        let mut s = TcpStream::connect(&data_addr).expect("connect data port");
        greet(&s, Role::Channel, None).expect("admitted");
        s.write_all(&garbage).expect("write garbage");
        assert_closed_by_peer(&mut s, &garbage);
    }

    // The worker still answers its coordinator and shuts down cleanly.
    write_frame(&mut writer, &CoordinatorMessage::Shutdown).expect("shutdown");
    writer.flush().expect("flush");
    let status = worker.wait().expect("worker exits");
    assert!(status.success(), "worker exit status {status}");
    let mut log = String::new();
    BufReader::new(worker.stderr.take().expect("stderr")).read_to_string(&mut log).expect("read log");
    let errors = log.lines().filter(|l| l.contains("malformed")).count();
    assert!(errors >= 2, "expected two logged malformed-frame errors, log:\n{log}");
    let refusals = log.lines().filter(|l| l.contains("data port: refused a connection")).count();
    assert!(refusals >= 2, "expected two logged refusals with their reason, log:\n{log}");
}

/// Asserts the worker closed `s`: a read returns 0 (EOF) or fails with a reset. A read that
/// times out means the connection is still open (the worker did not drop it) and fails, as does
/// data.
fn assert_closed_by_peer(s: &mut TcpStream, garbage: &[u8]) {
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut buf = [0u8; 1];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => {
            panic!("worker answered {n} byte(s) to garbage {garbage:?} instead of closing the connection")
        }
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            panic!("worker kept the connection open for 20 s after garbage {garbage:?} (read timed out)")
        }
        Err(e) => panic!("unexpected read error after garbage {garbage:?}: {e} ({:?})", e.kind()),
    }
}
