//! `koala rescale|rebalance|migrate` against a running coordinator: bad requests get a clear
//! error and the job keeps running; a good request is carried out.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use common::koala;

fn request(args: &[&str]) -> (bool, String) {
    let out = koala().args(args).output().expect("start koala");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn bad_requests_are_rejected_and_the_job_keeps_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "query = \"keyed-aggregate\"\nworkers = 2\nduration_s = 8\nnum_buckets = 16\noutput_dir = \"{}\"\n\
         [parallelism]\nsource = 2\naggregate = 2\nsink = 1\n\
         [params]\nsink = \"discard\"\n[params.source]\nrate = [{{ at_ms = 0, records_per_sec = 4000.0 }}]\n",
        dir.path().join("out").display()
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, config).expect("write config");
    let mut job = koala().arg("run").arg(&path).stdout(Stdio::piped()).spawn().expect("start job");
    let (tx, rx) = mpsc::channel();
    let stdout = job.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let addr = loop {
        let line =
            rx.recv_timeout(Duration::from_secs(60)).expect("koala run prints its coordinator address");
        if let Some(rest) = line.strip_prefix("coordinator at ") {
            break rest.split_whitespace().next().expect("address").to_string();
        }
    };
    let base = ["--coordinator", addr.as_str()];
    let cases: &[(&[&str], &str)] = &[
        (&["rescale", "--operator", "nope", "--parallelism", "2"], "no operator \"nope\""),
        (&["rescale", "--operator", "aggregate", "--parallelism", "0"], "parallelism"),
        (&["rescale", "--operator", "aggregate", "--parallelism", "17"], "num_buckets"),
        (&["rescale", "--operator", "source", "--parallelism", "3"], "source"),
        (&["migrate", "--operator", "aggregate", "--task", "0", "--worker", "9"], "no worker 9"),
        (&["migrate", "--operator", "aggregate", "--task", "7", "--worker", "1"], "no task 7"),
        (&["rebalance", "--operator", "aggregate", "--move", "99:1"], "out of range"),
        (&["rebalance", "--operator", "aggregate", "--move", "x:1"], "not a bucket"),
    ];
    for (args, needle) in cases {
        let mut full: Vec<&str> = vec![args[0]];
        full.extend_from_slice(&base);
        full.extend_from_slice(&args[1..]);
        let (ok, text) = request(&full);
        assert!(!ok, "{full:?} was accepted: {text}");
        assert!(text.contains(needle), "{full:?}: expected {needle:?} in: {text}");
    }
    // The good request goes in once the progress line of second 1 is out: progress lines lag
    // the clock (every task must report its second first), so the reconfiguration starts in a
    // second whose predecessor's line is still to come, and a start line printed as it arrives
    // would come before it. (Sent earlier, in second 0, no line could be out of order.)
    loop {
        let line = rx.recv_timeout(Duration::from_secs(60)).expect("progress lines while the job runs");
        let second = line.strip_prefix('[').and_then(|l| l.split_once("s]")).map(|(s, _)| s.trim());
        if line.contains("rec/s") && second.and_then(|s| s.parse::<u64>().ok()).is_some_and(|s| s >= 1) {
            break;
        }
    }
    let (ok, text) =
        request(&["rescale", "--coordinator", &addr, "--operator", "aggregate", "--parallelism", "3"]);
    assert!(ok && text.contains("accepted"), "valid rescale: {text}");

    let status = job.wait().expect("job exits");
    let log = reader.join().expect("reader");
    assert!(status.success(), "the job failed after bad requests:\n{log}");
    assert!(log.contains("reconfiguration 1 completed"), "the good request did not complete:\n{log}");
    assert!(log.lines().filter(|l| l.contains("in ") && l.contains("rec/s")).count() >= 3, "{log}");
    assert_one_clock(&log);
}

/// The live log and the report use one clock: the reconfiguration's line carries the second it
/// started in, comes before that second's progress line (after every earlier second's), and the
/// report's epoch line says the same `t`.
fn assert_one_clock(log: &str) {
    let second_of =
        |line: &str| -> Option<u64> { line.strip_prefix('[')?.split_once("s]")?.0.trim().parse().ok() };
    let lines: Vec<&str> = log.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("] reconfiguration 1 started"))
        .unwrap_or_else(|| panic!("no timed start line for reconfiguration 1:\n{log}"));
    let started = second_of(lines[at]).unwrap_or_else(|| panic!("no second on {:?}", lines[at]));
    for earlier in lines[..at].iter().filter(|l| l.contains("rec/s")) {
        let second = second_of(earlier).unwrap_or(0);
        assert!(second < started, "progress of second {second} printed before a start at {started}:\n{log}");
    }
    // ... and after every earlier second's: printed as it happened, the start line came ~2 s
    // ahead of the progress lines, which wait until every task has reported its second. (A
    // second reported late by a task is printed again later; its first line counts.)
    let mut seen = std::collections::BTreeSet::new();
    for (i, line) in lines.iter().enumerate().filter(|(_, l)| l.contains("rec/s")) {
        let Some(second) = second_of(line) else { continue };
        if seen.insert(second) && second < started {
            assert!(i < at, "progress of second {second} first printed after a start at {started}:\n{log}");
        }
    }
    assert!(
        log.contains(&format!("epoch 1 scale_out of aggregate (koala): t={started}..")),
        "the report puts reconfiguration 1 elsewhere than second {started}:\n{log}"
    );
}
