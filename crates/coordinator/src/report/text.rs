//! The text of `koala report`'s summary ([`ReportSummary`]'s `Display`), which `koala run` and
//! `koala demo` print at the end of a run.

use std::fmt;

use super::recovery::recovery_rule;
use super::{
    MIB, ReportSummary, StateMoved, TAIL_S, ThroughputDip, fmt_recovery, recovery_watched_s, render,
};

fn fmt_opt(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1} {unit}"))
}

/// A duration for people, one format wherever one is printed: `13 ms`, `2.4 s`.
///
/// ```
/// use koala_coordinator::report::fmt_ms;
/// assert_eq!((fmt_ms(13), fmt_ms(2_400)), ("13 ms".to_string(), "2.4 s".to_string()));
/// ```
pub fn fmt_ms(ms: u64) -> String {
    if ms < 1000 { format!("{ms} ms") } else { format!("{:.1} s", ms as f64 / 1000.0) }
}

/// Bytes in the largest unit that keeps them ≥ 1 (B, KiB, MiB, GiB).
pub(super) fn fmt_bytes(b: f64) -> String {
    match b {
        b if b >= MIB * 1024.0 => format!("{:.2} GiB", b / MIB / 1024.0),
        b if b >= MIB => format!("{:.2} MiB", b / MIB),
        b if b >= 1024.0 => format!("{:.1} KiB", b / 1024.0),
        b => format!("{b:.0} B"),
    }
}

fn fmt_dip(dip: Option<ThroughputDip>) -> String {
    dip.map_or_else(|| "n/a".to_string(), |d| d.to_string())
}

fn fmt_state(s: &StateMoved) -> String {
    format!(
        "{} ({} on demand, {} in the background, {} eager)",
        fmt_bytes(s.total()),
        fmt_bytes(s.on_demand),
        fmt_bytes(s.background),
        fmt_bytes(s.eager)
    )
}

impl fmt::Display for ReportSummary {
    /// The summary only; print [`ReportSummary::table`] for the per-second rows.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run = &self.run;
        writeln!(
            f,
            "run {} (query {}, protocol {}): {} s of metrics",
            run.run,
            run.query,
            run.protocol,
            self.table.rows.len()
        )?;
        write!(f, "{}", self.ending)?;
        writeln!(
            f,
            "records in at sources: {:.0}, mean throughput {:.1} rec/s",
            self.records_total, self.mean_throughput
        )?;
        writeln!(
            f,
            "peak end-to-end latency: p99 {} (median {}); peak source lag: mean {}, p99 {}",
            fmt_opt(self.peak_latency_p99_ms, "ms"),
            fmt_opt(self.peak_latency_p50_ms, "ms"),
            fmt_opt(self.peak_lag_mean_ms, "ms"),
            fmt_opt(self.peak_lag_p99_ms, "ms")
        )?;
        writeln!(
            f,
            "capacity: {}",
            self.capacity.as_deref().unwrap_or("unknown (the run's config is not readable)")
        )?;
        for (task, seconds, min) in &self.capacity_shortfall {
            writeln!(
                f,
                "WARNING: {task} could not reach its processing budget in {seconds} s (measured capacity as low as {min:.0} rec/s): the machine is short of CPU for this task_records_per_sec"
            )?;
        }
        writeln!(f, "lag p99 over the last {TAIL_S} s: {}", fmt_opt(self.tail_lag_p99_ms, "ms"))?;
        writeln!(
            f,
            "state moved: {}; input paused: {} ms",
            fmt_state(&self.state_moved),
            self.pause_ms_total
        )?;
        if let Some((task, n)) = &self.max_queued_records {
            writeln!(f, "queued records: at most {n:.0} (task {task})")?;
        }
        if !self.cache_lookups.is_empty() {
            let rates: Vec<String> = self
                .cache_lookups
                .iter()
                .map(|(task, hits, misses)| match hits + misses {
                    0.0 => format!("{task} no lookups"),
                    all => format!("{task} {:.1} % of {all:.0}", 100.0 * hits / all),
                })
                .collect();
            writeln!(f, "state cache hit rate (hits / keys read): {}", rates.join(", "))?;
        }
        if let Some(last) = self.input_last_t_s {
            writeln!(
                f,
                "input: last taken at t={last} s (later seconds are not judged for dips or recovery)"
            )?;
        }
        write!(f, "{}", self.checkpoints)?;
        for d in &self.autoscale {
            writeln!(
                f,
                "autoscale at t={} s: {} {} ({}); {}",
                d.t_s,
                d.kind,
                crate::request_record::describe_text(&d.request),
                d.reason,
                d.outcome
            )?;
        }
        if self.reconfigurations.is_empty() {
            writeln!(f, "no reconfiguration in this run: no dip or recovery to measure")?;
        } else {
            writeln!(f, "worst throughput dip: {}", fmt_dip(self.worst_dip))?;
            // The last reconfiguration was watched the shortest: "> N s" holds for every one.
            let last_start = self.reconfigurations.iter().map(|r| r.start_t_s).max().unwrap_or(0);
            let watched = recovery_watched_s(last_start, self.input_last_t_s);
            writeln!(
                f,
                "recovery (longest; {}): {}; on the median: {}; on source lag: {}",
                recovery_rule(),
                fmt_recovery(self.recovery_s, watched),
                fmt_recovery(self.recovery_p50_s, watched),
                fmt_recovery(self.lag_recovery_s, watched)
            )?;
        }
        if !self.plots_have_text {
            writeln!(f, "plots drawn without text: no font in {:?}", render::FONT_CANDIDATES)?;
        }
        for r in &self.reconfigurations {
            let c = &r.reconfiguration;
            let watched = recovery_watched_s(r.start_t_s, self.input_last_t_s);
            writeln!(
                f,
                "  epoch {} {} of {} ({}): t={}..{} s, {} buckets, state moved {}, pause {}; dip {}; recovery {} (e2e p99; median {}, source lag {}); {}",
                c.epoch,
                c.kind,
                c.operator,
                c.protocol,
                r.start_t_s,
                r.end_t_s.map_or_else(|| "?".to_string(), |t| t.to_string()),
                c.buckets_moved,
                fmt_state(&r.state_moved),
                c.pause_ms.map_or_else(|| "-".to_string(), |p| format!("{p} ms")),
                fmt_dip(r.dip),
                fmt_recovery(r.recovery_s, watched),
                fmt_recovery(r.recovery_p50_s, watched),
                fmt_recovery(r.lag_recovery_s, watched),
                r.drain_limit_text()
            )?;
        }
        if let Some(dir) = self.files.first().and_then(|f| f.parent()) {
            let names: Vec<String> = self
                .files
                .iter()
                .filter_map(|f| f.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect();
            writeln!(f, "plots and report written to {}: {}", dir.display(), names.join(", "))?;
        }
        Ok(())
    }
}
