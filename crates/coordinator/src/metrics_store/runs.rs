//! How each run ended: the `status`, `ended_ms` and `detail` columns of `runs`. A run is
//! recorded as `running` when it starts and gets its end when the coordinator ends it; a run
//! whose process was killed keeps `running`, and [`RunListing::state`] tells it from one still
//! going by its last metrics sample. `koala report --list` prints them, the report names an
//! interrupted run as such, and `koala run --resume` refuses a job that finished.

use std::fmt;

use rusqlite::params;

use super::{MetricsStore, MetricsStoreError, RunInfo, run_info};

/// Columns `runs` gained after its first release; a store written by an older build gets them
/// (empty for its runs) when it is opened.
pub(super) const ADDED_COLUMNS: &[(&str, &str)] =
    &[("status", "TEXT NULL"), ("ended_ms", "INTEGER NULL"), ("detail", "TEXT NULL")];

/// A run still `running` with no metrics sample for this long is taken as killed: a live run's
/// tasks report every second.
pub const SILENT_RUN_MS: u64 = 30_000;

/// How a run ended, as the coordinator recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStatus {
    /// Started, no end recorded yet (still going, or its coordinator was killed).
    Running,
    /// Every task finished: the input ended (or `duration_s` passed) and the job drained.
    Finished,
    /// Stopped early on request (Ctrl-C, SIGTERM, a closed standard output): the sources were
    /// cut short, so its output covers only part of its input.
    Interrupted,
    /// Ended by an error (a lost worker without recovery, a watchdog, a failed task).
    Failed,
}

impl RunStatus {
    fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Finished => "finished",
            Self::Interrupted => "interrupted",
            Self::Failed => "failed",
        }
    }

    fn parse(text: Option<&str>) -> Option<Self> {
        Some(match text? {
            "running" => Self::Running,
            "finished" => Self::Finished,
            "interrupted" => Self::Interrupted,
            "failed" => Self::Failed,
            _ => return None,
        })
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The end of a run as recorded; `status` is `None` for a run recorded by a build that did not
/// record ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunEnd {
    /// How it ended.
    pub status: Option<RunStatus>,
    /// When (unix ms), once ended.
    pub ended_ms: Option<u64>,
    /// Why (the error of a failed run, what stopped an interrupted one).
    pub detail: Option<String>,
}

/// One run as `koala report --list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunListing {
    /// The run.
    pub info: RunInfo,
    /// Its recorded end.
    pub end: RunEnd,
    /// Its last metrics sample (unix s), if it has any.
    pub last_sample_s: Option<u64>,
}

impl RunListing {
    /// What the run is, judged at `now_ms`: its recorded status, or for a run still `running`
    /// whose tasks went silent for [`SILENT_RUN_MS`], `killed`.
    pub fn state(&self, now_ms: u64) -> &'static str {
        match self.end.status {
            None => "unrecorded",
            Some(RunStatus::Running) => {
                let last_ms = self.last_sample_s.map_or(self.info.started_ms, |s| s * 1000);
                if now_ms.saturating_sub(last_ms) > SILENT_RUN_MS { "killed" } else { "running" }
            }
            Some(status) => status.as_str(),
        }
    }
}

impl MetricsStore {
    /// Records how `run` ended (at `ended_ms`, unix ms), with `detail` (why). The first end
    /// recorded stands: a forced exit records the run as interrupted before it kills the workers,
    /// whose loss the coordinator would otherwise record as the failure.
    pub fn end_run(
        &mut self,
        run: &str,
        status: RunStatus,
        ended_ms: u64,
        detail: Option<&str>,
    ) -> Result<(), MetricsStoreError> {
        let sql = "UPDATE runs SET status = ?2, ended_ms = ?3, detail = ?4 \
                   WHERE run = ?1 AND (status IS NULL OR status = 'running')";
        self.conn
            .execute(sql, params![run, status.as_str(), ended_ms, detail])
            .map_err(|e| self.fail(format!("record the end of run {run:?}"), e))?;
        Ok(())
    }

    /// The recorded end of `run` (all `None` for an unknown run).
    pub fn run_end(&self, run: &str) -> Result<RunEnd, MetricsStoreError> {
        let sql = "SELECT status, ended_ms, detail FROM runs WHERE run = ?1";
        let ends = self.rows(
            sql,
            params![run],
            |r| {
                Ok(RunEnd {
                    status: RunStatus::parse(r.get::<_, Option<String>>(0)?.as_deref()),
                    ended_ms: r.get(1)?,
                    detail: r.get(2)?,
                })
            },
            || format!("read the end of run {run:?}"),
        )?;
        Ok(ends.into_iter().next().unwrap_or(RunEnd { status: None, ended_ms: None, detail: None }))
    }

    /// Every run with its end and last sample, oldest first.
    pub fn run_listing(&self) -> Result<Vec<RunListing>, MetricsStoreError> {
        let sql = "SELECT r.run, r.started_ms, r.query, r.protocol, r.config, r.status, r.ended_ms, \
                   r.detail, (SELECT MAX(m.time) FROM metrics m WHERE m.run = r.run) \
                   FROM runs r ORDER BY r.started_ms, r.run";
        self.rows(
            sql,
            [],
            |r| {
                Ok(RunListing {
                    info: run_info(r)?,
                    end: RunEnd {
                        status: RunStatus::parse(r.get::<_, Option<String>>(5)?.as_deref()),
                        ended_ms: r.get(6)?,
                        detail: r.get(7)?,
                    },
                    last_sample_s: r.get(8)?,
                })
            },
            || "list runs with their ends".to_string(),
        )
    }
}

/// Adds the `columns` (name, SQL type) that `conn`'s `table` lacks: a database written by an
/// older build opens with them empty.
pub(super) fn add_missing_columns(
    conn: &rusqlite::Connection,
    table: &str,
    columns: &[(&str, &str)],
) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare(&format!("PRAGMA table_info({table})"))?;
    let have: Vec<String> = stmt.query_map([], |r| r.get::<_, String>(1))?.collect::<Result<_, _>>()?;
    for (name, kind) in columns {
        if !have.iter().any(|h| h == name) {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {name} {kind}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(run: &str, started_ms: u64) -> RunInfo {
        RunInfo {
            run: run.into(),
            started_ms,
            query: "q".into(),
            protocol: "koala".into(),
            config: String::new(),
        }
    }

    #[test]
    fn a_run_is_running_until_its_end_is_recorded() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut store = MetricsStore::open(&dir.path().join("metrics.db"))?;
        store.begin_run(&info("a", 1_000))?;
        store.begin_run(&info("b", 2_000))?;
        store.begin_run(&info("c", 3_000))?;
        store.end_run("a", RunStatus::Finished, 1_500, None)?;
        store.end_run("b", RunStatus::Interrupted, 2_500, Some("Ctrl-C"))?;
        store.end_run("b", RunStatus::Failed, 2_600, Some("worker0 disappeared"))?;
        assert_eq!(store.run_end("a")?.status, Some(RunStatus::Finished));
        let b = store.run_end("b")?;
        assert_eq!(
            (b.status, b.ended_ms, b.detail.as_deref()),
            (Some(RunStatus::Interrupted), Some(2_500), Some("Ctrl-C"))
        );
        let listed = store.run_listing()?;
        let states: Vec<&str> = listed.iter().map(|l| l.state(3_000 + 1_000)).collect();
        assert_eq!(states, ["finished", "interrupted", "running"]);
        // Silent past the limit with no end recorded: its process was killed.
        assert_eq!(listed[2].state(3_000 + SILENT_RUN_MS + 1), "killed");
        Ok(())
    }

    #[test]
    fn a_store_of_an_older_build_gains_the_end_columns() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("metrics.db");
        {
            let conn = rusqlite::Connection::open(&path)?;
            conn.execute_batch(
                "CREATE TABLE runs (run TEXT PRIMARY KEY, started_ms INTEGER, query TEXT, protocol TEXT, config TEXT);
                 INSERT INTO runs VALUES ('old', 1, 'q', 'koala', '');",
            )?;
        }
        let mut store = MetricsStore::open(&path)?;
        assert_eq!(store.run_listing()?[0].state(2), "unrecorded");
        store.begin_run(&info("new", 5))?;
        store.end_run("new", RunStatus::Failed, 6, Some("worker0 disappeared"))?;
        assert_eq!(store.run_end("new")?.status, Some(RunStatus::Failed));
        Ok(())
    }
}
