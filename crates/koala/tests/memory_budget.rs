//! The worker memory budget (docs/architecture.md §5, "Memory budget"): `koala run` prints the
//! budget once, at the start; the coordinator's debug log (`KOALA_LOG=debug`) has each worker's split among its
//! stateful tasks, re-split when a scale-out adds tasks there; every task's cache reports its
//! hits and misses, and `koala report` shows the hit rate per task. Judged from the run's output
//! and metrics database, never by timing.

mod common;

use common::koala;

/// The split lines of the debug log (each after the log's own prefix).
fn memory_lines(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .map(common::strip_ansi)
        .filter_map(|l| l.find("[memory]").map(|at| l[at..].to_string()))
        .collect()
}

#[test]
fn each_workers_budget_is_split_among_its_stateful_tasks_and_re_split_at_a_scale_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = common::generator(8_000, 3);
    let mut config = common::config_top(
        dir.path(),
        "keyed-aggregate",
        "",
        &[("source", 2), ("aggregate", 2), ("sink", 1)],
        &generator,
        "",
    );
    config.push_str(
        "rate = [{ at_ms = 0, records_per_sec = 4000.0 }]\n\n[runtime]\nworker_memory_mb = 512\n\n\
         [[reconfigurations]]\nat_s = 1.0\noperator = \"aggregate\"\nparallelism = 4\n",
    );
    let run = common::run_koala_with_env(
        dir.path(),
        &config,
        common::RUN_TIMEOUT,
        &[("KOALA_LOG", "info,koala_coordinator=debug")],
    );
    assert!(run.success(), "{}\n{}", run.failure(), run.log());
    let out = dir.path().join("out");
    // Standard output: one line with the budget, at the start, nothing at the re-split.
    let printed: Vec<String> =
        run.stdout.lines().map(common::strip_ansi).filter(|l| l.contains("memory")).collect();
    assert_eq!(printed.len(), 1, "{printed:#?}");
    assert!(
        printed[0].starts_with("memory: 512.0 MiB per worker ([runtime] worker_memory_mb)"),
        "{printed:#?}"
    );
    assert!(!run.stdout.contains("[memory]") && !run.stdout.contains("stateful task(s)"), "{}", run.stdout);
    let lines = memory_lines(&run.stderr);
    let text = lines.join("\n");
    // 512 MiB per worker, fjall's 256 MiB block cache off the top; one aggregate task per worker
    // at the start: its share is the remaining 256 MiB, and its cache what its queues (8 MiB:
    // 2 × 64 messages × 256 records + 32 768 held records, at 128 B) and memtable (16 MiB) leave.
    for worker in ["worker0", "worker1"] {
        assert!(
            text.contains(&format!(
                "[memory] {worker}: budget 512.0 MiB ([runtime] worker_memory_mb); store 256.0 MiB off the top; 1 stateful task(s)"
            )),
            "{worker}'s first split missing:\n{text}"
        );
    }
    assert!(
        text.contains("share 256.0 MiB = queues 8.0 MiB + store 16.0 MiB + cache 232.0 MiB"),
        "one task's share at the start:\n{text}"
    );
    // The scale-out starts two more aggregate tasks; a worker that hosts two re-splits in halves.
    assert!(text.contains("; 2 stateful task(s)"), "no re-split after the scale-out:\n{text}");
    assert!(
        text.contains("share 128.0 MiB = queues 8.0 MiB + store 16.0 MiB + cache 104.0 MiB"),
        "two tasks' shares after the scale-out:\n{text}"
    );
    for task in ["aggregate.2", "aggregate.3"] {
        assert!(text.contains(&format!("[memory]   {task}: share")), "{task} got no share:\n{text}");
    }

    // Every aggregate task's cache reported its lookups, and the report shows the hit rate.
    let db = out.join("metrics.db");
    let report =
        koala().arg("report").arg(&db).arg("--out").arg(dir.path().join("report")).output().expect("report");
    let printed = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "koala report failed: {}", String::from_utf8_lossy(&report.stderr));
    let rates = printed
        .lines()
        .find(|l| l.starts_with("state cache hit rate"))
        .unwrap_or_else(|| panic!("no cache hit rate in the report:\n{printed}"));
    for task in ["aggregate.0", "aggregate.1", "aggregate.2", "aggregate.3"] {
        assert!(
            rates.contains(&format!("{task} ")) && !rates.contains(&format!("{task} no lookups")),
            "{rates}"
        );
    }
    assert!(!rates.contains("source.") && !rates.contains("sink."), "stateless tasks have no cache: {rates}");
}

#[test]
fn an_out_of_range_worker_memory_budget_is_named_with_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("job.toml");
    for mb in [0, 63, (1u64 << 20) + 1] {
        let text = format!(
            "query = \"keyed-aggregate\"\noutput_dir = \"unused\"\n[runtime]\nworker_memory_mb = {mb}\n"
        );
        std::fs::write(&path, text).expect("write config");
        let out = koala().arg("run").arg(&path).output().expect("start koala");
        assert!(!out.status.success(), "worker_memory_mb = {mb} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("runtime.worker_memory_mb") && err.contains("e.g. worker_memory_mb = 4096"),
            "{err}"
        );
    }
}
