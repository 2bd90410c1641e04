//! Ctrl-C stops an unbounded job cleanly: `koala run` says at start that the job has no end and
//! how to stop it; a SIGINT to the whole process group (what a terminal's Ctrl-C sends) ends the
//! sources, the job drains, prints its summary and report, exits 0 and closes the metrics
//! database (no `-wal` file left), and the workers, which ignore the SIGINT, end with it.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use koala_coordinator::metrics_store::{Aggregate, MetricsStore, TaskScope};
use koala_types::metric;

#[test]
fn ctrl_c_drains_an_unbounded_job_and_prints_its_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_dir = dir.path().join("out");
    let config = format!(
        "query = \"keyed-aggregate\"\nworkers = 2\noutput_dir = {:?}\n\n[parallelism]\nsource = 1\naggregate = 2\n\n\
         [params]\nsink = \"discard\"\n\n[params.generator]\nkey_space = 1000\n\n\
         [params.source]\nrate = [{{ at_ms = 0, records_per_sec = 5000.0 }}]\n",
        out_dir.display().to_string()
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, config).expect("write config");
    let mut child = common::koala()
        .arg("run")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("start koala run");
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
    assert!(stdout.contains("done: run"), "no summary after Ctrl-C:\n{stdout}\n{stderr}");
    assert!(!stderr.contains("task failed"), "a task failed on Ctrl-C:\n{stderr}");
    assert!(out_dir.join("metrics.db").exists(), "no metrics database");
    assert!(!out_dir.join("metrics.db-wal").exists(), "the metrics database was not closed cleanly");
    let store = MetricsStore::open(&out_dir.join("metrics.db")).expect("metrics db");
    let run = store.latest_run().expect("read runs").expect("a run").run;
    let processed: f64 = store
        .per_second(&run, metric::RECORDS_IN, Aggregate::Sum, TaskScope::All)
        .expect("query")
        .iter()
        .map(|(_, v)| v)
        .sum();
    assert!(processed > 0.0, "the job processed nothing");
}
