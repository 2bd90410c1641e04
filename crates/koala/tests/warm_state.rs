//! Warm state end to end (docs/architecture.md §5): `koala warmup` writes padded keyed-aggregate
//! state into a snapshot, `koala run` with `warm_state` has every worker load its tasks' buckets
//! before the job starts, and the job continues from it: every key's first output counts the
//! warm record too, and a stop-and-restart scale-out moves the padded state of keys no record
//! touched.

mod common;

use std::collections::BTreeMap;

use common::verify::RunRecord;
use koala_workloads::KeyedTotal;

const WARM_KEYS: u64 = 4_000;
const VALUE_BYTES: u64 = 512;
/// The generator draws keys from `0..400`: 3 600 warm keys are never touched.
const KEY_SPACE: u64 = 400;

#[test]
fn a_job_continues_from_warm_state_and_moves_it_on_scale_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let warm = dir.path().join("warm");
    let mut generator = common::generator(12_000, 5);
    generator.key_space = KEY_SPACE;
    let mut config = common::config_top(
        dir.path(),
        "keyed-aggregate",
        &format!("protocol = \"stop-and-restart\"\nwarm_state = {:?}", warm.display().to_string()),
        &[("source", 2), ("aggregate", 2), ("sink", 1)],
        &generator,
        "",
    );
    config.push_str(
        "rate = [{ at_ms = 0, records_per_sec = 8000.0 }]\n\n[[reconfigurations]]\nat_s = 0.5\noperator = \"aggregate\"\nparallelism = 4\n",
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &config).expect("write config");

    let out = common::koala()
        .args(["warmup", "--keys", &WARM_KEYS.to_string(), "--value-bytes", &VALUE_BYTES.to_string()])
        .arg("--config")
        .arg(&path)
        .arg("--out")
        .arg(&warm)
        .output()
        .expect("start koala warmup");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "warmup failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("{WARM_KEYS} keys")), "{stdout}");

    let (out_dir, _) = common::run_job_logged(dir.path(), &config);
    // Warm key k holds count 1 and sum k: its first output row counts 2 and sums k + the value.
    let rows: Vec<KeyedTotal> = common::sink_output(&out_dir, "sink");
    assert_eq!(rows.len(), 12_000);
    let mut per_key: BTreeMap<u64, Vec<KeyedTotal>> = BTreeMap::new();
    for row in rows {
        per_key.entry(row.key).or_default().push(row);
    }
    for (key, rows) in &per_key {
        let counts: Vec<u64> = rows.iter().map(|r| r.count).collect();
        let expected: Vec<u64> = (2..rows.len() as u64 + 2).collect();
        let mut sorted = counts.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, expected, "key {key}: counts do not continue from the warm count 1");
    }
    // Stop-and-restart moves whole buckets: about half of the untouched warm keys' padding.
    let rec = RunRecord::read(&out_dir.join("metrics.db")).expect("run record");
    assert_eq!(rec.completed(), 1);
    let moved = rec.reconfigurations[0].bytes_moved;
    let untouched = (WARM_KEYS - KEY_SPACE) * VALUE_BYTES;
    assert!(moved >= untouched / 4, "moved {moved} B; the untouched warm state alone is {untouched} B");
}

/// `koala warmup --config` for a real-world query writes its operators' own layouts: an Azure
/// job over VMs `0..300` continues every warm VM's count and "recent" list (80 warm readings of
/// min 10 %, max 30 %, avg 20 %) — without the warm state every first row would count 1 and
/// report the VM's own reading.
#[test]
fn a_real_world_query_continues_from_its_warm_lists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let warm = dir.path().join("warm");
    let config = format!(
        "query = \"azure\"\nworkers = 2\noutput_dir = {:?}\nwarm_state = {:?}\n\n[parallelism]\nreadings = 1\ncpu_stats = 2\nsink = 1\n\n[params]\nsink = \"jsonl\"\nstate_padding_bytes = 64\n\n[params.generator]\nevents = 3000\nkeys = 300\nactive_keys = 300\nhot_ratio = 0.0\n\n[params.source]\nrate = [{{ at_ms = 0, records_per_sec = 20000.0 }}]\n",
        dir.path().join("out").display().to_string(),
        warm.display().to_string(),
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &config).expect("write config");
    let out = common::koala()
        .args(["warmup", "--keys", "1000", "--value-bytes", "64", "--config"])
        .arg(&path)
        .arg("--out")
        .arg(&warm)
        .output()
        .expect("start koala warmup");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "warmup failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("\"cpu_stats\": 2000 entries"), "{stdout}");

    let (out_dir, _) = common::run_job_logged(dir.path(), &config);
    let rows: Vec<koala_workloads::realworld::VmCpu> = common::sink_output(&out_dir, "sink");
    assert_eq!(rows.len(), 3_000);
    let mut first: BTreeMap<u64, koala_workloads::realworld::VmCpu> = BTreeMap::new();
    for row in rows {
        let e = first.entry(row.key).or_insert_with(|| row.clone());
        if row.count < e.count {
            *e = row;
        }
    }
    assert!(first.len() > 250, "{} VMs seen", first.len());
    for (vm, row) in &first {
        assert_eq!(row.count, 81, "VM {vm}: its first row must count the 80 warm readings");
        assert!(row.min <= 1_000 && row.max >= 3_000 && row.median == 2_000, "VM {vm}: {row:?}");
    }
}

/// A worker names the operators of the job it runs, so its own messages say `aggregate.0`, as
/// configs and reports do, not the internal `op1.0`. The message here is a
/// worker's: its task cannot restore the warm state (a part file of the snapshot is missing),
/// which the worker reports to the coordinator in its own words before any task runs.
#[test]
fn a_workers_own_error_names_the_task_by_its_operator() {
    let dir = tempfile::tempdir().expect("tempdir");
    let warm = dir.path().join("warm");
    let config = common::config_top(
        dir.path(),
        "keyed-aggregate",
        &format!("warm_state = {:?}", warm.display().to_string()),
        &[("source", 1), ("aggregate", 1), ("sink", 1)],
        &common::generator(1_000, 3),
        "",
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &config).expect("write config");
    let out = common::koala()
        .args(["warmup", "--keys", "100", "--value-bytes", "16", "--config"])
        .arg(&path)
        .arg("--out")
        .arg(&warm)
        .output()
        .expect("start koala warmup");
    assert!(out.status.success(), "warmup failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let parts: Vec<_> = std::fs::read_dir(warm.join("aggregate"))
        .expect("the snapshot of aggregate")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "kv"))
        .collect();
    assert!(!parts.is_empty(), "no part files in {}", warm.join("aggregate").display());
    for part in &parts {
        std::fs::remove_file(part).expect("remove a part");
    }

    let run = common::run_koala(dir.path(), &config, common::RUN_TIMEOUT);
    assert!(!run.success() && !run.timed_out, "the job ran without its warm state:\n{}", run.log());
    let error =
        run.stderr.lines().map(common::strip_ansi).find(|l| l.starts_with("error: ")).unwrap_or_default();
    assert!(error.contains("on worker") && error.contains("restoring warm state"), "{}", run.log());
    assert!(
        error.contains("aggregate.0: restoring"),
        "the worker's error does not name the operator: {error}"
    );
    assert!(!run.log().contains("op1."), "an internal operator id in the log:\n{}", run.log());
}
