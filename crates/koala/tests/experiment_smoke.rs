//! `koala experiment`: the list names every experiment; unknown names and protocols or policies an
//! experiment cannot take are refused; a job experiment's smoke variant (a few seconds per run) writes the page, the CSVs
//! and the plots, with one table row per protocol that names the protocol the run recorded; the
//! KLT micro-benchmark writes its table and page.

mod common;

use std::path::Path;

fn stdout_of(args: &[&str], out: Option<&Path>) -> (bool, String, String) {
    let mut cmd = common::koala();
    cmd.args(args);
    if let Some(out) = out {
        cmd.arg("--out").arg(out);
    }
    let o = cmd.output().expect("start koala");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn the_list_names_every_experiment_and_bad_requests_are_refused() {
    let (ok, list, err) = stdout_of(&["experiment", "--list"], None);
    assert!(ok, "{err}");
    for name in [
        "scale-out",
        "scale-out-queries",
        "repeated",
        "rebalance",
        "migration",
        "state-growth",
        "klt",
        "drrs-schedules",
        "uniform",
        "two-operators",
        "small-state",
        "hot-keys",
        "large-scale",
        "autoscale",
        "recovery",
    ] {
        assert!(list.lines().any(|l| l.starts_with(&format!("{name} "))), "{name} missing:\n{list}");
    }
    assert!(list.contains("--quick: ") && list.contains("full: ") && list.contains("Figure 14"), "{list}");
    let (ok, _, err) = stdout_of(&["experiment", "scale-up"], None);
    assert!(!ok && err.contains("unknown experiment") && err.contains("scale-out-queries"), "{err}");
    let (ok, _, err) = stdout_of(&["experiment", "migration", "--smoke", "--protocols", "drrs"], None);
    assert!(!ok && err.contains("--protocols drrs"), "{err}");
    let (ok, _, err) =
        stdout_of(&["experiment", "rebalance", "--smoke", "--partition-policy", "uniform"], None);
    assert!(!ok && err.contains("--partition-policy"), "{err}");
}

#[test]
fn a_smoke_run_writes_the_page_csvs_and_plots_with_a_row_per_protocol() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("exp");
    let (ok, stdout, err) = stdout_of(
        &["experiment", "scale-out", "--smoke", "--protocols", "stop-and-restart,koala"],
        Some(&out),
    );
    assert!(ok, "experiment failed:\n{stdout}\n{err}");
    assert!(stdout.lines().filter(|l| l.contains("rec/s")).count() >= 6, "per-second lines:\n{stdout}");
    for f in [
        "index.html",
        "runs.csv",
        "summary.csv",
        "throughput.png",
        "lag.png",
        "latency.png",
        "batch_latency.png",
        "state_moved.png",
    ] {
        let path = out.join(f);
        assert!(std::fs::metadata(&path).is_ok_and(|m| m.len() > 0), "{} missing", path.display());
    }
    let summary = std::fs::read_to_string(out.join("summary.csv")).expect("summary");
    let rows: Vec<Vec<&str>> = summary.lines().skip(1).map(|l| l.split(',').collect()).collect();
    // The recorded protocol (the run's metrics DB), in the order asked for.
    assert_eq!(
        rows.iter().map(|r| (r[0], r[1])).collect::<Vec<_>>(),
        vec![("stop-and-restart", "stop-and-restart"), ("koala", "koala")],
        "{summary}"
    );
    let runs = std::fs::read_to_string(out.join("runs.csv")).expect("runs");
    for p in ["koala", "stop-and-restart"] {
        assert!(
            runs.lines().filter(|l| l.split(',').nth(2) == Some(p)).count() >= 5,
            "{p}'s seconds:\n{runs}"
        );
    }
    let page = std::fs::read_to_string(out.join("index.html")).expect("page");
    for needle in [
        "task_records_per_sec = 4000",
        "link_mb_per_sec",
        "partition policy interleaved",
        "extra_keys = ",
        "stop-and-restart/report.html",
        "throughput.png",
        "<td>koala</td>",
    ] {
        assert!(page.contains(needle), "page lacks {needle:?}:\n{page}");
    }
}

#[test]
fn the_klt_benchmark_writes_its_table_and_page() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("klt");
    let (ok, stdout, err) = stdout_of(&["experiment", "klt", "--smoke"], Some(&out));
    assert!(ok, "{stdout}\n{err}");
    let summary = std::fs::read_to_string(out.join("summary.csv")).expect("summary");
    let keys: Vec<&str> = summary.lines().skip(1).filter_map(|l| l.split(',').next()).collect();
    assert_eq!(keys, vec!["20000", "160000"], "{summary}");
    assert!(std::fs::read_to_string(out.join("index.html")).expect("page").contains("B per handed-over key"));
}

/// The recovery experiment kills a worker of a real job per size and restore and tables the
/// recovery.
#[test]
fn the_recovery_experiment_kills_a_worker_per_size_and_tables_its_recovery() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("recovery");
    let (ok, stdout, err) = stdout_of(&["experiment", "recovery", "--smoke"], Some(&out));
    assert!(ok, "{stdout}\n{err}");
    let summary = std::fs::read_to_string(out.join("summary.csv")).expect("summary");
    // One size, restored lazily and eagerly.
    assert_eq!(summary.lines().count(), 3, "{summary}");
    assert!(summary.contains(",lazy,") && summary.contains(",eager,"), "{summary}");
    assert!(stdout.contains("(lazy restore): detection → restart"), "{stdout}");
    // Each size's processes and directories are gone; only the table is left.
    assert!(!out.join("4-MB").exists() && !out.join("warm").exists(), "{stdout}");
}

/// SIGTERM during an experiment's first run drains that run and runs no more: the others are
/// named as not run, and the experiment fails (before, each later run started, saw the stop flag
/// still set and ended at once, and the page tabled their empty runs).
#[test]
fn an_interrupted_experiment_runs_no_more() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("exp");
    let mut child = common::koala()
        .args(["experiment", "scale-out", "--smoke", "--protocols", "koala,stop-and-restart", "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start koala");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut seen = String::new();
    // The first per-second line of run 1: its job is running.
    loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).expect("read stdout") == 0 {
            panic!("the experiment ended before its first run's seconds:\n{seen}");
        }
        seen.push_str(&line);
        if line.contains("rec/s") {
            break;
        }
    }
    let sent = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert!(sent.is_ok_and(|s| s.success()), "kill -TERM failed");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).expect("read stdout");
    seen.push_str(&rest);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err).expect("stderr");
    let status = child.wait().expect("wait");
    assert!(!status.success(), "an interrupted experiment must fail:\n{seen}\n{err}");
    assert!(seen.contains("=== run 1/2: koala") && !seen.contains("=== run 2/2"), "{seen}");
    assert!(err.contains("stop-and-restart: not run (interrupted)"), "{err}");
}
