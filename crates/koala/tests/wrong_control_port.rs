//! `koala rescale --coordinator` and `koala worker --coordinator` given the coordinator's HTTP API
//! (dashboard) port instead of its control port: each ends within seconds with an error that
//! says which port it reached and gives the control address to use, instead of hanging.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

/// Waits for `child` at most `limit` (a hang detector: the bound is ten times what the command
/// needs); kills it and fails if it is still running then.
fn finished_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect");
            panic!("{what} still ran after {limit:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("collect")
}

#[test]
fn the_dashboard_port_given_as_the_control_port_is_named_with_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "query = \"keyed-aggregate\"\nworkers = 2\noutput_dir = \"{}\"\n[params]\nsink = \"discard\"\n",
        dir.path().join("out").display()
    );
    std::fs::write(dir.path().join("job.toml"), config).expect("write config");
    // Waits for 2 workers that never come: its control port and HTTP API are up meanwhile.
    let mut coordinator = common::koala()
        .args(["coordinator", "--config"])
        .arg(dir.path().join("job.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the coordinator");
    let mut out = BufReader::new(coordinator.stdout.take().expect("stdout")).lines();
    let first = out.next().expect("a first line").expect("utf-8");
    let control = first
        .strip_prefix("coordinator listening on ")
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no control address in {first:?}"))
        .to_string();
    let http = first
        .split("dashboard at http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no dashboard address in {first:?}"))
        .to_string();

    let rescale = common::koala()
        .args(["rescale", "--coordinator", &http, "--operator", "aggregate", "--parallelism", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start koala rescale");
    let rescale = finished_within(rescale, Duration::from_secs(20), "koala rescale at the dashboard port");
    let err = String::from_utf8_lossy(&rescale.stderr);
    assert!(!rescale.status.success(), "rescale at the HTTP port succeeded: {err}");
    let fix = format!("HTTP API (dashboard), not its control port; use --coordinator {control}");
    assert!(err.contains(&fix), "the error does not name the port and the fix ({fix:?}):\n{err}");

    let worker = common::koala()
        .args(["worker", "--coordinator", &http, "--data-dir"])
        .arg(dir.path().join("w"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start koala worker");
    let worker = finished_within(worker, Duration::from_secs(20), "koala worker at the dashboard port");
    let err = String::from_utf8_lossy(&worker.stderr);
    assert!(!worker.status.success(), "a worker registered at the HTTP port: {err}");
    assert!(err.contains(&fix), "the worker's error does not name the port and the fix:\n{err}");

    let _ = coordinator.kill();
    let _ = coordinator.wait();
}
