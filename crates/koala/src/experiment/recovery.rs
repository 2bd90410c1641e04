//! `koala experiment recovery` (docs/architecture.md §10): how long a recovery from a checkpoint
//! takes as the state grows. For each warm state size the keyed aggregate runs over real
//! processes — a coordinator and two workers, started from this binary as `koala coordinator`
//! and `koala worker` — with a checkpoint every second and a rate that touches about 10 % of its
//! keys per second; once a checkpoint or two completed (steady state) one worker is `kill -9`ed,
//! and the recovery is timed from the coordinator's records: detection → restart, detection →
//! first record out of a sink, and detection → the first checkpoint completed after it (the
//! whole state back and durable again). Each size runs twice: with the lazy restore (the
//! default) and with every bucket group loaded before the tasks start (`RESTORE_EAGERLY` in the
//! workers' environment), so one sitting compares them. The table adds the checkpoints' duration
//! and size before the kill, and the growth from the smallest to the largest size.
//!
//! Kill moments are read from the coordinator's log (`checkpoint k completed`), never from
//! sleeps; every process is killed when a size is done, and its directory and warm state
//! deleted (gigabytes each; the table is in `<out>/summary.csv`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::Context;
use koala_coordinator::JobConfig;
use koala_coordinator::metrics_store::{CheckpointRecord, MetricsStore, RecoveryRecord};

use super::engine::Table;
use super::{Info, Mode, Options, Runner};
use crate::human::human_bytes;

/// `koala experiment recovery`.
pub const RECOVERY: Info = Info {
    name: "recovery",
    figure: "no paper figure (checkpoints and recovery, docs/architecture.md §10)",
    shows: "recovery from a kill -9 at steady state as warm state grows: detection → restart → first record out, and checkpoint cost",
    quick: "32, 64, 128, 256 MB warm, a checkpoint every second, a kill per run, lazy and eager restore: about 3 minutes",
    full: "250, 500, 750 MB and 1 GB warm, a checkpoint every second, a kill per run, lazy and eager restore: about 8 minutes",
    protocols: &["koala"],
    runner: Runner::Own(run),
};

/// Bytes per warm value: few records per second for a given share of the state touched.
const VALUE_BYTES: usize = 16 << 10;
/// Share of the keys the offered rate touches per second.
const TOUCHED_PER_SEC: f64 = 0.10;
/// How long one size may take to reach each mark before it is given up.
const MARK_TIMEOUT: Duration = Duration::from_secs(900);

/// One run's measurement.
struct Row {
    /// `lazy` (the default) or `eager` (every group loaded before the tasks start).
    restore: &'static str,
    state_bytes: u64,
    keys: u64,
    recovery: RecoveryRecord,
    /// Detection → the first checkpoint completed after the restart, ms.
    durable_again_ms: Option<u64>,
    /// Checkpoints completed before the kill.
    before: Vec<CheckpointRecord>,
}

fn run(info: &Info, mode: Mode, opts: &Options) -> anyhow::Result<()> {
    let protocol = match opts.protocols.as_deref() {
        None => "koala".to_string(),
        Some([one]) => one.clone(),
        Some(_) => anyhow::bail!("--protocols: experiment recovery runs one protocol at a time"),
    };
    let sizes_mb: Vec<u64> = mode.pick(vec![4], vec![32, 64, 128, 256], vec![250, 500, 750, 1024]);
    // Checkpoints completed before the kill (the first one writes every byte).
    let kill_after = mode.pick(1, 2, 2);
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    println!(
        "{}: keyed-aggregate, {protocol}, 2 workers (source 2, aggregate 2, sink 1), {} B values, {:.0} % of the keys touched per second, a checkpoint every second; worker 1 killed with SIGKILL once checkpoint {kill_after} completed",
        info.name,
        VALUE_BYTES,
        TOUCHED_PER_SEC * 100.0
    );
    let mut rows = Vec::new();
    for mb in sizes_mb {
        for eager in [false, true] {
            let row = measure(mb, kill_after, &protocol, &opts.out, eager)
                .with_context(|| format!("the {mb} MB run of experiment recovery"))?;
            println!(
                "{} ({} restore): detection → restart {} ms, → first record out {}, → durable again {}",
                human_bytes(row.state_bytes),
                row.restore,
                row.recovery.restart_ms(),
                ms_or_none(row.recovery.first_output_after_ms()),
                ms_or_none(row.durable_again_ms)
            );
            rows.push(row);
        }
    }
    let table = table(&rows);
    println!("{}", table.text());
    for restore in ["lazy", "eager"] {
        let of: Vec<&Row> = rows.iter().filter(|r| r.restore == restore).collect();
        println!("{restore} restore: {}", growth(&of));
    }
    let csv = std::iter::once(table.columns.join(","))
        .chain(table.rows.iter().map(|r| r.join(",")))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(opts.out.join("summary.csv"), csv + "\n")
        .with_context(|| format!("writing {}", opts.out.join("summary.csv").display()))?;
    Ok(())
}

fn ms_or_none(ms: Option<u64>) -> String {
    ms.map_or_else(|| "none".to_string(), |ms| format!("{ms} ms"))
}

fn table(rows: &[Row]) -> Table {
    let columns = vec![
        "state",
        "restore",
        "keys",
        "detection → restart",
        "detection → first record out",
        "detection → durable again",
        "checkpoint duration (mean)",
        "checkpoint size (last)",
    ];
    let rows = rows
        .iter()
        .map(|r| {
            let n = r.before.len().max(1) as u64;
            let duration: u64 = r.before.iter().map(|c| c.completed_ms.saturating_sub(c.started_ms)).sum();
            vec![
                human_bytes(r.state_bytes),
                r.restore.to_string(),
                r.keys.to_string(),
                format!("{} ms", r.recovery.restart_ms()),
                ms_or_none(r.recovery.first_output_after_ms()),
                ms_or_none(r.durable_again_ms),
                format!("{} ms", duration / n),
                human_bytes(r.before.last().map_or(0, |c| c.bytes)),
            ]
        })
        .collect();
    Table { columns, rows }
}

/// The growth of detection → first record out from the smallest size to the largest.
fn growth(rows: &[&Row]) -> String {
    let first = |r: &Row| r.recovery.first_output_after_ms();
    match (rows.first(), rows.last()) {
        (Some(a), Some(b)) if rows.len() > 1 => match (first(a), first(b)) {
            (Some(x), Some(y)) => format!(
                "detection → first record out: {x} ms at {} → {y} ms at {}: {:+.0} % over {:.1}× the state",
                human_bytes(a.state_bytes),
                human_bytes(b.state_bytes),
                (y as f64 / x.max(1) as f64 - 1.0) * 100.0,
                b.state_bytes as f64 / a.state_bytes.max(1) as f64
            ),
            _ => "growth: a run had no first record out".to_string(),
        },
        _ => "one size: no growth".to_string(),
    }
}

/// The job config of one size: `warm` loaded, a checkpoint every second.
fn config(out: &Path, keys: u64, protocol: &str, warm: Option<&Path>) -> String {
    let rate = (keys as f64 * TOUCHED_PER_SEC).max(100.0);
    let warm = warm.map_or(String::new(), |w| format!("warm_state = {:?}\n", w.display().to_string()));
    format!(
        "query = \"keyed-aggregate\"\nworkers = 2\nduration_s = 3600\noutput_dir = {:?}\nprotocol = \"{protocol}\"\n\
         checkpoint_interval_ms = 1000\ncheckpoints_retained = 1\n{warm}\
         \n[parallelism]\nsource = 2\naggregate = 2\nsink = 1\n\
         \n[params]\nsink = \"discard\"\nstate_padding_bytes = {VALUE_BYTES}\n\
         [params.generator]\nkey_space = {keys}\nhot_keys = 0\nhot_key_ratio = 0.0\nseed = 7\n\
         [params.source]\nmax_disorder_ms = 50\nwatermark_interval_ms = 200\n\
         rate = [{{ at_ms = 0, records_per_sec = {rate:.1} }}]\n",
        out.display().to_string()
    )
}

/// Writes the warm state of `keys` keys under `<out>/warm` (unless there); returns its directory.
fn warm_state(out: &Path, keys: u64, protocol: &str) -> anyhow::Result<PathBuf> {
    let dir = out.join("warm").join(format!("keyed-aggregate-{keys}-keys-{VALUE_BYTES}-B"));
    if dir.join("aggregate").join("manifest").exists() {
        return Ok(dir);
    }
    let bare = JobConfig::parse(&config(out, keys, protocol, None), "koala experiment recovery")?;
    let started = Instant::now();
    let written = crate::warmup::warmup(
        "keyed-aggregate",
        &bare.params_text(),
        bare.num_buckets,
        keys,
        VALUE_BYTES,
        &dir,
    )?;
    println!(
        "warm state: {keys} keys, {} in {:.1} s",
        human_bytes(written.iter().map(|w| w.bytes).sum()),
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}

/// The processes of one run; killed when dropped.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The coordinator's log, line by line, from a reader thread.
struct Log(Receiver<String>);

impl Log {
    /// Waits for a line containing `what`.
    fn wait_for(&self, what: &str, limit: Duration) -> anyhow::Result<()> {
        self.wait_until(|line| line.contains(what), what, limit)
    }

    /// Waits for a line `wanted` accepts (`what` names it in an error).
    fn wait_until(&self, wanted: impl Fn(&str) -> bool, what: &str, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            match self.0.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if wanted(&line) => return Ok(()),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    anyhow::bail!("no {what:?} in the coordinator's log within {limit:?}")
                }
                Err(RecvTimeoutError::Disconnected) => anyhow::bail!("the coordinator ended before {what:?}"),
            }
        }
    }
}

/// Runs one size: warm state, the job, the kill, the recovery (`eager`: every bucket group
/// loaded before the restored tasks start); reads the times back.
fn measure(mb: u64, kill_after: u64, protocol: &str, out: &Path, eager: bool) -> anyhow::Result<Row> {
    let keys = (mb << 20) / VALUE_BYTES as u64;
    let warm = warm_state(out, keys, protocol)?;
    let dir = out.join(format!("{mb}-MB"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let text = config(&dir.join("out"), keys, protocol, Some(&warm));
    std::fs::write(dir.join("job.toml"), &text).with_context(|| format!("writing {}", dir.display()))?;
    let exe = std::env::current_exe().context("finding this executable")?;
    let addr_file = dir.join("addr");
    let mut coordinator = Command::new(&exe)
        .args(["coordinator", "--config"])
        .arg(dir.join("job.toml"))
        .arg("--address-file")
        .arg(&addr_file)
        .env("KOALA_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the coordinator")?;
    let stdout = coordinator.stdout.take().context("the coordinator's stdout")?;
    let stderr = coordinator.stderr.take().context("the coordinator's stderr")?;
    let mut procs = Processes(vec![coordinator]);
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).context("reading the coordinator's first line")?;
    anyhow::ensure!(first.starts_with("coordinator listening on"), "the coordinator said {first:?}");
    let (tx, rx) = std::sync::mpsc::channel();
    let coordinator_log = dir.join("coordinator.log");
    std::thread::spawn(move || {
        let mut kept = std::fs::File::create(coordinator_log).ok();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(f) = kept.as_mut() {
                let _ = std::io::Write::write_all(f, format!("{line}\n").as_bytes());
            }
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let log = Log(rx);
    let addr = std::fs::read_to_string(&addr_file).context("reading the coordinator's address")?;
    for i in 0..2 {
        let worker_log =
            std::fs::File::create(dir.join(format!("w{i}.log"))).map_or_else(|_| Stdio::null(), Stdio::from);
        let child = Command::new(&exe)
            .args(["worker", "--coordinator", addr.trim(), "--data-dir"])
            .arg(dir.join(format!("w{i}")))
            .arg("--warm-state")
            .arg(&warm)
            .env("KOALA_LOG", "info")
            .env(koala_runtime::RESTORE_EAGERLY, if eager { "1" } else { "" })
            .stdout(Stdio::null())
            .stderr(worker_log)
            .spawn()
            .context("starting a worker")?;
        procs.0.push(child);
    }
    log.wait_for("checkpoint 1 completed", MARK_TIMEOUT)?;
    // The workers loaded the warm state before the job started (and a restored worker loads
    // none): gigabytes of disk back before the checkpoints take them.
    std::fs::remove_dir_all(&warm).with_context(|| format!("deleting {}", warm.display()))?;
    let _ = std::fs::remove_dir(out.join("warm"));
    if kill_after > 1 {
        log.wait_for(&format!("checkpoint {kill_after} completed"), MARK_TIMEOUT)?;
    }
    // kill -9: the worker gets no chance to say goodbye.
    let victim = &mut procs.0[2];
    victim.kill().context("killing worker 1")?;
    let _ = victim.wait();
    log.wait_for("records flow again", MARK_TIMEOUT)?;
    // The first checkpoint after the restart: the whole state durable again.
    let completed = |line: &str| line.contains("checkpoint ") && line.contains(" completed");
    log.wait_until(completed, "a checkpoint completed", MARK_TIMEOUT)?;
    drop(procs);
    let store = MetricsStore::open(&dir.join("out").join("metrics.db"))?;
    let run = store.runs()?.into_iter().next().context("no run in the metrics store")?;
    let recovery = store.recoveries(&run.run)?.into_iter().next().context("no recovery recorded")?;
    let checkpoints = store.checkpoints(&run.run)?;
    let before: Vec<CheckpointRecord> =
        checkpoints.iter().filter(|c| c.completed_ms <= recovery.detected_ms).cloned().collect();
    let durable_again_ms = checkpoints
        .iter()
        .find(|c| c.started_ms >= recovery.restarted_ms)
        .map(|c| c.completed_ms.saturating_sub(recovery.detected_ms));
    let state_bytes = keys * VALUE_BYTES as u64;
    drop(store);
    // Gigabytes: the run's stores and checkpoints.
    std::fs::remove_dir_all(&dir).with_context(|| format!("deleting {}", dir.display()))?;
    let restore = if eager { "eager" } else { "lazy" };
    Ok(Row { restore, state_bytes, keys, recovery, durable_again_ms, before })
}
