//! How a reported run ended and what input it skipped: the lines that tell a reader whether the
//! numbers below cover the whole input (a finished run), part of it (an interrupted or failed
//! one), or a run that is still going or was killed.

use std::collections::BTreeMap;
use std::fmt;

use koala_types::metric;

use crate::metrics_store::{MetricsStore, MetricsStoreError, RunEnd, RunInfo, RunStatus};

/// The end of a run and the records its sources skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunEnding {
    /// As recorded.
    pub end: RunEnd,
    /// What the run is when reported: `finished`, `interrupted`, `failed`, `running`, `killed`
    /// or `unrecorded` ([`crate::metrics_store::RunListing::state`]).
    pub state: &'static str,
    /// Records each source operator skipped as malformed (`records_malformed`), by operator.
    pub malformed: Vec<(String, u64)>,
}

impl RunEnding {
    /// Reads the end and the malformed records of `info`'s run.
    pub fn read(store: &MetricsStore, info: &RunInfo) -> Result<Self, MetricsStoreError> {
        let listing = store.run_listing()?.into_iter().find(|l| l.info.run == info.run);
        let state = listing.as_ref().map_or("unrecorded", |l| l.state(now_ms()));
        let end = listing.map(|l| l.end).unwrap_or(RunEnd { status: None, ended_ms: None, detail: None });
        let mut malformed: BTreeMap<String, u64> = BTreeMap::new();
        for (task, _, value) in store.task_samples(&info.run, metric::RECORDS_MALFORMED)? {
            let operator = task.rsplit_once('.').map_or(task.as_str(), |(op, _)| op).to_string();
            *malformed.entry(operator).or_default() += value as u64;
        }
        malformed.retain(|_, n| *n > 0);
        Ok(Self { end, state, malformed: malformed.into_iter().collect() })
    }

    /// Whether the run's numbers cover only part of its input.
    pub fn cut_short(&self) -> bool {
        matches!(self.end.status, Some(RunStatus::Interrupted | RunStatus::Failed)) || self.state == "killed"
    }
}

impl fmt::Display for RunEnding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.end.ended_ms.map_or_else(String::new, |ms| format!(" at {}", utc(ms)));
        match self.state {
            "finished" => writeln!(f, "status: finished{at}")?,
            "interrupted" => writeln!(
                f,
                "status: INTERRUPTED{at}: it was asked to stop (Ctrl-C, SIGTERM or a closed output) \
                 before its input ended, so the numbers below cover only part of its input"
            )?,
            "failed" => writeln!(
                f,
                "status: FAILED{at}: {}; the numbers below stop where it failed",
                self.end.detail.as_deref().unwrap_or("no reason recorded")
            )?,
            "running" => {
                writeln!(f, "status: still running (no end recorded yet); the numbers below are so far")?
            }
            "killed" => writeln!(
                f,
                "status: KILLED: no end was recorded and its tasks went silent (its coordinator was \
                 killed or crashed); the numbers below stop there"
            )?,
            _ => writeln!(f, "status: not recorded (a run of an older build)")?,
        }
        for (source, n) in &self.malformed {
            writeln!(
                f,
                "{n} malformed records skipped by source {source} (undecodable; the first are logged)"
            )?;
        }
        Ok(())
    }
}

fn now_ms() -> u64 {
    crate::clock::unix_ms()
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(ms: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(ms);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} UTC")
}

/// Unix milliseconds as `YYYYMMDD-HHMMSS-mmm` (UTC): sorts as time does, fits a file name (run ids).
pub fn utc_stamp(ms: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(ms);
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}-{:03}", ms % 1000)
}

/// (year, month, day, hour, minute, second) in UTC of unix milliseconds: the civil-from-days
/// algorithm, so no time-zone database and no dependency.
fn civil(ms: u64) -> (i64, i64, i64, u64, u64, u64) {
    let secs = ms / 1000;
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_unix_milliseconds() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_798_761_599_000), "2026-12-31 23:59:59 UTC");
        assert_eq!(utc_stamp(1_798_761_599_042), "20261231-235959-042");
    }

    #[test]
    fn an_interrupted_run_says_so_and_names_its_skipped_records() {
        let ending = RunEnding {
            end: RunEnd { status: Some(RunStatus::Interrupted), ended_ms: Some(0), detail: None },
            state: "interrupted",
            malformed: vec![("bids".into(), 3)],
        };
        let text = ending.to_string();
        assert!(text.contains("INTERRUPTED at 1970-01-01 00:00:00 UTC"), "{text}");
        assert!(text.contains("3 malformed records skipped by source bids"), "{text}");
        assert!(ending.cut_short());
    }
}
