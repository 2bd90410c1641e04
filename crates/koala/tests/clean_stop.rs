//! Ctrl-C stops an unbounded job cleanly: `koala run` says at start that the job has no end and
//! how to stop it; a SIGINT to the whole process group (what a terminal's Ctrl-C sends) ends the
//! sources (`koala run` says so, and that a second one forces the exit), the job drains, prints
//! its summary and report, both saying it was interrupted, exits 0 and closes the metrics
//! database (no `-wal` file left) with the run recorded as interrupted, and the workers, which
//! ignore the SIGINT, end with it. A second Ctrl-C while it drains ends it at once (exit 130),
//! saying what that leaves, and kills its workers.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use koala_coordinator::metrics_store::{Aggregate, MetricsStore, RunStatus, TaskScope};
use koala_types::metric;

#[test]
fn ctrl_c_drains_an_unbounded_job_and_prints_its_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, out_dir) = common::spawn_unbounded_run(dir.path(), 5000, "");
    let group = child.id();
    let (lines_tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let stderr = child.stderr.take().expect("stderr");
    let (err_tx, err_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        let _ = err_tx.send(text);
    });
    // Wait (on output, not on time) for the job to run: two progress lines.
    let mut seen = Vec::new();
    let mut progress = 0;
    while progress < 2 {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                progress += usize::from(line.starts_with('[') && line.contains("rec/s"));
                seen.push(line);
            }
            Err(_) => {
                let _ = Command::new("kill").args(["-KILL", "--", &format!("-{group}")]).status();
                panic!("no progress within 60 s:\n{}", seen.join("\n"));
            }
        }
    }
    assert!(
        seen.iter().any(|l| l.contains("has no end") && l.contains("Ctrl-C")),
        "an unbounded job must say so and how to stop it:\n{}",
        seen.join("\n")
    );
    let sent = Command::new("kill").args(["-INT", "--", &format!("-{group}")]).status();
    assert!(sent.is_ok_and(|s| s.success()), "SIGINT to the group");
    let mut waited = 0;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        waited += 1;
        if waited > 1200 {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{group}")]).status();
            panic!("koala run did not end within 60 s of Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    seen.extend(lines.iter());
    let stdout = seen.join("\n");
    let stderr = err_rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
    assert!(status.success(), "Ctrl-C must end the job cleanly (exit 0):\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("Ctrl-C: stopping the job") && stderr.contains("Ctrl-C again stops at once"),
        "the first Ctrl-C does not say what it does and that a second one forces the exit:\n{stderr}"
    );
    assert!(stdout.contains("interrupted: run"), "no summary saying it was interrupted:\n{stdout}\n{stderr}");
    assert!(stdout.contains("status: INTERRUPTED"), "the report does not say it was interrupted:\n{stdout}");
    assert!(!stderr.contains("task failed"), "a task failed on Ctrl-C:\n{stderr}");
    assert!(out_dir.join("metrics.db").exists(), "no metrics database");
    assert!(!out_dir.join("metrics.db-wal").exists(), "the metrics database was not closed cleanly");
    let store = MetricsStore::open(&out_dir.join("metrics.db")).expect("metrics db");
    let run = store.latest_run().expect("read runs").expect("a run").run;
    assert_eq!(store.run_end(&run).expect("end").status, Some(RunStatus::Interrupted));
    let processed: f64 = store
        .per_second(&run, metric::RECORDS_IN, Aggregate::Sum, TaskScope::All)
        .expect("query")
        .iter()
        .map(|(_, v)| v)
        .sum();
    assert!(processed > 0.0, "the job processed nothing");
}

/// A second Ctrl-C while the job drains (slowly: its aggregate tasks are throttled behind a
/// backlog) ends `koala run` at once with exit 130, saying so, what it leaves and how to go on;
/// its worker processes are gone with it and the run is recorded as interrupted.
#[test]
fn a_second_ctrl_c_stops_at_once_and_says_what_it_leaves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, out_dir) =
        common::spawn_unbounded_run(dir.path(), 20000, "\n[runtime]\ntask_records_per_sec = 200\n");
    let group = child.id();
    let kill_all = || {
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{group}")]).status();
    };
    let (tx, lines) = mpsc::channel();
    let out_tx = tx.clone();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = out_tx.send(line);
        }
    });
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let wait_for = |what: &dyn Fn(&str) -> bool, seen: &mut Vec<String>| loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                let found = what(&line);
                seen.push(line);
                if found {
                    return;
                }
            }
            Err(_) => {
                kill_all();
                panic!("waited 60 s in vain:\n{}", seen.join("\n"));
            }
        }
    };
    // Running, with a backlog behind the throttled tasks: two progress lines.
    wait_for(&|l| l.starts_with('[') && l.contains("rec/s"), &mut seen);
    wait_for(&|l| l.starts_with('[') && l.contains("rec/s"), &mut seen);
    let interrupt = || Command::new("kill").args(["-INT", "--", &format!("-{group}")]).status();
    assert!(interrupt().is_ok_and(|s| s.success()), "first SIGINT");
    // The first is acknowledged (the job drains its backlog at 400 records/s), then the second.
    wait_for(&|l| l.contains("Ctrl-C: stopping the job"), &mut seen);
    assert!(interrupt().is_ok_and(|s| s.success()), "second SIGINT");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            kill_all();
            panic!("koala run did not end within 30 s of the second Ctrl-C:\n{}", seen.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The rest of both streams, until they close (the killed workers held them too).
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) {
        seen.push(line);
    }
    let log = seen.join("\n");
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(log.contains("second Ctrl-C: stopping now, without draining"), "{log}");
    assert!(log.contains("processes are killed") && log.contains("koala run <config>"), "{log}");
    assert!(
        !log.contains("done: run") && !log.contains("interrupted: run"),
        "a summary after a forced exit:\n{log}"
    );
    assert!(!common::group_alive(group), "a worker outlived the forced exit:\n{log}");
    let store = MetricsStore::open(&out_dir.join("metrics.db")).expect("metrics db");
    let run = store.latest_run().expect("read runs").expect("a run").run;
    assert_eq!(store.run_end(&run).expect("end").status, Some(RunStatus::Interrupted), "{log}");
}
