//! The coordinator notices a worker that disappears (kill -9) and ends the job with an error that
//! names the worker, instead of hanging.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn a_killed_worker_fails_the_job_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "query = \"keyed-aggregate\"\nworkers = 2\nduration_s = 120\noutput_dir = \"{}\"\n\
         [parallelism]\nsource = 2\naggregate = 2\nsink = 1\n[params]\nsink = \"discard\"\n\
         [params.source]\nrate = [{{ at_ms = 0, records_per_sec = 2000.0 }}]\n",
        dir.path().join("out").display()
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, config).expect("write config");
    let addr_file = dir.path().join("addr");
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
    let mut workers: Vec<_> = (0..2)
        .map(|i| {
            common::koala()
                .args(["worker", "--coordinator", &addr, "--data-dir"])
                .arg(dir.path().join(format!("w{i}")))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start worker")
        })
        .collect();
    // Wait for the job to run, then kill one worker the hard way.
    let mut log = BufReader::new(coordinator.stderr.take().expect("stderr")).lines();
    let mut seen = String::new();
    for line in log.by_ref() {
        let line = line.expect("read");
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("job started") {
            break;
        }
    }
    assert!(seen.contains("job started"), "the job never started:\n{seen}");
    workers[1].kill().expect("kill -9 a worker");
    let _ = workers[1].wait();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = coordinator.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "the coordinator did not notice the lost worker");
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest: Vec<String> = log.map_while(Result::ok).collect();
    let text = seen + &rest.join("\n");
    assert!(!status.success(), "the job must fail when a worker is lost");
    // Registration order decides which id the killed process had.
    assert!(
        text.contains("worker0 disappeared") || text.contains("worker1 disappeared"),
        "no clear error naming the worker:\n{text}"
    );
    let _ = workers[0].kill();
    let _ = workers[0].wait();
}
