//! The coordinator notices a worker that disappears (kill -9) or stops answering (SIGSTOP) and
//! ends the job with an error that names the worker, instead of hanging; a task that reports a
//! protocol error aborts the epoch and fails the job.

mod common;

use std::io::{BufRead, BufReader, Lines};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use koala_protocol::koala::ProtocolError;
use koala_protocol::{ControlHello, CoordinatorMessage, TaskAck, WorkerMessage};
use koala_types::frame::{read_frame, write_frame};
use koala_types::{InputChannel, OperatorId, TaskId};

/// A running coordinator with its stderr lines; the address workers register at.
struct Job {
    coordinator: Child,
    log: Lines<BufReader<ChildStderr>>,
    addr: String,
}

fn start_coordinator(dir: &Path, workers: u32, runtime: &str) -> Job {
    let config = format!(
        "query = \"keyed-aggregate\"\nworkers = {workers}\nduration_s = 120\noutput_dir = \"{}\"\n\
         [parallelism]\nsource = 2\naggregate = 2\nsink = 1\n[params]\nsink = \"discard\"\n\
         [params.source]\nrate = [{{ at_ms = 0, records_per_sec = 2000.0 }}]\n[runtime]\n{runtime}",
        dir.join("out").display()
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, config).expect("write config");
    let addr_file = dir.join("addr");
    let mut coordinator = common::koala()
        .args(["coordinator", "--config"])
        .arg(&path)
        .arg("--address-file")
        .arg(&addr_file)
        .env("KOALA_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start coordinator");
    let mut out = BufReader::new(coordinator.stdout.take().expect("stdout")).lines();
    let first = out.next().expect("a line").expect("read");
    assert!(first.starts_with("coordinator listening on"), "{first}");
    let addr = std::fs::read_to_string(&addr_file).expect("address file");
    let log = BufReader::new(coordinator.stderr.take().expect("stderr")).lines();
    Job { coordinator, log, addr }
}

fn start_workers(dir: &Path, addr: &str) -> Vec<Child> {
    (0..2)
        .map(|i| {
            common::koala()
                .args(["worker", "--coordinator", addr, "--data-dir"])
                .arg(dir.join(format!("w{i}")))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start worker")
        })
        .collect()
}

impl Job {
    /// Reads the coordinator's log until the job runs; returns what it read.
    fn wait_started(&mut self) -> String {
        let mut seen = String::new();
        for line in self.log.by_ref() {
            let line = line.expect("read");
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("job started") {
                return seen;
            }
        }
        panic!("the job never started:\n{seen}");
    }

    /// Waits for the coordinator to exit (at most `limit`); returns its status and the rest of
    /// its log.
    fn wait_exit(mut self, limit: Duration, what: &str) -> (ExitStatus, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.coordinator.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.coordinator.kill();
                panic!("the coordinator did not end the job within {limit:?} after {what}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let rest: Vec<String> = self.log.map_while(Result::ok).collect();
        (status, rest.join("\n"))
    }
}

fn stop(workers: &mut [Child]) {
    for w in workers {
        let _ = Command::new("kill").args(["-CONT", &w.id().to_string()]).status();
        let _ = w.kill();
        let _ = w.wait();
    }
}

#[test]
fn a_killed_worker_fails_the_job_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = start_coordinator(dir.path(), 2, "");
    let mut workers = start_workers(dir.path(), &job.addr);
    let seen = job.wait_started();
    workers[1].kill().expect("kill -9 a worker");
    let _ = workers[1].wait();
    let (status, rest) = job.wait_exit(Duration::from_secs(60), "kill -9");
    let text = seen + &rest;
    assert!(!status.success(), "the job must fail when a worker is lost");
    // Registration order decides which id the killed process had.
    assert!(
        text.contains("worker0 disappeared") || text.contains("worker1 disappeared"),
        "no clear error naming the worker:\n{text}"
    );
    stop(&mut workers);
}

#[test]
fn a_stopped_worker_fails_the_job_within_the_heartbeat_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = start_coordinator(dir.path(), 2, "heartbeat_timeout_s = 2.0\n");
    let mut workers = start_workers(dir.path(), &job.addr);
    let seen = job.wait_started();
    let stopped = Command::new("kill").args(["-STOP", &workers[1].id().to_string()]).status();
    assert!(stopped.expect("run kill").success(), "SIGSTOP failed");
    let at = Instant::now();
    // The bound: heartbeat timeout + 2 s.
    let (status, rest) = job.wait_exit(Duration::from_secs(4), "SIGSTOP");
    let took = at.elapsed();
    let text = seen + &rest;
    assert!(!status.success(), "the job must fail when a worker stops answering");
    assert!(
        text.contains("worker0 sent no heartbeat") || text.contains("worker1 sent no heartbeat"),
        "no clear error naming the silent worker ({took:?}):\n{text}"
    );
    assert!(took >= Duration::from_secs(1), "failed after {took:?}: before the 2 s timeout could run out");
    stop(&mut workers);
}

/// The test plays the only worker: it deploys nothing, starts, then reports a protocol error for
/// a task. The coordinator must fail the job (non-zero exit) naming the task and the error.
#[test]
fn a_protocol_error_fails_the_job_naming_the_task() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = start_coordinator(dir.path(), 1, "");
    let control = std::net::TcpStream::connect(&job.addr).expect("connect");
    koala_types::handshake::greet(&control, koala_types::handshake::Role::Worker, None).expect("admitted");
    let mut writer = control.try_clone().expect("clone");
    let mut reader = BufReader::new(control);
    let hello = ControlHello::Worker { data_addr: "127.0.0.1:9".into(), pid: 0 };
    write_frame(&mut writer, &hello).expect("register");
    let mut started = false;
    while !started {
        match read_frame::<_, CoordinatorMessage>(&mut reader).expect("read") {
            Some(CoordinatorMessage::Deploy(..)) => {
                write_frame(&mut writer, &WorkerMessage::Deployed).expect("deployed");
            }
            Some(CoordinatorMessage::Start) => started = true,
            Some(_) => {}
            None => panic!("the coordinator closed the connection before Start"),
        }
    }
    let task = TaskId::new(OperatorId(1), 0);
    let error = ProtocolError::UnknownChannel {
        channel: InputChannel { input: 0, from: TaskId::new(OperatorId(7), 3) },
    };
    let ack = WorkerMessage::TaskAck { task, epoch: 0, ack: TaskAck::ProtocolError { error } };
    write_frame(&mut writer, &ack).expect("report the error");
    let (status, log) = job.wait_exit(Duration::from_secs(10), "a protocol error");
    assert!(!status.success(), "the job must fail on a protocol error");
    assert!(log.contains("aggregate.0") && log.contains("unknown upstream"), "log:\n{log}");
}
