//! Two runs of one job in one output directory: each keeps its report in its own run directory
//! (`<output_dir>/runs/<run>/`, `latest` pointing at the newest), `koala report --list` lists
//! both as finished, `koala run --resume` of the finished job refuses with when it finished and
//! where its results are, and each worker's data dir is named after the id the log calls it by.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn koala_run(args: &[&str], config: &Path) -> (Output, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_koala"))
        .args(args)
        .arg(config)
        .env("KOALA_LOG", "info")
        .output()
        .expect("start koala");
    let log = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, log)
}

/// The run id `koala run` announced (`run <id>: its report ... go to <dir>`).
fn announced_run(log: &str) -> String {
    log.lines()
        .find_map(|l| l.strip_prefix("run ")?.split(':').next().filter(|r| r.starts_with("run-")))
        .unwrap_or_else(|| panic!("no run announced:\n{log}"))
        .to_string()
}

#[test]
fn each_run_keeps_its_report_and_a_finished_job_is_not_resumed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let config = common::config_top(
        dir.path(),
        "keyed-aggregate",
        "checkpoint_interval_ms = 200",
        &[("source", 2), ("aggregate", 2), ("sink", 1)],
        &common::generator(3_000, 1),
        "",
    ) + "rate = [{ at_ms = 0, records_per_sec = 3000.0 }]\n";
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &config).expect("write config");

    let (first, log) = koala_run(&["run"], &path);
    assert!(first.status.success(), "the first run failed:\n{log}");
    let run1 = announced_run(&log);
    let run1_dir = out.join("runs").join(&run1);
    for file in ["report.html", "summary.txt", "job.toml", "throughput.png"] {
        assert!(run1_dir.join(file).exists(), "no {file} in {}:\n{log}", run1_dir.display());
    }
    assert!(log.contains(&format!("plots and report written to {}", run1_dir.display())), "{log}");
    // Each worker's data dir has the number the coordinator and the worker's log call it by.
    for id in 0..2 {
        let registered = log
            .lines()
            .find(|l| l.contains(&format!("registered with the coordinator as worker{id}")))
            .unwrap_or_else(|| panic!("worker{id} did not log its registration:\n{log}"));
        let data_dir = out.join("state").join(format!("worker-{id}"));
        assert!(
            registered.contains(&format!("data_dir={}", data_dir.display())),
            "worker{id}'s data dir is not worker-{id}: {registered}"
        );
        assert!(data_dir.is_dir(), "{} was not created:\n{log}", data_dir.display());
    }

    // A finished job is not resumed: the error says when it finished and where its results are.
    let (resumed, log) = koala_run(&["run", "--resume"], &out);
    assert!(!resumed.status.success(), "a finished job was resumed:\n{log}");
    assert!(
        log.contains("already finished, at ") && log.contains(&format!("(run {run1})")),
        "the refusal does not say when the job finished:\n{log}"
    );
    assert!(log.contains("without --resume") && log.contains(&run1_dir.display().to_string()), "{log}");

    let (second, log) = koala_run(&["run"], &path);
    assert!(second.status.success(), "the second run failed:\n{log}");
    let run2 = announced_run(&log);
    assert_ne!(run1, run2);
    assert!(run1_dir.join("report.html").exists(), "the second run removed the first one's report");
    assert!(out.join("runs").join(&run2).join("report.html").exists(), "{log}");
    let latest = std::fs::read_link(out.join("latest")).expect("a latest link");
    assert_eq!(latest, Path::new("runs").join(&run2));

    let list = Command::new(env!("CARGO_BIN_EXE_koala"))
        .args(["report", "--list"])
        .arg(&out)
        .output()
        .expect("koala report --list");
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "{text}{}", String::from_utf8_lossy(&list.stderr));
    for run in [&run1, &run2] {
        let line = text
            .lines()
            .find(|l| l.starts_with(run.as_str()))
            .unwrap_or_else(|| panic!("{run} not listed:\n{text}"));
        assert!(line.contains("finished") && line.contains("keyed-aggregate"), "{line}");
    }
}
