//! Shared helpers of the end-to-end tests: write a job config, run `koala run` (a coordinator and
//! worker processes over loopback TCP, ports chosen by the OS), read what the sinks wrote, and
//! compute the expected output independently, by a plain single-threaded loop over the same
//! generated input.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use koala_dataflow::{KeyedEvent, KeyedEventsConfig};
use serde::de::DeserializeOwned;

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
    let mut text = format!(
        "query = \"{query}\"\nworkers = 2\noutput_dir = \"{}\"\n\n[parallelism]\n",
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
        generator.time_step_ms,
        generator.max_disorder_ms,
        generator.max_disorder_ms,
    ));
    text
}

/// Runs `koala run` on a config; panics with its output if it fails.
pub fn run_job(dir: &Path, config_text: &str) -> PathBuf {
    run_job_logged(dir, config_text).0
}

/// Like [`run_job`], also returning what `koala run` printed.
pub fn run_job_logged(dir: &Path, config_text: &str) -> (PathBuf, String) {
    let path = dir.join("job.toml");
    std::fs::write(&path, config_text).expect("write config");
    let out = koala().arg("run").arg(&path).output().expect("start koala run");
    assert!(
        out.status.success(),
        "koala run failed ({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (dir.join("out"), String::from_utf8_lossy(&out.stdout).into_owned())
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
        time_step_ms: 1,
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

pub mod oracle;
