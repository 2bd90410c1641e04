//! The `autoscale_decisions` table: every decision of the reconfiguration policy
//! (`crate::autoscale`), why it was taken, on which window's figures, and what the coordinator
//! answered when the policy submitted it.

use rusqlite::params;

use super::{MetricsStore, MetricsStoreError};

/// One decision as the table holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionRecord {
    /// When it was submitted (unix ms).
    pub at_ms: u64,
    /// The window's last second, since the run's start second (the report's `t`).
    pub t_s: u64,
    /// `scale_out`, `scale_in` or `rebalance`.
    pub kind: String,
    /// The request submitted (`Rescale { … }`, `Rebalance { … }`).
    pub request: String,
    /// Why.
    pub reason: String,
    /// The window's figures.
    pub window: String,
    /// The coordinator's answer: `accepted as reconfiguration N`, `queued …` or `rejected: …`.
    pub outcome: String,
}

impl MetricsStore {
    /// Records a decision of the policy in `run`.
    pub fn autoscale_decision(&mut self, run: &str, d: &DecisionRecord) -> Result<(), MetricsStoreError> {
        let sql = "INSERT INTO autoscale_decisions VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
        let args = params![run, d.at_ms, d.t_s, d.kind, d.request, d.reason, d.window, d.outcome];
        self.conn
            .execute(sql, args)
            .map_err(|e| self.fail(format!("record an autoscale decision of run {run:?}"), e))?;
        Ok(())
    }

    /// The policy's decisions in `run`, oldest first.
    pub fn autoscale_decisions(&self, run: &str) -> Result<Vec<DecisionRecord>, MetricsStoreError> {
        let sql = "SELECT at_ms, t_s, kind, request, reason, figures, outcome FROM autoscale_decisions \
                   WHERE run = ?1 ORDER BY at_ms";
        self.rows(
            sql,
            params![run],
            |r| {
                Ok(DecisionRecord {
                    at_ms: r.get(0)?,
                    t_s: r.get(1)?,
                    kind: r.get(2)?,
                    request: r.get(3)?,
                    reason: r.get(4)?,
                    window: r.get(5)?,
                    outcome: r.get(6)?,
                })
            },
            || format!("read autoscale decisions of run {run:?}"),
        )
    }
}
