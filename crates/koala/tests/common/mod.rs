//! Shared helpers of the end-to-end tests: write a job config, run `koala run` (a coordinator and
//! worker processes over loopback TCP, ports chosen by the OS), read what the sinks wrote, and
//! compute the expected output independently, by a plain single-threaded loop over the same
//! generated input.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use koala_dataflow::{KeyedEvent, KeyedEventsConfig};
use serde::de::DeserializeOwned;

/// The start parallelism, the end parallelism and the `[[reconfigurations]]` of an oracle
/// scenario of operator `op` at `at_s`: scale-out 2 → 4, scale-in 4 → 2, a rebalance that moves
/// 32 buckets to task 1 and 8 to task 0, a migration of task 0 to worker 1 (the load rebalance of
/// a stateless operator, which has no buckets), or `out-rebalance-in`: 2 → 4 at `at_s`, the
/// rebalance (to tasks 3 and 0) 0.4 s later and 4 → 2 0.8 s later.
pub fn scenario_schedule(scenario: &str, op: &str, at_s: f64) -> (u32, u32, String) {
    let head = |at: f64| format!("[[reconfigurations]]\nat_s = {at}\noperator = \"{op}\"\n");
    let moves = |to: u32| {
        format!(
            "moves = [{{ buckets = [{}], to = {to} }}, {{ buckets = [100, 101, 102, 103, 104, 105, 106, 107], to = 0 }}]\n",
            (0..32).map(|b| b.to_string()).collect::<Vec<_>>().join(", ")
        )
    };
    let first = head(at_s);
    match scenario {
        "scale-out" => (2, 4, format!("{first}parallelism = 4\n")),
        "scale-in" => (4, 2, format!("{first}parallelism = 2\n")),
        "rebalance" => (2, 2, format!("{first}{}", moves(1))),
        "migrate" => (2, 2, format!("{first}task = 0\nworker = 1\n")),
        "out-rebalance-in" => (
            2,
            2,
            format!(
                "{first}parallelism = 4\n{}{}{}parallelism = 2\n",
                head(at_s + 0.4),
                moves(3),
                head(at_s + 0.8)
            ),
        ),
        other => panic!("no scenario {other}"),
    }
}

/// The repository's root: from the run-time `CARGO_MANIFEST_DIR` (cargo and nextest set it), so a
/// test binary reused from a shared build cache reads this checkout, not the one it was built in.
pub fn repo_root() -> PathBuf {
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    Path::new(&crate_dir).join("../..")
}

/// The `koala` binary built for this test run.
pub fn koala() -> Command {
    Command::new(env!("CARGO_BIN_EXE_koala"))
}

/// A job config for `query` over a bounded generator, with outputs under `dir`.
pub fn config(
    dir: &Path,
    query: &str,
    parallelism: &[(&str, u32)],
    generator: &KeyedEventsConfig,
    extra_params: &str,
) -> String {
    config_top(dir, query, "", parallelism, generator, extra_params)
}

/// Like [`config`], with more top-level lines (`protocol = "…"`, `extra_keys = N`,
/// `partition_policy = "…"`), written before the first table so they stay top-level.
pub fn config_top(
    dir: &Path,
    query: &str,
    top: &str,
    parallelism: &[(&str, u32)],
    generator: &KeyedEventsConfig,
    extra_params: &str,
) -> String {
    let mut text = format!(
        "query = \"{query}\"\nworkers = 2\noutput_dir = \"{}\"\n{top}\n[parallelism]\n",
        dir.join("out").display()
    );
    for (op, p) in parallelism {
        text.push_str(&format!("{op} = {p}\n"));
    }
    text.push_str(&format!(
        "\n[params]\nsink = \"jsonl\"\n{extra_params}\n[params.generator]\nkey_space = {}\nhot_keys = {}\nhot_key_ratio = {}\nrecords = {}\nseed = {}\ntime_step_ms = {}\nmax_disorder_ms = {}\n\n[params.source]\nmax_disorder_ms = {}\nwatermark_interval_ms = 20\n",
        generator.key_space,
        generator.hot_keys,
        generator.hot_key_ratio,
        generator.records.unwrap_or(0),
        generator.seed,
        generator.time_step_ms.unwrap_or(1),
        generator.max_disorder_ms,
        generator.max_disorder_ms,
    ));
    text
}

/// A reconfigured run of an oracle case, at the rate it ended up using.
pub struct Scheduled {
    /// Holds the run's files.
    pub dir: tempfile::TempDir,
    /// The config it ran.
    pub text: String,
    /// Its output directory.
    pub out: PathBuf,
    /// What `koala run` printed.
    pub log: String,
    /// The source rate (records per second) of the run.
    pub rate: u32,
}

/// Runs the config `text_at(dir, rate)` at `rate`; if the log shows a scheduled request skipped
/// although it came before the input ended ([`schedule_outlasted_input`]), reruns it at half the
/// rate, up to twice. Such a run did not test what its schedule means (reconfigurations while
/// records flow): the machine was so loaded that the reconfigurations before that request
/// outlasted the input. Any other outcome is returned as it is, to be judged.
pub fn run_scheduled(rate: u32, mut text_at: impl FnMut(&Path, u32) -> String) -> Scheduled {
    let mut rate = rate;
    for attempt in 0.. {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = text_at(dir.path(), rate);
        let (out, log) = run_job_logged(dir.path(), &text);
        if attempt < 2 && schedule_outlasted_input(&log) {
            eprintln!(
                "the input ended before a scheduled request's turn at {rate} records/s (a loaded machine); rerunning at {}",
                rate / 2
            );
            rate /= 2;
            continue;
        }
        return Scheduled { dir, text, out, log, rate };
    }
    unreachable!("the loop returns")
}

/// Whether the log of a run shows a scheduled request skipped although it came before its
/// operator's input ended ([`skipped_after_the_input_ended`] fails).
pub fn schedule_outlasted_input(log: &str) -> bool {
    skipped_after_the_input_ended(log).is_err()
}

/// Requests the coordinator skipped because their operator's input had ended: how many, if each
/// came (by the coordinator's own clock, printed in the line) no earlier than the coordinator knew
/// the input had ended. One that came before and was skipped only because it waited behind
/// earlier reconfigurations is an error: the schedule asked for it while records still flowed.
pub fn skipped_after_the_input_ended(stdout: &str) -> Result<usize, String> {
    let mut skipped = 0;
    for line in stdout.lines().filter(|l| l.contains("rejected: skipped:")) {
        let number_after = |label: &str| -> Option<f64> {
            let rest = &line[line.find(label)? + label.len()..];
            rest.split(" s").next()?.trim().parse().ok()
        };
        let (Some(ended), Some(came)) = (number_after("input ended at "), number_after("request came at "))
        else {
            return Err(format!("a skipped request without its times: {line}"));
        };
        if ended < 0.0 || came < ended {
            return Err(format!(
                "a request that came at {came:.3} s, before its input ended at {ended:.3} s, was skipped \
                 (it waited behind earlier reconfigurations until the input had ended): {line}"
            ));
        }
        skipped += 1;
    }
    Ok(skipped)
}

/// Runs `koala run` on a config; panics with its output if it fails.
pub fn run_job(dir: &Path, config_text: &str) -> PathBuf {
    run_job_logged(dir, config_text).0
}

/// Like [`run_job`], also returning what `koala run` printed (stdout). A run that does not end
/// within [`RUN_TIMEOUT`] is killed and fails the test with its log.
pub fn run_job_logged(dir: &Path, config_text: &str) -> (PathBuf, String) {
    let out = run_koala(dir, config_text, RUN_TIMEOUT);
    assert!(out.success(), "{}\nconfig:\n{config_text}\n{}", out.failure(), out.log());
    (dir.join("out"), out.stdout)
}

/// How long one `koala run` of a test may take before it counts as hung.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// What one `koala run` did.
pub struct RunOutput {
    /// Exit status (`None` if it was killed after the time-out).
    pub status: Option<ExitStatus>,
    /// Whether it was killed after the time-out.
    pub timed_out: bool,
    /// How long it ran.
    pub elapsed: Duration,
    /// Standard output (progress, reconfiguration lines, summary).
    pub stdout: String,
    /// Standard error (coordinator and worker logs).
    pub stderr: String,
    /// The process group `koala run` led (its pid).
    pub group: u32,
}

impl RunOutput {
    /// Exited 0 in time.
    pub fn success(&self) -> bool {
        !self.timed_out && self.status.is_some_and(|s| s.success())
    }

    /// One line saying how it failed: the error `koala run` exited with (`error: …`), and the
    /// first error line of the log.
    pub fn failure(&self) -> String {
        let how = if self.timed_out {
            format!("koala run hung: killed after {:.0} s", self.elapsed.as_secs_f64())
        } else {
            format!("koala run failed ({})", self.status.map_or("no status".to_string(), |s| s.to_string()))
        };
        let exit = self.stderr.lines().rev().map(strip_ansi).find(|l| l.starts_with("error: "));
        match exit {
            Some(e) => format!("{how}: {e}; first error: {}", self.first_error()),
            None => format!("{how}; first error: {}", self.first_error()),
        }
    }

    /// The first line of the log that reports an error (or a rejected reconfiguration).
    pub fn first_error(&self) -> String {
        let lines = || self.stderr.lines().chain(self.stdout.lines()).map(strip_ansi);
        let is_error = |l: &String| {
            l.contains("ERROR") || l.contains("panicked") || l.starts_with("Error") || l.contains("error:")
        };
        lines()
            .find(is_error)
            .or_else(|| lines().find(|l| l.contains("rejected") || l.contains("WARN")))
            .unwrap_or_else(|| "(no error line in the log)".into())
    }

    /// Both streams, for failure messages.
    pub fn log(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }
}

/// Removes ANSI colour sequences (tracing colours its output).
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Writes `config_text` to `dir/job.toml` and runs `koala run` on it in its own process group;
/// after `timeout` the whole group (the coordinator process and its workers) is killed.
pub fn run_koala(dir: &Path, config_text: &str, timeout: Duration) -> RunOutput {
    run_koala_with_env(dir, config_text, timeout, &[])
}

/// [`run_koala`] with more environment variables (e.g. `KOALA_LOG`).
pub fn run_koala_with_env(
    dir: &Path,
    config_text: &str,
    timeout: Duration,
    env: &[(&str, &str)],
) -> RunOutput {
    let started = Instant::now();
    let mut child = spawn_run(dir, config_text, env);
    let group = child.id();
    let read = |stream: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut s) = stream {
                let _ = s.read_to_end(&mut text);
            }
            let _ = tx.send(String::from_utf8_lossy(&text).into_owned());
        });
        rx
    };
    let stdout = read(child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let stderr = read(child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let deadline = started + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                timed_out = true;
                kill_group(group);
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("waiting for koala run: {e}"),
        }
    };
    let elapsed = started.elapsed();
    // Workers left behind (they share the group) would keep the pipes open: give them a moment
    // to exit, then kill what is left of the group.
    let collect = |rx: mpsc::Receiver<String>| {
        rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| {
            kill_group(group);
            rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| "<output unavailable>".into())
        })
    };
    let stdout = collect(stdout);
    let stderr = collect(stderr);
    RunOutput { status, timed_out, elapsed, stdout, stderr, group }
}

/// SIGKILL to every process of the group `koala run` leads (it started its workers in it).
fn kill_group(group: u32) {
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{group}")]).stderr(Stdio::null()).status();
}

/// An unbounded job — the keyed aggregate at `rate` records/s into the discard sink, `extra`
/// appended to its config — started by `koala run` in a process group of its own (so a test can
/// signal or kill all of it), its stdout and stderr piped. Returns the child and the job's
/// output directory (`dir/out`).
pub fn spawn_unbounded_run(dir: &Path, rate: u32, extra: &str) -> (std::process::Child, PathBuf) {
    let out_dir = dir.join("out");
    let config = format!(
        "query = \"keyed-aggregate\"\nworkers = 2\noutput_dir = {:?}\n\n[parallelism]\nsource = 1\naggregate = 2\n\n\
         [params]\nsink = \"discard\"\n\n[params.generator]\nkey_space = 1000\n\n\
         [params.source]\nrate = [{{ at_ms = 0, records_per_sec = {rate}.0 }}]\n{extra}",
        out_dir.display().to_string()
    );
    (spawn_run(dir, &config, &[]), out_dir)
}

/// `koala run` of `config_text` (written to `dir/job.toml`) with `env` added, in a process group
/// of its own (so a test can signal or kill all of it), stdout and stderr piped.
fn spawn_run(dir: &Path, config_text: &str, env: &[(&str, &str)]) -> std::process::Child {
    let path = dir.join("job.toml");
    std::fs::write(&path, config_text).expect("write config");
    koala()
        .arg("run")
        .arg(&path)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("start koala run")
}

/// Whether any process of the group is still alive (signal 0 reaches one).
pub fn group_alive(group: u32) -> bool {
    Command::new("kill")
        .args(["-0", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Every line every task of sink `sink` wrote, parsed.
pub fn sink_output<T: DeserializeOwned>(out_dir: &Path, sink: &str) -> Vec<T> {
    let mut rows = Vec::new();
    let prefix = format!("{sink}-");
    for entry in std::fs::read_dir(out_dir).expect("list output dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if name.starts_with(&prefix) && name.ends_with(".jsonl") {
            let text = std::fs::read_to_string(&path).expect("read sink file");
            for line in text.lines() {
                rows.push(
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad line {line:?} in {name}: {e}")),
                );
            }
        }
    }
    rows
}

/// Groups rows per key, keeping arrival order within a key.
pub fn per_key<T, K: Ord>(rows: Vec<T>, key: impl Fn(&T) -> K) -> BTreeMap<K, Vec<T>> {
    let mut map: BTreeMap<K, Vec<T>> = BTreeMap::new();
    for r in rows {
        map.entry(key(&r)).or_default().push(r);
    }
    map
}

/// The generated input in per-key order (every key's records come from one source task, in
/// sequence order).
pub fn input(generator: &KeyedEventsConfig, source_parallelism: u32) -> Vec<(KeyedEvent, u64)> {
    koala_dataflow::KeyedEvents::all_records(generator, source_parallelism)
}

/// A small bounded generator for tests.
pub fn generator(records: u64, seed: u64) -> KeyedEventsConfig {
    KeyedEventsConfig {
        key_space: 400,
        hot_keys: 10,
        hot_key_ratio: 0.2,
        records: Some(records),
        seed,
        time_step_ms: Some(1),
        max_disorder_ms: 20,
        ..Default::default()
    }
}

/// Asserts two per-key maps are equal, naming the first key and position that differ. Per-key
/// order is compared as given: only order-sensitive checks keep arrival order, and those run with
/// one sink task (two sink tasks fed round-robin interleave a key's rows across two files).
pub fn assert_same<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    what: &str,
    actual: &BTreeMap<K, Vec<V>>,
    expected: &BTreeMap<K, Vec<V>>,
) {
    assert!(!expected.is_empty(), "{what}: the expected output is empty; the test proves nothing");
    for (k, exp) in expected {
        let got = actual.get(k).map(Vec::as_slice).unwrap_or_default();
        if got != exp.as_slice() {
            let at = got.iter().zip(exp).position(|(a, b)| a != b).unwrap_or(got.len().min(exp.len()));
            panic!(
                "{what}: output of key {k:?} differs at position {at} (got {} rows, expected {}): got {:?}, expected {:?}",
                got.len(),
                exp.len(),
                got.get(at),
                exp.get(at)
            );
        }
    }
    let extra: Vec<&K> = actual.keys().filter(|k| !expected.contains_key(k)).collect();
    assert!(extra.is_empty(), "{what}: unexpected keys in output: {extra:?}");
}

pub mod expected;
pub mod job;
pub mod model;
pub mod nexmark;
pub mod oracle;
pub mod realworld;
pub mod verify;
