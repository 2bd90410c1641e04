//! What `koala` prints: its standard output, which may close under it, and the lines of a
//! running job (progress, summary).
//!
//! Every `println!`/`print!` of this crate is [`crate::println`]/[`crate::print`], which write
//! through [`write_stdout`]: when the reader of the output went away (`koala run job.toml | head
//! -3`: EPIPE) nothing more is printed, a job this process runs stops as at a first Ctrl-C
//! ([`crate::interrupt::stdout_closed`]), and the process exits 141 once it ended, the status of
//! a process killed by SIGPIPE. `std`'s `println!` would panic there instead ("failed printing
//! to stdout") and leave the job's processes to fend for themselves.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use koala_coordinator::{JobSummary, Progress};

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// The exit status of a command whose standard output closed before it was done (128 + SIGPIPE).
pub const CLOSED_OUTPUT_EXIT: i32 = 141;

/// Writes to the standard output; once a write failed (the reader went away), writes nothing
/// more and stops the job under way.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    if STDOUT_CLOSED.load(Ordering::SeqCst) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if out.write_fmt(args).and_then(|()| out.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::SeqCst);
        crate::interrupt::stdout_closed();
    }
}

/// Writes `lines` to the standard output if anyone still reads it, and nothing else: for the
/// summary of `koala coordinator`, whose scripts may close the pipe after its first line (the
/// job is over by then, and that is no reason to exit 141).
pub fn print_if_read(lines: &[String]) {
    let mut out = std::io::stdout().lock();
    for line in lines {
        if writeln!(out, "{line}").is_err() {
            return;
        }
    }
    let _ = out.flush();
}

/// Whether the standard output closed under this process.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::SeqCst)
}

/// A message for the user on the standard error (interrupts, warnings), never a panic if that
/// closed too.
pub fn note(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
}

/// One progress line of a running job.
pub fn progress_line(p: &Progress) -> String {
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

/// The lines that close a run: how it ended and its totals, the records its sources skipped,
/// checkpoints and recoveries.
pub fn summary_lines(s: &JobSummary) -> Vec<String> {
    use crate::launch::human_bytes;
    let secs = s.elapsed.as_secs_f64();
    let head = if s.interrupted {
        format!(
            "interrupted: run {} stopped after {secs:.1} s, before its input ended (its sources were cut short, so its output covers part of its input)",
            s.run
        )
    } else {
        format!("done: run {} in {secs:.1} s", s.run)
    };
    let mut lines = vec![format!(
        "{head} — {} records in ({:.0}/s), {} records out, {} late dropped, {} reconfigurations; metrics in {}",
        s.records_in,
        s.records_in as f64 / secs.max(1e-9),
        s.records_out,
        s.late_dropped,
        s.reconfigurations,
        s.metrics_db.display()
    )];
    for (source, n) in &s.malformed {
        lines.push(format!(
            "{n} malformed records skipped by source {source}: they could not be decoded (the first 10 and every 1000th are logged with topic, partition and offset)"
        ));
    }
    if !s.checkpoint_bytes.is_empty() {
        let total: u64 = s.checkpoint_bytes.iter().sum();
        lines.push(format!(
            "checkpoints: {} completed, {} each on average, last {}",
            s.checkpoint_bytes.len(),
            human_bytes(total / s.checkpoint_bytes.len() as u64),
            human_bytes(s.checkpoint_bytes.last().copied().unwrap_or(0))
        ));
    }
    for (checkpoint, ms) in &s.recoveries {
        lines.push(format!(
            "recovery: a lost worker; restarted from checkpoint {checkpoint} in {:.1} s",
            *ms as f64 / 1000.0
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn summary() -> JobSummary {
        JobSummary {
            run: "run-1".into(),
            elapsed: Duration::from_secs(2),
            records_in: 10,
            records_out: 10,
            late_dropped: 0,
            metrics_db: "m.db".into(),
            reconfigurations: 0,
            checkpoint_bytes: Vec::new(),
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
}
