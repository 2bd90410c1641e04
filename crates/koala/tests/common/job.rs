//! A job as real processes: a coordinator (`koala coordinator`) and worker processes
//! (`koala worker`) over TCP, with the coordinator's log readable line by line, so a test can
//! act at a logged moment (a checkpoint completed, a reconfiguration started) and `kill -9` a
//! worker then, never after a sleep.

use std::io::{BufRead, BufReader, Lines};
use std::path::Path;
use std::process::{Child, ChildStderr, Stdio};
use std::time::{Duration, Instant};

/// A running coordinator process.
pub struct Coordinator {
    pub child: Child,
    /// Its stdout, open until it exits (it prints its summary there; [`Coordinator::wait_exit`]
    /// returns it after the log).
    out: Lines<BufReader<std::process::ChildStdout>>,
    pub log: Lines<BufReader<ChildStderr>>,
    pub seen: String,
}

impl Coordinator {
    /// Reads the log until a line contains `what`; false if the coordinator ended first.
    pub fn wait_for(&mut self, what: &str) -> bool {
        for line in self.log.by_ref() {
            let Ok(line) = line else { return false };
            self.seen.push_str(&line);
            self.seen.push('\n');
            if line.contains(what) {
                return true;
            }
        }
        false
    }

    /// Reads the log until each of `marks` was seen, in this order (a later mark counts only
    /// after the one before it); false if the coordinator ended first.
    pub fn wait_for_each(&mut self, marks: &[&str]) -> bool {
        marks.iter().all(|mark| self.wait_for(mark))
    }

    /// Waits for the coordinator to exit (killing it past `limit`); returns whether it succeeded
    /// and its log followed by what it printed on stdout after its first line (the summary).
    pub fn wait_exit(mut self, limit: Duration) -> (bool, String) {
        let deadline = Instant::now() + limit;
        // Reading the log to its end also waits for the exit (stderr closes then).
        let rest: Vec<String> = self.log.by_ref().map_while(Result::ok).collect();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break Some(s);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let printed: Vec<String> = self.out.by_ref().map_while(Result::ok).collect();
        (status.is_some_and(|s| s.success()), self.seen + &rest.join("\n") + "\n" + &printed.join("\n"))
    }
}

/// The logs of the workers [`start_job`] started in `dir` (`w0.log`, `w1.log`; a worker that
/// restarts for a recovery goes on writing its own), concatenated.
pub fn worker_logs(dir: &Path) -> String {
    (0..2).filter_map(|i| std::fs::read_to_string(dir.join(format!("w{i}.log"))).ok()).collect()
}

/// Starts a coordinator and two workers of the job `text` in `dir`; each worker logs to
/// `dir/w<i>.log` ([`worker_logs`]).
pub fn start_job(dir: &Path, text: &str) -> Result<(Coordinator, Vec<Child>), String> {
    std::fs::write(dir.join("job.toml"), text).map_err(|e| e.to_string())?;
    let addr_file = dir.join("addr");
    let mut child = super::koala()
        .args(["coordinator", "--config"])
        .arg(dir.join("job.toml"))
        .arg("--address-file")
        .arg(&addr_file)
        .env("KOALA_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut out = BufReader::new(child.stdout.take().ok_or("stdout")?).lines();
    let first = out.next().ok_or("no line")?.map_err(|e| e.to_string())?;
    if !first.starts_with("coordinator listening on") {
        return Err(first);
    }
    let addr = std::fs::read_to_string(&addr_file).map_err(|e| e.to_string())?;
    let log = BufReader::new(child.stderr.take().ok_or("stderr")?).lines();
    let coordinator = Coordinator { child, out, log, seen: String::new() };
    let workers: Vec<Child> = (0..2)
        .map(|i| {
            let log = std::fs::File::create(dir.join(format!("w{i}.log")))
                .map_or_else(|_| Stdio::null(), Stdio::from);
            super::koala()
                .args(["worker", "--coordinator", &addr, "--data-dir"])
                .arg(dir.join(format!("w{i}")))
                .env("KOALA_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start worker")
        })
        .collect();
    Ok((coordinator, workers))
}

/// Starts a state server (the Remote backend's store) with its database under `dir`; returns it
/// and the address it listens on (an OS-chosen port).
pub fn start_state_server(dir: &Path) -> Result<(Child, String), String> {
    let mut child = super::koala()
        .args(["state-server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("state-server"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut out = BufReader::new(child.stdout.take().ok_or("stdout")?).lines();
    let first = out.next().ok_or("no line from the state server")?.map_err(|e| e.to_string())?;
    let addr = first.strip_prefix("state server listening on ").ok_or(first.clone())?.trim().to_string();
    // Whatever else it prints is read, so its stdout never closes under it.
    std::thread::spawn(move || out.for_each(drop));
    Ok((child, addr))
}
