//! The report's checkpoint lines (docs/architecture.md §10): how long checkpoints took, how
//! large they were and how long barriers aligned, and each recovery after a lost worker, from
//! the metrics store's `checkpoints` and `recoveries` tables.

use std::fmt;

use crate::metrics_store::{CheckpointRecord, RecoveryRecord};

/// A run's checkpoints and recoveries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckpointSummary {
    /// Completed checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointRecord>,
    /// Recoveries, oldest first.
    pub recoveries: Vec<RecoveryRecord>,
    /// Checkpoints skipped: due while the previous one was still being written.
    pub skipped: u64,
}

/// Mean and max of `values` (0, 0 when empty).
fn mean_max(values: impl Iterator<Item = u64> + Clone) -> (u64, u64) {
    let n = values.clone().count() as u64;
    let sum: u64 = values.clone().sum();
    (sum / n.max(1), values.max().unwrap_or(0))
}

impl CheckpointSummary {
    /// Checkpoint duration (barriers injected → last acknowledgement), ms: mean and max.
    pub fn duration_ms(&self) -> (u64, u64) {
        mean_max(self.checkpoints.iter().map(|c| c.completed_ms.saturating_sub(c.started_ms)))
    }

    /// Bytes written per checkpoint: mean and max.
    pub fn bytes(&self) -> (u64, u64) {
        mean_max(self.checkpoints.iter().map(|c| c.bytes))
    }

    /// Bytes written anew per checkpoint (the rest shared with earlier ones): mean and max, over
    /// the checkpoints that counted them.
    pub fn written_bytes(&self) -> (u64, u64) {
        mean_max(self.checkpoints.iter().filter_map(|c| c.written_bytes))
    }

    /// The longest alignment of a task per checkpoint, ms: mean and max.
    pub fn alignment_ms(&self) -> (u64, u64) {
        mean_max(self.checkpoints.iter().map(|c| c.alignment_ms))
    }
}

impl fmt::Display for CheckpointSummary {
    /// Nothing for a run without checkpoints or recoveries; else a line of means, a table with
    /// a row per checkpoint and a line per recovery.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.checkpoints.is_empty() {
            let (d_mean, d_max) = self.duration_ms();
            let (b_mean, b_max) = self.bytes();
            let (w_mean, w_max) = self.written_bytes();
            let (a_mean, a_max) = self.alignment_ms();
            writeln!(
                f,
                "checkpoints: {} completed; duration mean {d_mean} ms, max {d_max} ms; size mean {}, max {}; written mean {}, max {}; alignment mean {a_mean} ms, max {a_max} ms",
                self.checkpoints.len(),
                super::text::fmt_bytes(b_mean as f64),
                super::text::fmt_bytes(b_max as f64),
                super::text::fmt_bytes(w_mean as f64),
                super::text::fmt_bytes(w_max as f64),
            )?;
            for line in checkpoint_table(&self.checkpoints) {
                writeln!(f, "  {line}")?;
            }
        }
        if self.skipped > 0 {
            writeln!(
                f,
                "checkpoints skipped: {} (due while the previous one was still being written)",
                self.skipped
            )?;
        }
        for r in &self.recoveries {
            writeln!(f, "{}", recovery_line(r))?;
        }
        Ok(())
    }
}

/// A table of checkpoints, a header and a row each: id, duration, size, bytes written anew,
/// entries, alignment.
pub fn checkpoint_table(checkpoints: &[CheckpointRecord]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>10}  {:>10}  {:>11}  {:>11}  {:>11}  {:>9}",
        "checkpoint", "duration", "size", "written", "entries", "alignment"
    )];
    for c in checkpoints {
        lines.push(format!(
            "{:>10}  {:>10}  {:>11}  {:>11}  {:>11}  {:>9}",
            c.id,
            super::fmt_ms(c.completed_ms.saturating_sub(c.started_ms)),
            super::text::fmt_bytes(c.bytes as f64),
            c.written_bytes.map_or_else(|| "-".to_string(), |w| super::text::fmt_bytes(w as f64)),
            c.entries,
            super::fmt_ms(c.alignment_ms)
        ));
    }
    lines
}

/// One recovery: what was lost, what it restarted from, and detection → restart → first
/// record out.
pub fn recovery_line(r: &RecoveryRecord) -> String {
    let from = match r.checkpoint {
        0 => "the job's start (no checkpoint had completed)".to_string(),
        id => format!("checkpoint {id}"),
    };
    let first = r.first_output_after_ms().map_or_else(|| "none yet".to_string(), super::fmt_ms);
    format!(
        "recovery: {}; restarted from {from}; detection → restart {} → first record out {first}",
        r.lost,
        super::fmt_ms(r.restart_ms())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_give_duration_size_alignment_and_recovery_time() {
        let c = |id, started_ms, completed_ms, bytes, alignment_ms| CheckpointRecord {
            id,
            epoch: 0,
            started_ms,
            completed_ms,
            bytes,
            written_bytes: Some(bytes / 2),
            entries: 0,
            alignment_ms,
            path: String::new(),
            deployment: Vec::new(),
        };
        let summary = CheckpointSummary {
            checkpoints: vec![c(1, 1000, 1040, 2048, 4), c(2, 2000, 2100, 4096, 10)],
            recoveries: vec![RecoveryRecord {
                lost: "worker1 disappeared".into(),
                detected_ms: 5000,
                restarted_ms: 5750,
                first_output_ms: Some(6020),
                checkpoint: 2,
            }],
            skipped: 3,
        };
        let text = summary.to_string();
        assert!(text.contains("2 completed; duration mean 70 ms, max 100 ms"), "{text}");
        assert!(text.contains("size mean 3.0 KiB, max 4.0 KiB; written mean 1.5 KiB, max 2.0 KiB; alignment mean 7 ms, max 10 ms"), "{text}");
        assert!(
            text.contains("worker1 disappeared; restarted from checkpoint 2; detection → restart 750 ms → first record out 1.0 s"),
            "{text}"
        );
        // A row per checkpoint: id, duration, size, written, entries, alignment.
        assert!(
            text.contains("         2      100 ms      4.0 KiB      2.0 KiB            0      10 ms"),
            "{text}"
        );
        assert!(text.contains("checkpoints skipped: 3 (due while"), "{text}");
        assert_eq!(CheckpointSummary::default().to_string(), "");
    }
}
