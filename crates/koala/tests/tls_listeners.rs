//! With TLS on (`[tls]`, `--tls-*`, certificates made by `koala certs`), every kind of koala
//! listener — the coordinator's control port and HTTP API, a worker's data port, a state server —
//! refuses a plaintext client and a client whose CA is not the job's, and admits a client of the
//! job's CA. Ports are bound on port 0 and read from what the processes print; every wait is on a
//! line or an answer, bounded, never a sleep.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use koala_types::handshake::{ControlLimits, Role, Token, connect_control, greet};
use koala_types::tls::{Tls, TlsFiles};

const TOKEN: &str = "0123456789abcdef-tls-listeners";

/// Processes killed when the test ends, however it ends.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn koala(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_koala"));
    cmd.args(args).env("KOALA_TOKEN", TOKEN).env("KOALA_LOG", "info").stdin(Stdio::null());
    cmd
}

/// `koala certs --hosts 127.0.0.1 --out DIR`: the TLS files of 127.0.0.1.
fn certs(dir: &Path) -> TlsFiles {
    let out =
        koala(&["certs", "--hosts", "127.0.0.1,localhost", "--out"]).arg(dir).output().expect("koala certs");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "koala certs failed: {printed}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        printed.contains("[tls]") && printed.contains("--tls-ca"),
        "it prints how to use them: {printed}"
    );
    TlsFiles {
        cert: Some(dir.join("127.0.0.1.pem")),
        key: Some(dir.join("127.0.0.1.key")),
        ca: Some(dir.join("ca.pem")),
    }
}

fn flags(files: &TlsFiles) -> Vec<String> {
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().expect("path").display().to_string();
    vec![
        "--tls-cert".into(),
        path(&files.cert),
        "--tls-key".into(),
        path(&files.key),
        "--tls-ca".into(),
        path(&files.ca),
    ]
}

/// Every line `child` prints (stdout and stderr), on a channel.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    for r in [Box::new(out) as Box<dyn Read + Send>, Box::new(err)] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
    }
    rx
}

/// The first line containing `needle`, within `limit`; panics with everything read otherwise.
fn wait_for(rx: &mpsc::Receiver<String>, seen: &mut String, needle: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        seen.push_str(&line);
        seen.push('\n');
        if line.contains(needle) {
            return line;
        }
    }
    panic!("no line with {needle:?} within {limit:?}:\n{seen}");
}

/// The text after `key` in `line`, up to the next space, `,` or `/`.
fn after<'a>(line: &'a str, key: &str) -> &'a str {
    let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len()..];
    rest.split([' ', ',', '/', ';']).next().unwrap_or(rest)
}

/// A plaintext koala greeting to `addr` is refused, naming TLS.
fn plaintext_greeting_is_refused(addr: &str, role: Role, token: &Token) {
    let stream = TcpStream::connect(addr).expect("connect");
    let e = greet(&stream, role, Some(token)).expect_err("plaintext must be refused");
    assert!(e.to_string().contains("runs TLS and the peer greeted in plaintext"), "{addr}: {e}");
}

/// A TLS client of another CA does not get past the handshake.
fn another_ca_is_refused(addr: &str, stranger: &Tls) {
    let e = stranger.connect(TcpStream::connect(addr).expect("connect"), addr).expect_err("another CA");
    assert!(e.to_string().contains("TLS handshake with"), "{addr}: {e}");
}

/// A greeting over TLS with the job's CA is admitted.
fn job_ca_is_admitted(addr: &str, role: Role, token: &Token, tls: &Tls) {
    let mut conn =
        tls.connect(TcpStream::connect(addr).expect("connect"), addr).expect("TLS with the job's CA");
    greet(&mut conn, role, Some(token)).expect("admitted over TLS");
}

#[test]
fn every_listener_refuses_plaintext_and_another_ca_and_admits_the_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = certs(&dir.path().join("certs"));
    let tls = Tls::load(&files, "[tls]").expect("the job's TLS");
    let client =
        Tls::load(&TlsFiles { ca: files.ca.clone(), ..Default::default() }, "--tls").expect("client");
    let stranger = {
        let other = koala_types::tls::certs::write(&["127.0.0.1".into()], &dir.path().join("other"))
            .expect("other CA");
        Tls::load(&other.files_of("127.0.0.1"), "[tls]").expect("another CA")
    };
    let token = Token::parse(TOKEN, "test").expect("token");
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().expect("path").display().to_string();
    let config = dir.path().join("job.toml");
    std::fs::write(
        &config,
        format!(
            "query = \"keyed-aggregate\"\nworkers = 2\nduration_s = 30\noutput_dir = {:?}\n\
             [parallelism]\nsource = 1\naggregate = 1\nsink = 1\n[params]\nsink = \"discard\"\n\
             [tls]\ncert = {:?}\nkey = {:?}\nca = {:?}\n",
            dir.path().join("out").display().to_string(),
            path(&files.cert),
            path(&files.key),
            path(&files.ca),
        ),
    )
    .expect("config");
    let mut procs = Procs(Vec::new());
    // The coordinator waits for 2 workers; one registers, so its ports stay open for the test.
    let mut coordinator = koala(&["coordinator", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the coordinator");
    let log = lines(&mut coordinator);
    procs.0.push(coordinator);
    let mut seen = String::new();
    let first = wait_for(&log, &mut seen, "coordinator listening on", Duration::from_secs(20));
    let control = after(&first, "coordinator listening on ").to_string();
    let https = after(&first, "dashboard at https://").to_string();

    // Control port.
    let limits = ControlLimits::default();
    let e = connect_control(&control, Role::Client, Some(&token), None, limits).expect_err("plaintext");
    assert!(e.to_string().contains("runs TLS and the peer greeted in plaintext"), "{e}");
    let e =
        connect_control(&control, Role::Client, Some(&token), Some(&stranger), limits).expect_err("other CA");
    assert!(e.to_string().contains("TLS handshake with"), "{e}");
    job_ca_is_admitted(&control, Role::Client, &token, &client);

    // HTTP API: plaintext HTTP gets no HTTP answer; another CA no handshake; the job's CA a page.
    let mut plain = TcpStream::connect(&https).expect("connect");
    plain.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    plain.write_all(b"GET /api/job HTTP/1.0\r\n\r\n").expect("write");
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plaintext HTTP must get no answer: {}",
        String::from_utf8_lossy(&answer)
    );
    another_ca_is_refused(&https, &stranger);
    let mut conn = client.connect(TcpStream::connect(&https).expect("connect"), &https).expect("HTTPS");
    conn.write_all(format!("GET /api/job HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").as_bytes())
        .expect("request");
    let mut page = String::new();
    let _ = conn.read_to_string(&mut page);
    assert!(page.starts_with("HTTP/1.0 200") || page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("\"control_addr\""), "{page}");

    // A worker's data port.
    let data_dir = dir.path().join("w0");
    let mut worker_args = vec!["worker", "--coordinator", &control, "--data-dir"];
    let data_dir = data_dir.display().to_string();
    worker_args.push(&data_dir);
    let worker_flags = flags(&files);
    worker_args.extend(worker_flags.iter().map(String::as_str));
    let worker =
        koala(&worker_args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start a worker");
    procs.0.push(worker);
    let registered = wait_for(&log, &mut seen, "data_addr=", Duration::from_secs(20));
    let data = after(&registered, "data_addr=").to_string();
    plaintext_greeting_is_refused(&data, Role::Channel, &token);
    another_ca_is_refused(&data, &stranger);
    job_ca_is_admitted(&data, Role::Channel, &token, &client);

    // A state server.
    let mut server_args = vec!["state-server", "--listen", "127.0.0.1:0", "--data-dir"];
    let server_dir = dir.path().join("server").display().to_string();
    server_args.push(&server_dir);
    server_args.extend(worker_flags.iter().map(String::as_str));
    let mut server =
        koala(&server_args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("server");
    let server_log = lines(&mut server);
    procs.0.push(server);
    let mut server_seen = String::new();
    let listening =
        wait_for(&server_log, &mut server_seen, "state server listening on", Duration::from_secs(20));
    let state = after(&listening, "state server listening on ").to_string();
    plaintext_greeting_is_refused(&state, Role::State, &token);
    another_ca_is_refused(&state, &stranger);
    job_ca_is_admitted(&state, Role::State, &token, &client);
    let _ = tls;
}

/// Config errors name the field and the fix: a certificate path that does not exist, a key that
/// is not the certificate's.
#[test]
fn tls_config_errors_name_the_field_and_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = certs(&dir.path().join("certs"));
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().expect("path").display().to_string();
    let run = |cert: &str, key: &str| {
        let config = dir.path().join("job.toml");
        std::fs::write(
            &config,
            format!(
                "query = \"keyed-aggregate\"\nworkers = 1\noutput_dir = {:?}\n[params]\nsink = \"discard\"\n\
                 [tls]\ncert = {cert:?}\nkey = {key:?}\nca = {:?}\n",
                dir.path().join("out").display().to_string(),
                path(&files.ca),
            ),
        )
        .expect("config");
        let out = koala(&["coordinator", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .output()
            .expect("run");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing = dir.path().join("nope.pem").display().to_string();
    let e = run(&missing, &path(&files.key));
    assert!(e.contains("[tls] cert") && e.contains("no such file; check the path"), "{e}");
    let other_key = dir.path().join("certs").join("localhost.key").display().to_string();
    let e = run(&path(&files.cert), &other_key);
    assert!(
        e.contains("[tls] cert and [tls] key") && e.contains("give the key made with that certificate"),
        "{e}"
    );
}
