//! End-to-end: each registered query runs on 2 worker processes over loopback TCP, and the sink
//! output equals an expected output computed independently by a plain loop over the same input
//! (`common::expected`, shared with the random-schedule oracle).

mod common;

use std::collections::BTreeMap;

use common::expected::{keyed_totals, last_n_lists, self_join_pairs, window_join_pairs, window_totals};
use common::*;
use koala_workloads::{JoinPair, KeyedJoinPair, KeyedTotal, LastN, WindowTotal};

const RECORDS: u64 = 20_000;
const SOURCES: u32 = 2;

#[test]
fn keyed_running_aggregate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = generator(RECORDS, 11);
    let cfg = config(
        dir.path(),
        "keyed-aggregate",
        &[("source", SOURCES), ("aggregate", 3), ("sink", 1)],
        &generator,
        "",
    );
    let out = run_job(dir.path(), &cfg);
    let actual = per_key(sink_output::<KeyedTotal>(&out, "sink"), |r| r.key);
    let expected = keyed_totals(&input(&generator, SOURCES));
    assert_same("keyed-aggregate", &actual, &expected);
}

#[test]
fn last_n_list_state_keeps_per_key_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = generator(RECORDS, 12);
    let cfg = config(
        dir.path(),
        "last-n",
        &[("source", SOURCES), ("last_n", 2), ("sink", 1)],
        &generator,
        "last_n = 4\n",
    );
    let out = run_job(dir.path(), &cfg);
    let actual = per_key(sink_output::<LastN>(&out, "sink"), |r| r.key);
    let expected = last_n_lists(&input(&generator, SOURCES), 4);
    assert_same("last-n", &actual, &expected);
}

fn sorted_windows(rows: Vec<WindowTotal>) -> BTreeMap<u64, Vec<WindowTotal>> {
    let mut map = per_key(rows, |r| r.key);
    for v in map.values_mut() {
        v.sort_by_key(|w| w.start);
    }
    map
}

#[test]
fn tumbling_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = generator(RECORDS, 13);
    let cfg = config(
        dir.path(),
        "tumbling-window",
        &[("source", SOURCES), ("window", 3), ("sink", 2)],
        &generator,
        "window_ms = 500\n",
    );
    let out = run_job(dir.path(), &cfg);
    let actual = sorted_windows(sink_output(&out, "sink"));
    assert_same("tumbling-window", &actual, &window_totals(&input(&generator, SOURCES), 500, 500));
}

#[test]
fn sliding_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = generator(RECORDS, 14);
    let cfg = config(
        dir.path(),
        "sliding-window",
        &[("source", SOURCES), ("window", 2), ("sink", 1)],
        &generator,
        "window_ms = 600\nslide_ms = 200\n",
    );
    let out = run_job(dir.path(), &cfg);
    let actual = sorted_windows(sink_output(&out, "sink"));
    assert_same("sliding-window", &actual, &window_totals(&input(&generator, SOURCES), 600, 200));
}

#[test]
fn window_join() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut generator = generator(8_000, 15);
    generator.key_space = 100;
    let cfg = config(
        dir.path(),
        "window-join",
        &[("left", SOURCES), ("right", SOURCES), ("join", 3), ("sink", 2)],
        &generator,
        "window_ms = 250\n",
    );
    let out = run_job(dir.path(), &cfg);
    let mut actual = per_key(sink_output::<JoinPair>(&out, "sink"), |r| r.key);
    for v in actual.values_mut() {
        v.sort_by_key(|p| (p.start, p.left_seq, p.right_seq));
    }
    let left = input(&generator, SOURCES);
    let mut right_gen = generator.clone();
    right_gen.seed += 1;
    let right = input(&right_gen, SOURCES);
    let expected = window_join_pairs(&left, &right, 250);
    assert_same("window-join", &actual, &expected);
}

/// One source on both inputs of the join: every source task has two channels to every join task.
#[test]
fn self_join() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut generator = generator(8_000, 16);
    generator.key_space = 2_000;
    generator.hot_keys = 0;
    generator.hot_key_ratio = 0.0;
    let cfg =
        config(dir.path(), "self-join", &[("source", SOURCES), ("join", 3), ("sink", 2)], &generator, "");
    let out = run_job(dir.path(), &cfg);
    let mut actual = per_key(sink_output::<KeyedJoinPair>(&out, "sink"), |r| r.key);
    for v in actual.values_mut() {
        v.sort_by_key(|p| (p.left_seq, p.right_seq));
    }
    assert_same("self-join", &actual, &self_join_pairs(&input(&generator, SOURCES)));
}

/// The README's config (its `## A config` block, read from README.md), run with a tenth of its
/// records: every 1 s window holds the records of one second at its rate — a generated record's
/// event time is when it is due under the rate schedule — and the README's sentence about it
/// names the count its own config gives (20 windows of 50 000 records).
#[test]
fn the_readmes_window_example_gives_windows_of_one_second_at_its_rate() {
    let readme = std::fs::read_to_string(common::repo_root().join("README.md")).expect("README");
    let block = readme.split("## A config\n").nth(1).expect("README has `## A config`");
    let block =
        block.split("```toml\n").nth(1).and_then(|b| b.split("\n```").next()).expect("its toml block");
    let value = |key: &str| -> f64 {
        let line = block.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no {key} in:\n{block}"));
        let after = &line[line.find(key).expect("key") + key.len()..];
        let number: String = after
            .trim_start_matches([' ', '='])
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        number.parse().unwrap_or_else(|e| panic!("{key} in {line:?}: {e}"))
    };
    let (records, rate, window_ms) = (value("records ="), value("records_per_sec ="), value("window_ms ="));
    let per_window = (rate * window_ms / 1000.0) as u64;
    let group = |n: u64| {
        let digits = n.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(' ');
            }
            out.push(c);
        }
        out
    };
    let sentence = format!("{} windows of {} records", records as u64 / per_window, group(per_window));
    assert!(readme.contains(&sentence), "the README does not say what its config gives: {sentence:?}");

    // A tenth of the records, written to the test's directory; everything else as printed.
    let short = records as u64 / 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let config: String = block
        .lines()
        .map(|l| match l.split_whitespace().next() {
            Some("records") => format!("records = {short}"),
            Some("output_dir") => format!("output_dir = {:?}", dir.path().join("out").display().to_string()),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let out = run_job(dir.path(), &config);
    let mut per_start: BTreeMap<u64, u64> = BTreeMap::new();
    for row in sink_output::<WindowTotal>(&out, "sink") {
        *per_start.entry(row.start).or_default() += row.count;
    }
    let expected: BTreeMap<u64, u64> =
        (0..short / per_window).map(|w| (w * window_ms as u64, per_window)).collect();
    assert_eq!(per_start, expected, "records per window start of the README's config, {short} records");
}

/// A log that goes to a pipe or a file is plain text: with `KOALA_LOG=info`
/// the coordinator and both workers log, and no line carries a colour code.
#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(
        dir.path(),
        "keyed-aggregate",
        &[("source", 1), ("aggregate", 2), ("sink", 1)],
        &generator(2_000, 5),
        "",
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &config).expect("write config");
    let out = koala().arg("run").arg(&path).env("KOALA_LOG", "info").output().expect("start koala run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let plain = strip_ansi(&stderr);
    let workers_logged = ["worker0", "worker1"].iter().all(|w| plain.contains(&format!("worker={w}")));
    assert!(
        plain.contains(" INFO ") && workers_logged,
        "the coordinator and both workers log at info:\n{stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "colour codes in a log that is not a terminal:\n{stderr}");
}
