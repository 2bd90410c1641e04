//! Each run of a job keeps what it alone wrote: `<output_dir>/runs/<run id>/` holds the config
//! it ran (`job.toml`), its report (`report.html`, the PNG plots) and its summary
//! (`summary.txt`), and `<output_dir>/latest` points at the newest. What the job itself writes
//! stays in `output_dir`, shared by its runs: the metrics database (every run, with how each
//! ended: `koala report --list`), the sink files and worker state of the latest run (a new run
//! replaces them) and its checkpoints (`koala run --resume`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use koala_coordinator::metrics_store::{MetricsStore, RunStatus};
use koala_coordinator::report::ending::{utc, utc_stamp};

/// A new run id: `run-YYYYMMDD-HHMMSS-mmm` (UTC), readable and in time order.
pub fn run_id() -> String {
    format!("run-{}", utc_stamp(now_ms()))
}

/// The directory of run `run` of the job whose metrics database is `db`: `runs/<run>` beside it.
pub fn of(db: &Path, run: &str) -> PathBuf {
    db.parent().unwrap_or(Path::new(".")).join("runs").join(run)
}

/// Creates `<out>/runs/<run>/`, writes the config it runs there and points `<out>/latest` at it.
pub fn create(out: &Path, run: &str, config: &koala_coordinator::JobConfig) -> anyhow::Result<PathBuf> {
    let dir = out.join("runs").join(run);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating the run directory {}", dir.display()))?;
    let text = toml::to_string(config).context("writing the run's config")?;
    let job = dir.join("job.toml");
    std::fs::write(&job, text).with_context(|| format!("writing {}", job.display()))?;
    let latest = out.join("latest");
    // Only a link of ours is replaced: a file or directory someone called `latest` stays.
    let ours = std::fs::symlink_metadata(&latest).map_or(true, |m| m.file_type().is_symlink());
    if ours {
        let _ = std::fs::remove_file(&latest);
        if let Err(e) = std::os::unix::fs::symlink(Path::new("runs").join(run), &latest) {
            tracing::warn!(link = %latest.display(), error = %e, "could not point `latest` at the run");
        }
    }
    Ok(dir)
}

/// Writes the run's closing lines to `summary.txt` in its directory (a failure only warns: the
/// lines were printed).
pub fn write_summary(dir: &Path, text: &str) {
    let path = dir.join("summary.txt");
    if let Err(e) = std::fs::write(&path, text) {
        crate::terminal::note(&format!("warning: could not write {}: {e}", path.display()));
    }
}

/// `koala report --list`: every run of the database `db`, oldest first, with its start, how it
/// ended (finished, interrupted, failed, running, or killed: no end recorded and silent), how
/// long it ran and where its report is.
pub fn list(db: &Path) -> anyhow::Result<String> {
    anyhow::ensure!(db.exists(), "no metrics database at {}", db.display());
    let store = MetricsStore::open(db)?;
    let runs = store.run_listing()?;
    if runs.is_empty() {
        return Ok(format!("{} holds no runs\n", db.display()));
    }
    let now = now_ms();
    let mut text = format!(
        "runs in {} (oldest first; `koala report {} --run RUN` reports one):\n{:<26} {:<23} {:<11} {:>9}  {:<16} {:<16} report\n",
        db.display(),
        db.display(),
        "run",
        "started",
        "status",
        "ran",
        "query",
        "protocol"
    );
    for l in &runs {
        let end_ms = l.end.ended_ms.or(l.last_sample_s.map(|s| s * 1000 + 999));
        let ran = end_ms.map_or("-".to_string(), |e| {
            format!("{:.1} s", e.saturating_sub(l.info.started_ms) as f64 / 1000.0)
        });
        let report = of(db, &l.info.run).join("report.html");
        let report = if report.exists() { report.display().to_string() } else { "-".to_string() };
        text.push_str(&format!(
            "{:<26} {:<23} {:<11} {:>9}  {:<16} {:<16} {report}\n",
            l.info.run,
            utc(l.info.started_ms),
            l.state(now),
            ran,
            l.info.query,
            l.info.protocol
        ));
        if let (Some(RunStatus::Failed | RunStatus::Interrupted), Some(detail)) =
            (l.end.status, &l.end.detail)
        {
            text.push_str(&format!("{:<26} {detail}\n", ""));
        }
    }
    Ok(text)
}

/// `koala report [DB] [--list] [--run RUN] [--out DIR]`: `db` is the metrics database or the
/// output dir holding it; the plots go to the run's directory unless `--out` says otherwise.
pub fn report(db: &Path, list: bool, run: Option<String>, out: Option<PathBuf>) -> anyhow::Result<()> {
    let db = if db.is_dir() { db.join("metrics.db") } else { db.to_path_buf() };
    if list {
        print!("{}", self::list(&db)?);
        return Ok(());
    }
    let run = match run {
        Some(run) => Some(run),
        None if db.exists() => MetricsStore::open(&db)?.latest_run()?.map(|r| r.run),
        None => None,
    };
    let out = match (out, &run) {
        (Some(out), _) => out,
        (None, Some(run)) => of(&db, run),
        (None, None) => db.parent().map(PathBuf::from).unwrap_or_default(),
    };
    let summary = koala_coordinator::report::report(&db, run.as_deref(), &out)
        .with_context(|| format!("reporting on {}", db.display()))?;
    println!("{}", summary.table);
    println!("{summary}");
    Ok(())
}

/// `koala run --resume DIR` of a job whose latest run finished: an error that says when, where
/// its results are and how to run it again. A run that was interrupted, failed or killed may be
/// resumed.
pub fn refuse_finished(dir: &Path, db: &Path) -> anyhow::Result<()> {
    if !db.exists() {
        return Ok(());
    }
    let store = MetricsStore::open(db)?;
    let Some(latest) = store.latest_run()? else { return Ok(()) };
    let end = store.run_end(&latest.run)?;
    if end.status != Some(RunStatus::Finished) {
        return Ok(());
    }
    let at = end.ended_ms.map_or_else(|| "an unrecorded time".to_string(), utc);
    anyhow::bail!(
        "--resume {}: the job in this directory already finished, at {at} (run {}); there is nothing \
         to resume. Its results are in {} (sink files) and its report in {}. To run it again, run \
         `koala run <config>` without --resume (a new run; it replaces the sink files), or give the \
         config a fresh output_dir to keep these",
        dir.display(),
        latest.run,
        dir.display(),
        of(db, &latest.run).display()
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use koala_coordinator::metrics_store::RunInfo;

    use super::*;

    #[test]
    fn a_finished_job_is_not_resumed_and_an_interrupted_one_is() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("metrics.db");
        let mut store = MetricsStore::open(&db)?;
        let info = |run: &str, started_ms| RunInfo {
            run: run.into(),
            started_ms,
            query: "q".into(),
            protocol: "koala".into(),
            config: String::new(),
        };
        store.begin_run(&info("run-a", 1_000))?;
        store.end_run("run-a", RunStatus::Interrupted, 2_000, None)?;
        refuse_finished(dir.path(), &db)?;
        store.begin_run(&info("run-b", 3_000))?;
        store.end_run("run-b", RunStatus::Finished, 4_000, None)?;
        let err = refuse_finished(dir.path(), &db).expect_err("a finished job is refused").to_string();
        assert!(err.contains("already finished, at 1970-01-01 00:00:04 UTC (run run-b)"), "{err}");
        assert!(err.contains("without --resume") && err.contains("runs/run-b"), "{err}");
        let listed = list(&db)?;
        assert!(listed.contains("run-a") && listed.contains("interrupted"), "{listed}");
        assert!(listed.contains("run-b") && listed.contains("finished"), "{listed}");
        Ok(())
    }
}
