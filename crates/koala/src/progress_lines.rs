//! The lines `koala run` prints while a job runs, in the order of one clock: a per-second
//! progress line comes out once every task reported that second (about 2 s late), and a
//! reconfiguration's lines wait for the progress line of their second, so the live log and the
//! report's `t` agree. A completion line says how much state the reconfiguration moved, read off
//! the seconds from its start to its completion (the report's ruler for every protocol).

use std::collections::BTreeMap;

use koala_coordinator::report::fmt_ms;
use koala_coordinator::{JobSummary, Progress};

use crate::human::human_bytes;

/// A line waiting for its second's progress line.
enum Pending {
    /// Printed as it is.
    Text(String),
    /// A completion: its text, given the state bytes moved since its start.
    Completed { epoch: u64, text: Box<dyn FnOnce(u64) -> String> },
}

/// The printer of `koala run`'s live lines.
#[derive(Default)]
pub struct ProgressLines {
    pending: Vec<(u64, Pending)>,
    /// State bytes moved over the seconds printed so far.
    moved: f64,
    /// Per running reconfiguration: `moved` when its start line was printed.
    moved_at_start: BTreeMap<u64, f64>,
    /// Lines printed, for tests (the last ones).
    #[cfg(test)]
    printed: Vec<String>,
}

impl ProgressLines {
    /// One second of the job: its progress line, after every line of an earlier second.
    pub fn second(&mut self, p: &Progress) {
        self.moved += p.state_bytes;
        self.flush(p.second);
        self.print(progress_line(p));
    }

    /// A reconfiguration started in `second`.
    pub fn started(&mut self, epoch: u64, second: u64, line: String) {
        self.moved_at_start.entry(epoch).or_insert(self.moved);
        self.at(second, line);
    }

    /// A reconfiguration completed in `second`; `text` makes its line from the state bytes it moved.
    pub fn completed(&mut self, epoch: u64, second: u64, text: impl FnOnce(u64) -> String + 'static) {
        self.pending.push((second, Pending::Completed { epoch, text: Box::new(text) }));
    }

    /// A line of `second`.
    pub fn at(&mut self, second: u64, line: String) {
        self.pending.push((second, Pending::Text(line)));
    }

    /// Prints the lines of seconds up to `up_to`, in arrival order.
    pub fn flush(&mut self, up_to: u64) {
        let (due, keep): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.pending).into_iter().partition(|(s, _)| *s <= up_to);
        self.pending = keep;
        for (second, line) in due {
            let text = match line {
                Pending::Text(text) => text,
                Pending::Completed { epoch, text } => {
                    let since = self.moved_at_start.remove(&epoch).unwrap_or(0.0);
                    text((self.moved - since).max(0.0).round() as u64)
                }
            };
            self.print(format!("[{second:>4}s] {text}"));
        }
    }

    fn print(&mut self, line: String) {
        println!("{line}");
        #[cfg(test)]
        self.printed.push(line);
    }
}

/// One second of the job as `koala run` prints it.
fn progress_line(p: &Progress) -> String {
    let opt = |v: Option<f64>, unit: &str| v.map_or("-".to_string(), |v| format!("{v:.0} {unit}"));
    format!(
        "[{:>4}s] in {:>8.0} rec/s | out {:>8.0} rec/s | lag mean {:>7} p99 {:>7} | e2e p99 {:>8} | batch p99 {:>9} | backpressure {:>5.0} ms",
        p.second,
        p.input_per_s,
        p.output_per_s,
        opt(p.lag_mean_ms, "ms"),
        opt(p.lag_p99_ms, "ms"),
        opt(p.latency_p99_ms, "ms"),
        opt(p.batch_p99_us, "µs"),
        p.backpressure_ms
    )
}

/// The line of a recovery: what was lost, where the job restarted from and how fast.
pub fn recovery_line(lost: &str, checkpoint: u64, ms: u64) -> String {
    let from = match checkpoint {
        0 => "its beginning (no checkpoint had completed)".to_string(),
        id => format!("checkpoint {id}"),
    };
    format!(
        "recovery: {lost}; the job restarted from {from} in {} (sources rewound there and take again what \
         they took after it)",
        fmt_ms(ms)
    )
}

/// `12 000 records in`, and after a recovery how many of them were taken again: `(a recovery
/// replayed at least 395 of them)`. `once`: the count that takes each record once (the tasks'
/// `records_total`), `counted`: Σ of the per-second samples, used without it.
fn counted(once: Option<u64>, counted: u64, what: &str, again: u64, verb: &str) -> String {
    let n = koala_coordinator::report::fmt_records(once.unwrap_or(counted) as f64);
    match again {
        0 => format!("{n} {what}"),
        again => format!(
            "{n} {what} (each once; a recovery {verb} at least {} of them again)",
            koala_coordinator::report::fmt_records(again as f64)
        ),
    }
}

/// Checkpoints the summary gives a row each (the last ones).
const SUMMARY_CHECKPOINT_ROWS: usize = 10;

/// The run's closing lines.
pub fn summary_lines(s: &JobSummary) -> Vec<String> {
    let secs = s.elapsed.as_secs_f64();
    let taken = s.records_in_once.unwrap_or(s.records_in);
    let head = if s.interrupted {
        format!(
            "interrupted: run {} stopped after {secs:.1} s, before its input ended (its sources were cut \
             short, so its output covers part of its input)",
            s.run
        )
    } else {
        format!("done: run {} in {secs:.1} s", s.run)
    };
    let mut lines = vec![format!(
        "{head} — {} ({:.0}/s), {}, {} late dropped, {} reconfigurations; metrics in {}",
        counted(s.records_in_once, s.records_in, "records in", s.replayed_at_least, "took"),
        taken as f64 / secs.max(1e-9),
        counted(s.records_out_once, s.records_out, "records out", s.rewritten_at_least, "wrote"),
        s.late_dropped,
        s.reconfigurations,
        s.metrics_db.display()
    )];
    for (source, n) in &s.malformed {
        lines.push(format!(
            "{n} malformed records skipped by source {source}: they could not be decoded (the first 10 \
             and every 1000th are logged with topic, partition and offset)"
        ));
    }
    if !s.checkpoints.is_empty() {
        let n = s.checkpoints.len();
        let total: u64 = s.checkpoints.iter().map(|c| c.bytes).sum();
        lines.push(format!(
            "checkpoints: {n} completed, {} each on average, last {}",
            human_bytes(total / n as u64),
            human_bytes(s.checkpoints.last().map_or(0, |c| c.bytes))
        ));
        // A row each, the last ones of a long run (`koala report` lists every one).
        let shown = &s.checkpoints[n.saturating_sub(SUMMARY_CHECKPOINT_ROWS)..];
        let table = koala_coordinator::report::checkpoint_table(shown);
        lines.extend(table.into_iter().map(|row| format!("  {row}")));
        if n > shown.len() {
            lines.push(format!("  (the last {} of {n}; `koala report` lists every one)", shown.len()));
        }
    }
    if s.checkpoints_skipped > 0 {
        lines.push(format!(
            "checkpoints: {} skipped (due while the previous one was still being written)",
            s.checkpoints_skipped
        ));
    }
    for r in &s.recoveries {
        lines.push(koala_coordinator::report::recovery_line(r));
    }
    if s.rewritten_at_least > 0 {
        lines.push(
            "rows written again after a recovery: a JSON-lines sink keeps each row once (it commits \
             with checkpoints and drops what it wrote after the restored one); a Kafka sink holds \
             them twice (at least once)"
                .into(),
        );
    }
    lines
}

/// Prints [`summary_lines`].
pub fn print_summary(s: &JobSummary) {
    for line in summary_lines(s) {
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a recovery the summary counts each record once and says what was taken and written
    /// again; the recovery's time is printed one way.
    #[test]
    fn a_summary_after_a_recovery_says_what_was_replayed() {
        let s = JobSummary {
            run: "r".into(),
            elapsed: std::time::Duration::from_secs(40),
            records_in: 2_019_708,
            records_out: 402_414,
            records_in_once: Some(2_000_000),
            records_out_once: Some(392_596),
            replayed_at_least: 19_708,
            rewritten_at_least: 9_818,
            late_dropped: 0,
            metrics_db: "m.db".into(),
            reconfigurations: 0,
            checkpoints_skipped: 0,
            checkpoints: vec![koala_coordinator::metrics_store::CheckpointRecord {
                id: 3,
                epoch: 0,
                started_ms: 1_000,
                completed_ms: 1_040,
                bytes: 1 << 20,
                written_bytes: Some(1 << 10),
                entries: 9,
                alignment_ms: 2,
                path: String::new(),
                deployment: Vec::new(),
            }],
            recoveries: vec![koala_coordinator::metrics_store::RecoveryRecord {
                lost: "worker1 disappeared".into(),
                detected_ms: 5_000,
                restarted_ms: 5_013,
                first_output_ms: Some(5_200),
                checkpoint: 3,
            }],
            interrupted: false,
            malformed: Default::default(),
        };
        let lines = summary_lines(&s);
        assert!(
            lines[0].contains(
                "2 000 000 records in (each once; a recovery took at least 19 708 of them again) (50000/s), \
                 392 596 records out (each once; a recovery wrote at least 9 818 of them again)"
            ),
            "{lines:?}"
        );
        assert!(
            lines.iter().any(|l| l.starts_with(
                "recovery: worker1 disappeared; restarted from checkpoint 3; detection → restart 13 ms → \
                     first record out 200 ms"
            )),
            "{lines:?}"
        );
        assert!(lines.iter().any(|l| l.contains("         3       40 ms     1.00 MiB")), "{lines:?}");
        let clean = JobSummary { recoveries: Vec::new(), replayed_at_least: 0, rewritten_at_least: 0, ..s };
        assert!(summary_lines(&clean)[0].contains("— 2 000 000 records in (50000/s), 392 596 records out,"));
        assert!(summary_lines(&clean).iter().all(|l| !l.contains("written again")));
    }

    fn summary() -> JobSummary {
        JobSummary {
            run: "run-1".into(),
            elapsed: std::time::Duration::from_secs(2),
            records_in: 10,
            records_out: 10,
            records_in_once: Some(10),
            records_out_once: Some(10),
            replayed_at_least: 0,
            rewritten_at_least: 0,
            late_dropped: 0,
            metrics_db: "m.db".into(),
            reconfigurations: 0,
            checkpoints: Vec::new(),
            checkpoints_skipped: 0,
            recoveries: Vec::new(),
            interrupted: false,
            malformed: Default::default(),
        }
    }

    #[test]
    fn the_summary_names_skipped_records_per_source() {
        let mut s = summary();
        s.malformed.insert("bids".into(), 3);
        let lines = summary_lines(&s);
        assert!(lines[0].starts_with("done: run run-1"), "{lines:?}");
        assert!(lines[1].starts_with("3 malformed records skipped by source bids"), "{lines:?}");
    }

    #[test]
    fn an_interrupted_run_says_so() {
        let s = JobSummary { interrupted: true, ..summary() };
        let lines = summary_lines(&s);
        assert!(lines[0].starts_with("interrupted: run run-1 stopped after"), "{lines:?}");
    }

    fn second(second: u64, state_bytes: f64) -> Progress {
        Progress { second, state_bytes, ..Progress::default() }
    }

    /// A DRRS-like reconfiguration: the protocol's acknowledgements report no bytes, the tasks'
    /// metrics 5 000 in the background over its seconds. The completion line says 5 000.
    #[test]
    fn a_completion_line_counts_the_state_moved_over_its_seconds() {
        let mut lines = ProgressLines::default();
        lines.second(&second(3, 100.0));
        lines.started(1, 4, "reconfiguration 1 started".into());
        lines.second(&second(4, 2_000.0));
        lines.completed(1, 6, |moved| format!("reconfiguration 1 completed: {moved} B moved"));
        lines.second(&second(5, 2_500.0));
        assert!(!lines.printed.iter().any(|l| l.contains("completed")), "waits for its second");
        lines.second(&second(6, 500.0));
        lines.second(&second(7, 9_000.0));
        let completed: Vec<&String> = lines.printed.iter().filter(|l| l.contains("completed")).collect();
        assert_eq!(completed, vec!["[   6s] reconfiguration 1 completed: 5000 B moved"]);
        let order: Vec<usize> = ["[   4s] reconfiguration 1 started", "[   6s] reconfiguration 1 completed"]
            .iter()
            .map(|p| lines.printed.iter().position(|l| l.starts_with(p)).unwrap_or(usize::MAX))
            .collect();
        assert!(order[0] < order[1] && order[1] < lines.printed.len() - 1, "{:?}", lines.printed);
    }
}
