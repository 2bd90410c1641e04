//! The `checkpoints` and `recoveries` tables (docs/architecture.md §10).

use rusqlite::params;

use super::{MetricsStore, MetricsStoreError};

/// A completed checkpoint as the `checkpoints` table holds it (docs/architecture.md §10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointRecord {
    /// Its number.
    pub id: u64,
    /// The deployment's epoch.
    pub epoch: u64,
    /// When its barriers were injected and when the last task acknowledged (unix ms).
    pub started_ms: u64,
    /// See `started_ms`.
    pub completed_ms: u64,
    /// Bytes of every task's part (written now or shared with earlier checkpoints).
    pub bytes: u64,
    /// Bytes written anew for it: what changed since each task's previous part (`None`: recorded
    /// by a build that did not count them).
    pub written_bytes: Option<u64>,
    /// State entries written.
    pub entries: u64,
    /// The longest barrier alignment of a task (ms).
    pub alignment_ms: u64,
    /// Its directory.
    pub path: String,
    /// The deployment it restores (`koala_types::encode`d).
    pub deployment: Vec<u8>,
}

/// A recovery from a checkpoint after a lost worker (`recoveries` table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryRecord {
    /// The worker lost and why.
    pub lost: String,
    /// When the loss was noticed and when the restored job started (unix ms).
    pub detected_ms: u64,
    /// See `detected_ms`.
    pub restarted_ms: u64,
    /// When a sink first wrote records after the restart (unix ms, the worker's clock; `None`:
    /// not yet, or the job ended first).
    pub first_output_ms: Option<u64>,
    /// The checkpoint restored (0: none had completed; the job restarted from its beginning).
    pub checkpoint: u64,
}

impl RecoveryRecord {
    /// Detection → restarted job, ms.
    pub fn restart_ms(&self) -> u64 {
        self.restarted_ms.saturating_sub(self.detected_ms)
    }

    /// Detection → first record out of a sink, ms (`None`: none came out).
    pub fn first_output_after_ms(&self) -> Option<u64> {
        self.first_output_ms.map(|f| f.saturating_sub(self.detected_ms))
    }
}

/// Columns added to `recoveries` after its first version: added to an older file on open.
pub(super) const ADDED_COLUMNS: &[(&str, &str)] = &[("first_output_ms", "INTEGER NULL")];

impl MetricsStore {
    /// Records a completed checkpoint of `run`.
    pub fn checkpoint_completed(&mut self, run: &str, c: &CheckpointRecord) -> Result<(), MetricsStoreError> {
        let sql = "INSERT INTO checkpoints (run, id, epoch, started_ms, completed_ms, bytes, entries, \
                   alignment_ms, path, deployment, written_bytes) \
                   VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";
        let args = params![
            run,
            c.id,
            c.epoch,
            c.started_ms,
            c.completed_ms,
            c.bytes,
            c.entries,
            c.alignment_ms,
            c.path,
            c.deployment,
            c.written_bytes
        ];
        self.conn
            .execute(sql, args)
            .map_err(|e| self.fail(format!("record checkpoint {} of run {run:?}", c.id), e))?;
        Ok(())
    }

    /// Records a recovery of `run`.
    pub fn recovered(&mut self, run: &str, r: &RecoveryRecord) -> Result<(), MetricsStoreError> {
        let sql = "INSERT INTO recoveries (run, lost, detected_ms, restarted_ms, checkpoint, first_output_ms) \
                   VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
        let args = params![run, r.lost, r.detected_ms, r.restarted_ms, r.checkpoint, r.first_output_ms];
        self.conn
            .execute(sql, args)
            .map_err(|e| self.fail(format!("record a recovery of run {run:?}"), e))?;
        Ok(())
    }

    /// Records that a checkpoint of `run` due at `due_ms` was skipped because checkpoint
    /// `running` was still being written (`checkpoint_skips` table).
    pub fn checkpoint_skipped(
        &mut self,
        run: &str,
        due_ms: u64,
        running: u64,
    ) -> Result<(), MetricsStoreError> {
        let sql = "INSERT INTO checkpoint_skips VALUES (?1, ?2, ?3)";
        self.conn
            .execute(sql, params![run, due_ms, running])
            .map_err(|e| self.fail(format!("record a skipped checkpoint of run {run:?}"), e))?;
        Ok(())
    }

    /// How many checkpoints of `run` were skipped (due while one was still being written).
    pub fn checkpoints_skipped(&self, run: &str) -> Result<u64, MetricsStoreError> {
        let sql = "SELECT COUNT(*) FROM checkpoint_skips WHERE run = ?1";
        let rows = self.rows(
            sql,
            params![run],
            |r| r.get::<_, u64>(0),
            || format!("count skipped checkpoints of run {run:?}"),
        )?;
        Ok(rows.first().copied().unwrap_or(0))
    }

    /// Records when a sink first wrote after the recovery of `run` detected at `detected_ms`.
    pub fn recovery_first_output(
        &mut self,
        run: &str,
        detected_ms: u64,
        first_output_ms: u64,
    ) -> Result<(), MetricsStoreError> {
        let sql = "UPDATE recoveries SET first_output_ms = ?3 WHERE run = ?1 AND detected_ms = ?2";
        self.conn
            .execute(sql, params![run, detected_ms, first_output_ms])
            .map_err(|e| self.fail(format!("record a recovery's first output of run {run:?}"), e))?;
        Ok(())
    }

    /// The completed checkpoints of `run`, oldest first.
    pub fn checkpoints(&self, run: &str) -> Result<Vec<CheckpointRecord>, MetricsStoreError> {
        let sql = "SELECT id, epoch, started_ms, completed_ms, bytes, entries, alignment_ms, path, deployment, \
                   written_bytes \
                   FROM checkpoints WHERE run = ?1 ORDER BY id";
        self.rows(
            sql,
            params![run],
            |r| {
                Ok(CheckpointRecord {
                    id: r.get(0)?,
                    epoch: r.get(1)?,
                    started_ms: r.get(2)?,
                    completed_ms: r.get(3)?,
                    bytes: r.get(4)?,
                    entries: r.get(5)?,
                    alignment_ms: r.get(6)?,
                    path: r.get(7)?,
                    deployment: r.get(8)?,
                    written_bytes: r.get(9)?,
                })
            },
            || format!("read checkpoints of run {run:?}"),
        )
    }

    /// The recoveries of `run`, oldest first.
    pub fn recoveries(&self, run: &str) -> Result<Vec<RecoveryRecord>, MetricsStoreError> {
        let sql = "SELECT lost, detected_ms, restarted_ms, checkpoint, first_output_ms FROM recoveries \
                   WHERE run = ?1 ORDER BY detected_ms";
        self.rows(
            sql,
            params![run],
            |r| {
                Ok(RecoveryRecord {
                    lost: r.get(0)?,
                    detected_ms: r.get(1)?,
                    restarted_ms: r.get(2)?,
                    checkpoint: r.get(3)?,
                    first_output_ms: r.get(4)?,
                })
            },
            || format!("read recoveries of run {run:?}"),
        )
    }
}
