//! A standard output that closes under `koala` (`koala run job.toml | head -3`) ends the command
//! quietly with the status of a process killed by SIGPIPE (141), never a panic ("failed printing
//! to stdout"); a job it runs stops cleanly first (recorded as interrupted, its worker processes
//! gone).

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use koala_coordinator::metrics_store::{MetricsStore, RunStatus};

/// A command whose output pipe has no reader from the start.
#[test]
fn a_command_whose_output_is_closed_exits_141_without_a_panic() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = common::koala()
        .arg("queries")
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("run koala queries");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
}

/// `koala run job.toml | head -3` of a job without an end: after the third line the job stops,
/// drains and ends, and so does every process it started.
#[test]
fn a_job_whose_output_closes_stops_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, out_dir) = common::spawn_unbounded_run(dir.path(), 2000, "");
    let group = child.id();
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let head: Vec<String> = lines.by_ref().take(3).map_while(Result::ok).collect();
    assert_eq!(head.len(), 3, "fewer than 3 lines: {head:?}");
    drop(lines);
    let stderr = child.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    // A hang detector: the job drains in about a second once its next line finds no reader.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{group}")]).status();
            panic!("koala run went on after its output closed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = err.join().unwrap_or_default();
    assert_eq!(status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    assert!(!common::group_alive(group), "a process of the job outlived it");
    let store = MetricsStore::open(&out_dir.join("metrics.db")).expect("metrics db");
    let run = store.latest_run().expect("runs").expect("a run").run;
    assert_eq!(store.run_end(&run).expect("end").status, Some(RunStatus::Interrupted), "{err}");
}
