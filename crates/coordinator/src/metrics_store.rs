//! The metrics store: per-second task samples and reconfiguration events of every run, in one
//! SQLite file (docs/architecture.md §9; the metrics are those of paper §5.1.3).
//!
//! Tasks sample their counters each second ([`koala_types::metric`] names them); the coordinator
//! appends them here with [`MetricsStore::insert_samples`] and records each reconfiguration's start
//! and completion beside them. `koala report` ([`crate::report`]) reads the per-second aggregates
//! back. The file is opened in WAL mode so a report can read while a run is still writing.
//!
//! ```
//! use koala_coordinator::metrics_store::{Aggregate, MetricSample, MetricsStore, RunInfo, TaskScope};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let mut store = MetricsStore::open(&dir.path().join("metrics.db"))?;
//! store.begin_run(&RunInfo {
//!     run: "r1".into(),
//!     started_ms: 1_000_000,
//!     query: "q5".into(),
//!     protocol: "koala".into(),
//!     config: "{}".into(),
//! })?;
//! let sample = |task: &str, value| MetricSample {
//!     time_s: 1000,
//!     task: task.into(),
//!     metric: koala_types::metric::RECORDS_IN.into(),
//!     value,
//! };
//! store.insert_samples("r1", &[sample("source.0", 10.0), sample("source.1", 5.0)])?;
//! let sums = store.per_second("r1", koala_types::metric::RECORDS_IN, Aggregate::Sum, TaskScope::All)?;
//! assert_eq!(sums, vec![(1000, 15.0)]);
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, Row, ToSql, params};
use serde::{Deserialize, Serialize};
use thiserror::Error;

mod checkpoints;
mod decisions;
mod runs;
pub use checkpoints::{CheckpointRecord, RecoveryRecord};
pub use decisions::DecisionRecord;
pub use runs::{RunEnd, RunListing, RunStatus, SILENT_RUN_MS};

/// How long a write waits for another connection's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run TEXT PRIMARY KEY, started_ms INTEGER, query TEXT, protocol TEXT, config TEXT);
CREATE TABLE IF NOT EXISTS metrics (
    run TEXT, time INTEGER, task TEXT, metric TEXT, value REAL);
CREATE INDEX IF NOT EXISTS metrics_run_metric_time ON metrics (run, metric, time);
CREATE TABLE IF NOT EXISTS reconfigurations (
    run TEXT, epoch INTEGER, operator TEXT, kind TEXT, protocol TEXT, started_ms INTEGER,
    completed_ms INTEGER NULL, buckets_moved INTEGER, bytes_moved INTEGER, pause_ms INTEGER NULL,
    detail TEXT);
CREATE UNIQUE INDEX IF NOT EXISTS reconfigurations_run_epoch_operator
    ON reconfigurations (run, epoch, operator);
CREATE TABLE IF NOT EXISTS checkpoints (
    run TEXT, id INTEGER, epoch INTEGER, started_ms INTEGER, completed_ms INTEGER,
    bytes INTEGER, entries INTEGER, alignment_ms INTEGER, path TEXT, deployment BLOB);
CREATE TABLE IF NOT EXISTS recoveries (
    run TEXT, lost TEXT, detected_ms INTEGER, restarted_ms INTEGER, checkpoint INTEGER);
CREATE TABLE IF NOT EXISTS checkpoint_skips (run TEXT, due_ms INTEGER, running INTEGER);
CREATE TABLE IF NOT EXISTS autoscale_decisions (
    run TEXT, at_ms INTEGER, t_s INTEGER, kind TEXT, request TEXT, reason TEXT, figures TEXT,
    outcome TEXT);
";

/// A failed metrics-store operation; every variant names the database file.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MetricsStoreError {
    /// SQLite refused an operation (I/O, corruption, constraint, lock timeout, or a number
    /// beyond `i64::MAX`, SQLite's integer range).
    #[error("metrics store {}: {operation} failed", path.display())]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// What the store was doing, e.g. `begin run "r1"`.
        operation: String,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// A completion arrived for a reconfiguration whose start was never recorded.
    #[error(
        "metrics store {}: run {run:?} has no started reconfiguration epoch {epoch} of operator {operator:?}",
        path.display()
    )]
    UnknownReconfiguration {
        /// The database file.
        path: PathBuf,
        /// The run.
        run: String,
        /// The epoch of the completion.
        epoch: u64,
        /// The operator of the completion.
        operator: String,
    },
}

/// One run of a job: a row of `runs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Unique run name.
    pub run: String,
    /// Wall-clock start, unix milliseconds.
    pub started_ms: u64,
    /// The query (job) that ran, e.g. `nexmark-q8`.
    pub query: String,
    /// The reconfiguration protocol in use, e.g. `koala`, `stop-restart`.
    pub protocol: String,
    /// The run's configuration, serialised (free-form, usually JSON or TOML).
    pub config: String,
}

/// One per-second value of one metric of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricSample {
    /// The second the sample covers, unix seconds.
    pub time_s: u64,
    /// The task, `operator.index`, e.g. `aggregate.1`.
    pub task: String,
    /// The metric, one of [`koala_types::metric::ALL`].
    pub metric: String,
    /// The value; non-finite values are stored as NULL and ignored by the aggregates.
    pub value: f64,
}

/// What the coordinator knows when a reconfiguration starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconfigurationStart {
    /// The reconfiguration's epoch.
    pub epoch: u64,
    /// The operator being reconfigured.
    pub operator: String,
    /// `scale_out`, `scale_in`, `rebalance` or `migrate`.
    pub kind: String,
    /// The protocol carrying it out.
    pub protocol: String,
    /// Wall-clock start, unix milliseconds.
    pub started_ms: u64,
    /// Buckets whose owner changes.
    pub buckets_moved: u64,
    /// Free-form description (the plan), for humans.
    pub detail: String,
}

/// What the coordinator learns when a reconfiguration completes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconfigurationCompletion {
    /// The epoch that completed.
    pub epoch: u64,
    /// The operator that was reconfigured.
    pub operator: String,
    /// Wall-clock completion, unix milliseconds.
    pub completed_ms: u64,
    /// State bytes the protocol acknowledged moving up to completion (stop-and-restart: its
    /// hand-over; 0 for the others), until `crate::report::settle_bytes_moved` sets the report's
    /// figure once the run ended.
    pub bytes_moved: u64,
    /// How long processing of affected tasks was paused, if the protocol pauses.
    pub pause_ms: Option<u64>,
}

/// A reconfiguration as stored: its start, and its completion once recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconfiguration {
    /// The reconfiguration's epoch.
    pub epoch: u64,
    /// The operator reconfigured.
    pub operator: String,
    /// `scale_out`, `scale_in`, `rebalance` or `migrate`.
    pub kind: String,
    /// The protocol carrying it out.
    pub protocol: String,
    /// Wall-clock start, unix milliseconds.
    pub started_ms: u64,
    /// Wall-clock completion, unix milliseconds; `None` while running (or if the run died).
    pub completed_ms: Option<u64>,
    /// Buckets whose owner changed.
    pub buckets_moved: u64,
    /// State bytes moved: 0 until completion, the protocol's acknowledged figure then, and once
    /// the run ended the report's figure for this reconfiguration (`crate::report::settle_bytes_moved`).
    pub bytes_moved: u64,
    /// Pause of affected tasks, if the protocol pauses.
    pub pause_ms: Option<u64>,
    /// Free-form description.
    pub detail: String,
}

/// How the values of several tasks in one second combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    /// Sum over tasks (counts: records, bytes).
    Sum,
    /// Mean over tasks, each task weighted equally.
    Mean,
    /// Maximum over tasks (percentiles: the worst task).
    Max,
}

impl Aggregate {
    fn sql(self) -> &'static str {
        match self {
            Aggregate::Sum => "SUM(value)",
            Aggregate::Mean => "AVG(value)",
            Aggregate::Max => "MAX(value)",
        }
    }
}

/// Which tasks an aggregate covers. The store does not know operator kinds, so a set of tasks is
/// named by a metric its members report (sources are the tasks reporting source lag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskScope<'a> {
    /// Every task.
    All,
    /// Only tasks that reported this metric at least once in the run.
    Reporting(&'a str),
    /// Only tasks that never reported this metric in the run.
    NotReporting(&'a str),
}

/// How [`MetricsStore::per_second_grouped`] groups tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// One group per task (`operator.index`).
    Task,
    /// One group per operator: the task name without its `.index`.
    Operator,
}

/// The SQLite file holding metrics and reconfiguration events of every run.
#[derive(Debug)]
pub struct MetricsStore {
    path: PathBuf,
    conn: Connection,
}

impl MetricsStore {
    /// Opens (creating if missing) the store at `path`, in WAL mode, with the schema in place.
    pub fn open(path: &Path) -> Result<Self, MetricsStoreError> {
        let fail = |operation: &str, source| MetricsStoreError::Sqlite {
            path: path.to_path_buf(),
            operation: operation.to_string(),
            source,
        };
        let conn = Connection::open(path).map_err(|e| fail("open", e))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| fail("set busy timeout", e))?;
        // `PRAGMA journal_mode` answers with a row, so it is a query, not an execute.
        conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get::<_, String>(0))
            .map_err(|e| fail("enable WAL", e))?;
        conn.execute_batch(SCHEMA).map_err(|e| fail("create schema", e))?;
        runs::add_missing_columns(&conn, "runs", runs::ADDED_COLUMNS)
            .map_err(|e| fail("add the run-end columns", e))?;
        runs::add_missing_columns(&conn, "checkpoints", &[("written_bytes", "INTEGER NULL")])
            .map_err(|e| fail("add the checkpoints' written bytes", e))?;
        runs::add_missing_columns(&conn, "recoveries", checkpoints::ADDED_COLUMNS)
            .map_err(|e| fail("add the recovery columns", e))?;
        Ok(Self { path: path.to_path_buf(), conn })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records a new run, as `running` ([`Self::end_run`] records its end); fails if a run of
    /// that name exists.
    pub fn begin_run(&mut self, info: &RunInfo) -> Result<(), MetricsStoreError> {
        let sql = "INSERT INTO runs (run, started_ms, query, protocol, config, status) \
                   VALUES (?1, ?2, ?3, ?4, ?5, 'running')";
        let args = params![info.run, info.started_ms, info.query, info.protocol, info.config];
        self.conn.execute(sql, args).map_err(|e| self.fail(format!("begin run {:?}", info.run), e))?;
        Ok(())
    }

    /// Appends samples of `run`, all in one transaction (all or none are stored).
    pub fn insert_samples(&mut self, run: &str, samples: &[MetricSample]) -> Result<(), MetricsStoreError> {
        let result = (|| {
            let tx = self.conn.transaction()?;
            {
                let mut insert = tx.prepare_cached(
                    "INSERT INTO metrics (run, time, task, metric, value) VALUES (?1, ?2, ?3, ?4, ?5)",
                )?;
                for s in samples {
                    insert.execute(params![run, s.time_s, s.task, s.metric, s.value])?;
                }
            }
            tx.commit()
        })();
        result.map_err(|e| self.fail(format!("insert {} samples of run {run:?}", samples.len()), e))
    }

    /// Records that a reconfiguration of `run` started.
    pub fn reconfiguration_started(
        &mut self,
        run: &str,
        start: &ReconfigurationStart,
    ) -> Result<(), MetricsStoreError> {
        let sql = "INSERT INTO reconfigurations (run, epoch, operator, kind, protocol, started_ms, \
                   completed_ms, buckets_moved, bytes_moved, pause_ms, detail) \
                   VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, ?7, 0, NULL, ?8)";
        let s = start;
        let args =
            params![run, s.epoch, s.operator, s.kind, s.protocol, s.started_ms, s.buckets_moved, s.detail];
        self.conn
            .execute(sql, args)
            .map_err(|e| self.fail(format!("record start of epoch {} in run {run:?}", s.epoch), e))?;
        Ok(())
    }

    /// Records that a started reconfiguration of `run` completed.
    pub fn reconfiguration_completed(
        &mut self,
        run: &str,
        done: &ReconfigurationCompletion,
    ) -> Result<(), MetricsStoreError> {
        let sql = "UPDATE reconfigurations SET completed_ms = ?4, bytes_moved = ?5, pause_ms = ?6 \
                   WHERE run = ?1 AND epoch = ?2 AND operator = ?3";
        let d = done;
        let args = params![run, d.epoch, d.operator, d.completed_ms, d.bytes_moved, d.pause_ms];
        let updated = self
            .conn
            .execute(sql, args)
            .map_err(|e| self.fail(format!("record completion of epoch {} in run {run:?}", d.epoch), e))?;
        if updated == 0 {
            return Err(MetricsStoreError::UnknownReconfiguration {
                path: self.path.clone(),
                run: run.to_string(),
                epoch: d.epoch,
                operator: d.operator.clone(),
            });
        }
        Ok(())
    }

    /// Sets the `bytes_moved` of reconfiguration `epoch` of `operator` in `run`
    /// (`crate::report::settle_bytes_moved` gives every one the report's figure).
    pub fn set_bytes_moved(
        &mut self,
        run: &str,
        epoch: u64,
        operator: &str,
        bytes: u64,
    ) -> Result<(), MetricsStoreError> {
        let sql =
            "UPDATE reconfigurations SET bytes_moved = ?4 WHERE run = ?1 AND epoch = ?2 AND operator = ?3";
        self.conn
            .execute(sql, params![run, epoch, operator, bytes])
            .map_err(|e| self.fail(format!("set bytes moved of epoch {epoch} in run {run:?}"), e))?;
        Ok(())
    }

    /// Every run, oldest first.
    pub fn runs(&self) -> Result<Vec<RunInfo>, MetricsStoreError> {
        self.query("ORDER BY started_ms, run", [], run_info, "list runs")
    }

    /// The run that started last, if any.
    pub fn latest_run(&self) -> Result<Option<RunInfo>, MetricsStoreError> {
        let order = "ORDER BY started_ms DESC, run DESC LIMIT 1";
        Ok(self.query(order, [], run_info, "find latest run")?.pop())
    }

    /// The run named `run`, if recorded.
    pub fn run(&self, run: &str) -> Result<Option<RunInfo>, MetricsStoreError> {
        let operation = format!("look up run {run:?}");
        Ok(self.query("WHERE run = ?1", [run], run_info, &operation)?.pop())
    }

    /// Per second (ascending), `metric` combined over the tasks in `scope` with `agg`; seconds
    /// without a (finite) value are absent. Returns `(unix second, value)` pairs.
    pub fn per_second(
        &self,
        run: &str,
        metric: &str,
        agg: Aggregate,
        scope: TaskScope<'_>,
    ) -> Result<Vec<(u64, f64)>, MetricsStoreError> {
        let (filter, mut args): (_, Vec<&dyn ToSql>) = match &scope {
            TaskScope::All => ("", vec![]),
            TaskScope::Reporting(m) => {
                ("AND task IN (SELECT task FROM metrics WHERE run = ?1 AND metric = ?3)", vec![m])
            }
            TaskScope::NotReporting(m) => {
                ("AND task NOT IN (SELECT task FROM metrics WHERE run = ?1 AND metric = ?3)", vec![m])
            }
        };
        args.splice(0..0, [&run as &dyn ToSql, &metric]);
        let sql = format!(
            "SELECT time, {} FROM metrics WHERE run = ?1 AND metric = ?2 {filter} \
             GROUP BY time ORDER BY time",
            agg.sql()
        );
        let rows = (|| {
            let mut stmt = self.conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(args.as_slice(), |row| {
                Ok((row.get::<_, u64>(0)?, row.get::<_, Option<f64>>(1)?))
            })?;
            rows.collect::<Result<Vec<_>, _>>()
        })()
        .map_err(|e| self.fail(format!("read per-second {metric} of run {run:?}"), e))?;
        Ok(rows.into_iter().filter_map(|(t, v)| Some((t, v?))).collect())
    }

    /// Per group of tasks (`grouping`) and second from `since_s` on (unix seconds), `metric`
    /// combined over the group's tasks with `agg`: `(group, unix second, value)` by group and
    /// time; seconds without a (finite) value are absent.
    pub fn per_second_grouped(
        &self,
        run: &str,
        metric: &str,
        agg: Aggregate,
        grouping: Grouping,
        since_s: u64,
    ) -> Result<Vec<(String, u64, f64)>, MetricsStoreError> {
        // `operator.index` → `operator`: strip the index's digits, then the dot.
        let key = match grouping {
            Grouping::Task => "task",
            Grouping::Operator => "rtrim(rtrim(task, '0123456789'), '.')",
        };
        let sql = format!(
            "SELECT {key}, time, {} FROM metrics WHERE run = ?1 AND metric = ?2 AND time >= ?3 \
             GROUP BY 1, time ORDER BY 1, time",
            agg.sql()
        );
        let rows = (|| {
            let mut stmt = self.conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params![run, metric, since_s], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, u64>(1)?, row.get::<_, Option<f64>>(2)?))
            })?;
            rows.collect::<Result<Vec<_>, _>>()
        })()
        .map_err(|e| self.fail(format!("read per-second {metric} by {grouping:?} of run {run:?}"), e))?;
        Ok(rows.into_iter().filter_map(|(g, t, v)| Some((g, t, v?))).collect())
    }

    /// Every sample of `metric` in `run`, as `(task, unix second, value)`, by task and time.
    pub fn task_samples(
        &self,
        run: &str,
        metric: &str,
    ) -> Result<Vec<(String, u64, f64)>, MetricsStoreError> {
        let sql = "SELECT task, time, value FROM metrics WHERE run = ?1 AND metric = ?2 ORDER BY task, time";
        let rows = (|| {
            let mut stmt = self.conn.prepare_cached(sql)?;
            let rows = stmt.query_map([run, metric], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, u64>(1)?, row.get::<_, Option<f64>>(2)?))
            })?;
            rows.collect::<Result<Vec<_>, _>>()
        })()
        .map_err(|e| self.fail(format!("read samples of {metric} of run {run:?}"), e))?;
        Ok(rows.into_iter().filter_map(|(task, t, v)| Some((task, t, v?))).collect())
    }

    /// The reconfigurations of `run`, by start time.
    pub fn reconfigurations(&self, run: &str) -> Result<Vec<Reconfiguration>, MetricsStoreError> {
        let sql = "SELECT epoch, operator, kind, protocol, started_ms, completed_ms, buckets_moved, \
                   bytes_moved, pause_ms, detail FROM reconfigurations WHERE run = ?1 \
                   ORDER BY started_ms, epoch, operator";
        self.rows(
            sql,
            [run],
            |r| {
                Ok(Reconfiguration {
                    epoch: r.get(0)?,
                    operator: r.get(1)?,
                    kind: r.get(2)?,
                    protocol: r.get(3)?,
                    started_ms: r.get(4)?,
                    completed_ms: r.get(5)?,
                    buckets_moved: r.get(6)?,
                    bytes_moved: r.get(7)?,
                    pause_ms: r.get(8)?,
                    detail: r.get(9)?,
                })
            },
            || format!("list reconfigurations of run {run:?}"),
        )
    }

    /// Rows of `runs` selected by `clause` (after `FROM runs`).
    fn query<P: rusqlite::Params>(
        &self,
        clause: &str,
        args: P,
        map: fn(&Row<'_>) -> rusqlite::Result<RunInfo>,
        operation: &str,
    ) -> Result<Vec<RunInfo>, MetricsStoreError> {
        let sql = format!("SELECT run, started_ms, query, protocol, config FROM runs {clause}");
        self.rows(&sql, args, map, || operation.to_string())
    }

    /// The rows `sql` selects with `args`, each read by `map`; a failure names `operation`. The
    /// one reading path of every table (runs, reconfigurations, checkpoints, recoveries,
    /// autoscale decisions).
    fn rows<T, P: rusqlite::Params>(
        &self,
        sql: &str,
        args: P,
        map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
        operation: impl FnOnce() -> String,
    ) -> Result<Vec<T>, MetricsStoreError> {
        let result = (|| -> rusqlite::Result<Vec<T>> {
            let mut stmt = self.conn.prepare_cached(sql)?;
            let rows = stmt.query_map(args, map)?;
            rows.collect()
        })();
        result.map_err(|e| self.fail(operation(), e))
    }

    fn fail(&self, operation: String, source: rusqlite::Error) -> MetricsStoreError {
        MetricsStoreError::Sqlite { path: self.path.clone(), operation, source }
    }
}

fn run_info(row: &Row<'_>) -> rusqlite::Result<RunInfo> {
    Ok(RunInfo {
        run: row.get(0)?,
        started_ms: row.get(1)?,
        query: row.get(2)?,
        protocol: row.get(3)?,
        config: row.get(4)?,
    })
}

#[cfg(test)]
mod tests;
