//! A job whose ports are not on loopback (coordinator on 0.0.0.0, workers' data ports on
//! 0.0.0.0) refuses every connection without the job token, with a wrong token, with an
//! oversize greeting, silent past the idle limit, or beyond the pending-connection limit — and
//! every request to its HTTP API, dashboard and `/metrics` without the token — each with a
//! reason both sides see, while the job keeps running to a normal end. A state server off
//! loopback does the same for its clients. A worker of another protocol version fails the
//! startup loudly, naming both versions, instead of leaving the coordinator waiting.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use koala_types::handshake::{PROTOCOL_VERSION, Role, Token, greet, greeting_bytes_of, read_verdict};

const TOKEN: &str = "0123456789abcdef-untrusted-test";

fn write_config(dir: &Path, workers: u32, duration_s: u32) -> std::path::PathBuf {
    let config = format!(
        "query = \"keyed-aggregate\"\nworkers = {workers}\nduration_s = {duration_s}\noutput_dir = \"{}\"\n\
         [parallelism]\nsource = 2\naggregate = 2\nsink = 1\n[params]\nsink = \"discard\"\n\
         [params.source]\nrate = [{{ at_ms = 0, records_per_sec = 2000.0 }}]\n\
         [coordinator]\nhandshake_idle_ms = 400\nmax_pending_connections = 3\n",
        dir.join("out").display()
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, config).expect("write config");
    path
}

/// Starts `koala coordinator --listen <listen>`; returns it, the control port and the HTTP port.
fn coordinator(dir: &Path, config: &Path, listen: &str, token: Option<&str>) -> (Child, u16, u16) {
    let addr_file = dir.join("addr");
    let mut cmd = common::koala();
    cmd.args(["coordinator", "--listen", listen, "--config"])
        .arg(config)
        .arg("--address-file")
        .arg(&addr_file)
        .env("KOALA_LOG", "info")
        .env_remove("KOALA_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.env("KOALA_TOKEN", t);
    }
    let mut child = cmd.spawn().expect("start coordinator");
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().expect("stdout")).read_line(&mut first).expect("read");
    assert!(first.starts_with("coordinator listening on"), "{first}");
    let addr = std::fs::read_to_string(&addr_file).expect("address file");
    let port = addr.rsplit(':').next().and_then(|p| p.trim().parse().ok()).expect("a port");
    let http = first
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no dashboard URL in {first:?}"));
    (child, port, http)
}

fn expect_refused(result: std::io::Result<()>, reason: &str, what: &str) -> String {
    let mut once = Some(result);
    expect_refused_by(|| once.take().unwrap_or(Ok(())), reason, what)
}

/// Runs `attempt` until it is refused for something else than a busy gate: the thread of an
/// earlier refused connection releases its place in the gate only just after its verdict is
/// out, so a connection right behind it may be told to retry (the refusal says so).
fn expect_refused_by(mut attempt: impl FnMut() -> std::io::Result<()>, reason: &str, what: &str) -> String {
    let mut result = attempt();
    for _ in 0..100 {
        match &result {
            Err(e) if e.to_string().contains("already waiting") && !reason.contains("already waiting") => {
                std::thread::sleep(Duration::from_millis(20));
                result = attempt();
            }
            _ => break,
        }
    }
    let err = result.expect_err(what).to_string();
    assert!(err.contains(reason), "{what}: expected {reason:?} in the refusal, got {err:?}");
    err
}

#[test]
fn strangers_are_refused_with_a_reason_while_the_job_runs_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), 2, 5);
    let (mut coord, port, http) = coordinator(dir.path(), &config, "0.0.0.0:0", Some(TOKEN));
    let control = format!("127.0.0.1:{port}");
    let mut workers: Vec<Child> = (0..2)
        .map(|i| {
            common::koala()
                .args(["worker", "--coordinator", &control, "--listen-host", "0.0.0.0", "--data-dir"])
                .arg(dir.path().join(format!("w{i}")))
                .env("KOALA_TOKEN", TOKEN)
                .env("KOALA_LOG", "info")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start worker")
        })
        .collect();
    let worker_logs: Vec<_> = workers
        .iter_mut()
        .map(|w| {
            let mut stderr = w.stderr.take().expect("stderr");
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = stderr.read_to_string(&mut text);
                text
            })
        })
        .collect();
    let mut log = BufReader::new(coord.stderr.take().expect("stderr")).lines();
    let (mut seen, mut data_addrs) = (String::new(), Vec::new());
    for line in log.by_ref() {
        let line = line.expect("read");
        seen.push_str(&line);
        seen.push('\n');
        if let Some(rest) = line.split("data_addr=").nth(1) {
            data_addrs.push(rest.split_whitespace().next().expect("an address").to_string());
        }
        if line.contains("job started") {
            break;
        }
    }
    assert_eq!(data_addrs.len(), 2, "two workers registered, each with an address:\n{seen}");
    // The rest of the log, read as it comes: a full pipe would stall the coordinator.
    let rest = std::thread::spawn(move || log.map_while(Result::ok).collect::<Vec<String>>().join("\n"));
    assert!(data_addrs.iter().all(|a| a.starts_with("127.0.0.1:")), "advertised {data_addrs:?}");

    let connect = || TcpStream::connect(&control).expect("connect the control port");
    let wrong = Token::parse("fedcba9876543210-not-this-job", "test").expect("token");
    // The control port.
    expect_refused_by(|| greet(&connect(), Role::Client, None), "no job token", "no token");
    expect_refused_by(|| greet(&connect(), Role::Client, Some(&wrong)), "wrong job token", "wrong token");
    let oversize = || {
        let mut s = connect();
        s.write_all(&(64u32 << 20).to_le_bytes())?;
        read_verdict(&mut s)
    };
    expect_refused_by(oversize, "exceeds the 4096-byte limit", "oversize greeting");
    let mut took = Duration::ZERO;
    let idle = || {
        let started = Instant::now();
        let verdict = read_verdict(&mut connect());
        took = started.elapsed();
        verdict
    };
    expect_refused_by(idle, "no greeting within 400 ms", "idle");
    assert!(took >= Duration::from_millis(400), "refused after {took:?}");
    let idle: Vec<TcpStream> = (0..3).map(|_| connect()).collect();
    expect_refused(read_verdict(&mut connect()), "3 connections are already waiting", "too many");
    drop(idle);
    // A worker's data port.
    let data = || TcpStream::connect(&data_addrs[0]).expect("connect a data port");
    expect_refused(greet(&data(), Role::Channel, None), "no job token", "data port, no token");
    expect_refused(greet(&data(), Role::Channel, Some(&wrong)), "wrong job token", "data port, wrong token");
    // The API: a POST without the token, and every read.
    let answer =
        http_call(http, "POST", "/api/rescale", r#"{"operator": "aggregate", "parallelism": 3}"#, "");
    assert!(answer.starts_with("HTTP/1.1 401") && answer.contains("Authorization: Bearer"), "{answer}");
    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");
    for path in ["/", "/api/job", "/api/metrics", "/api/reconfigurations", "/metrics"] {
        let answer = http_call(http, "GET", path, "", "");
        assert!(answer.starts_with("HTTP/1.1 401"), "GET {path} without the token: {answer}");
        assert!(!answer.contains("aggregate"), "GET {path} without the token leaked: {answer}");
        let answer = http_call(http, "GET", path, "", &bearer);
        assert!(answer.starts_with("HTTP/1.1 200"), "GET {path} with the token: {answer}");
    }
    let page = http_call(http, "GET", &format!("/?token={TOKEN}"), "", "");
    assert!(page.starts_with("HTTP/1.1 200") && page.contains("<html"), "{page}");

    let status = wait(&mut coord, Duration::from_secs(60));
    let text = format!("{seen}{}", rest.join().expect("log reader"));
    let mut out = String::new();
    coord.stdout.take().expect("stdout").read_to_string(&mut out).expect("read stdout");
    assert!(status.success(), "the job must end normally: {status}\n{out}\n{text}");
    // `done: run … in 5.0 s — 10 019 records in (…`: the count is grouped by thousands.
    let records_in: u64 = out
        .split(" records in")
        .next()
        .and_then(|s| s.rsplit('—').next())
        .and_then(|n| n.replace(' ', "").parse().ok())
        .unwrap_or_else(|| panic!("no summary:\n{out}"));
    // 5 s at 2000 records/s: the job kept its input flowing through the refusals, and the
    // unauthenticated rescale did not happen.
    assert!(records_in >= 5_000, "only {records_in} records in:\n{out}");
    assert!(out.contains(", 0 reconfigurations"), "{out}");
    for reason in [
        "no job token",
        "wrong job token",
        "exceeds the 4096-byte limit",
        "no greeting within 400 ms",
        "3 connections are already waiting",
    ] {
        assert!(
            text.lines().any(|l| l.contains("control port: refused a connection") && l.contains(reason)),
            "the coordinator did not log the refusal {reason:?}:\n{text}"
        );
    }
    for w in &mut workers {
        assert!(w.wait().expect("worker exits").success());
    }
    let worker_logs: String = worker_logs.into_iter().map(|t| t.join().expect("log reader")).collect();
    for reason in ["no job token", "wrong job token"] {
        assert!(
            worker_logs.lines().any(|l| l.contains("data port: refused a connection") && l.contains(reason)),
            "no worker logged the refusal {reason:?}:\n{worker_logs}"
        );
    }
}

#[test]
fn a_worker_of_another_version_fails_the_startup_naming_both_versions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), 1, 5);
    let (mut coord, port, _) = coordinator(dir.path(), &config, "127.0.0.1:0", None);
    let theirs = PROTOCOL_VERSION + 1;
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(&greeting_bytes_of(theirs, Role::Worker, b"").expect("greeting")).expect("greet");
    let peer_says = expect_refused(read_verdict(&mut s), "protocol version mismatch", "another version");
    assert!(
        peer_says.contains(&format!("this build speaks protocol version {PROTOCOL_VERSION}")),
        "{peer_says}"
    );
    // The coordinator gives up at once (its startup wait is 60 s), saying why.
    let started = Instant::now();
    let status = wait(&mut coord, Duration::from_secs(20));
    assert!(!status.success(), "the coordinator must fail");
    assert!(started.elapsed() < Duration::from_secs(20));
    let mut err = String::new();
    coord.stderr.take().expect("stderr").read_to_string(&mut err).expect("read");
    let line =
        err.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("no error line:\n{err}"));
    assert!(
        line.contains(&format!("version {PROTOCOL_VERSION}")) && line.contains(&format!("version {theirs}")),
        "{line}"
    );
}

#[test]
fn a_state_server_off_loopback_refuses_clients_without_the_job_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state_server = |token_file: Option<&Path>| {
        let mut cmd = common::koala();
        cmd.args(["state-server", "--listen", "0.0.0.0:0", "--data-dir"])
            .arg(dir.path().join("state"))
            .env_remove("KOALA_TOKEN")
            .env("KOALA_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(file) = token_file {
            cmd.arg("--token-file").arg(file);
        }
        cmd.spawn().expect("start a state server")
    };
    // Without a token it does not start, and says what to give.
    let out = state_server(None).wait_with_output().expect("exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("KOALA_TOKEN") && err.contains("0.0.0.0"), "{err}");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("write the token file");
    let mut server = KilledOnDrop(state_server(Some(&token_file)));
    let mut first = String::new();
    BufReader::new(server.0.stdout.as_mut().expect("stdout")).read_line(&mut first).expect("read");
    let port: u16 = first
        .trim()
        .strip_prefix("state server listening on 0.0.0.0:")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no address in {first:?}"));
    let connect = || TcpStream::connect(("127.0.0.1", port)).expect("connect the state server");
    let wrong = Token::parse("fedcba9876543210-not-this-job", "test").expect("token");
    expect_refused(greet(&connect(), Role::State, None), "no job token", "state server, no token");
    expect_refused(
        greet(&connect(), Role::State, Some(&wrong)),
        "wrong job token",
        "state server, wrong token",
    );
    let right = Token::parse(TOKEN, "test").expect("token");
    greet(&connect(), Role::State, Some(&right)).expect("the job token is admitted");
}

/// A process killed when the test ends, however it ends.
struct KilledOnDrop(Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 exchange with the API on `port` (extra `headers` lines end in `\r\n`): the
/// whole answer.
fn http_call(port: u16, method: &str, path: &str, body: &str, headers: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect the API");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("the API answers");
    answer
}

fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("no exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
