//! The derived figures of a run (paper §5.1.3), one definition each, used by `koala report`,
//! `koala run`, `koala demo` and `koala compare` alike (docs/architecture.md §9):
//!
//! - [`throughput_dip`]: the lowest throughput after a reconfiguration started, against the
//!   rate the sources were *offered* that second (the config's rate schedule, [`OfferedRate`]),
//!   so a scheduled rate drop is not a dip; without a schedule, against the mean of the
//!   [`BASELINE_S`] seconds before the start.
//! - [`backlog_recovery_s`]: seconds from a reconfiguration's start until end-to-end latency (the
//!   worst sink's per-second median, arrival − due at the source) is back to its level before the
//!   overload began (the last rate increase at or before the start), and stays there
//!   [`RECOVERY_HOLD_S`] seconds. The same function over mean source lag gives the *lag recovery*
//!   printed beside it, which misses records queued inside the job.
//! - **peak latency**: the highest per-second median and p99 end-to-end latency.
//! - [`StateMoved`]: state moved on demand (a record waits for it: Koala fetches), in the
//!   background (Koala's progressive pulls and drain, DRRS's pushes) and eagerly with the hand-over
//!   (stop-and-restart's transfer, Remote's write-back, a Koala hand-over's messages).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use koala_dataflow::RateSchedule;

/// Seconds before a reconfiguration's start (or before the overload began) that form its
/// baseline.
pub const BASELINE_S: i64 = 10;
/// Seconds from a reconfiguration's start searched for the throughput dip and the lag excursion.
pub const DISRUPTION_WINDOW_S: i64 = 60;
/// Seconds lag must stay under its threshold to count as recovered.
pub const RECOVERY_HOLD_S: i64 = 3;

/// The total rate the sources were offered over time, from a run's config: its
/// `params.source.rate` schedule, with time 0 at the run's start and sources stopped after
/// `duration_s`.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferedRate {
    schedule: RateSchedule,
    /// The run's start, unix ms (the schedule's time 0).
    started_ms: u64,
    /// Sources stop after this many ms (`duration_s`), if the config says.
    stop_ms: Option<u64>,
}

impl OfferedRate {
    /// The offered rate of a run whose config (TOML) has a finite, positive rate schedule.
    pub fn from_config(config: &str, started_ms: u64) -> Option<Self> {
        let table: toml::Table = toml::from_str(config).ok()?;
        let rate = table.get("params")?.get("source")?.get("rate")?.clone();
        let schedule: RateSchedule = rate.try_into().ok()?;
        if schedule.0.is_empty()
            || schedule.0.iter().any(|s| s.records_per_sec.is_nan() || s.records_per_sec <= 0.0)
        {
            return None; // unlimited somewhere: nothing to compare against
        }
        let stop_ms =
            table.get("duration_s").and_then(toml::Value::as_integer).map(|d| d.max(0) as u64 * 1000);
        Some(Self { schedule, started_ms, stop_ms })
    }

    /// The schedule's rate at `ms` after the start (0 before its first step and once stopped).
    fn rate_at(&self, ms: u64) -> f64 {
        if self.stop_ms.is_some_and(|s| ms >= s) {
            return 0.0;
        }
        self.schedule.0.iter().rev().find(|s| s.at_ms <= ms).map_or(0.0, |s| s.records_per_sec)
    }

    /// Records offered over the unix second `unix_s`, if the whole second lies within the run's
    /// sources' life (a second they started or stopped in is partial, so it is not judged).
    pub fn in_second(&self, unix_s: i64) -> Option<f64> {
        let from = unix_s.checked_mul(1000)? - i64::try_from(self.started_ms).ok()?;
        let to = from + 1000;
        if from < 0 || self.stop_ms.is_some_and(|s| to > s as i64) {
            return None;
        }
        // Integrate the piecewise-constant schedule over [from, to).
        let (from, to) = (from as u64, to as u64);
        let mut cuts: Vec<u64> =
            self.schedule.0.iter().map(|s| s.at_ms).filter(|&m| m > from && m < to).collect();
        cuts.insert(0, from);
        cuts.push(to);
        let records: f64 = cuts.windows(2).map(|w| self.rate_at(w[0]) * (w[1] - w[0]) as f64 / 1000.0).sum();
        Some(records)
    }

    /// The last time at or before `ms` (since the start) the offered rate went up, if it did.
    pub fn last_increase_before(&self, ms: u64) -> Option<u64> {
        let steps = &self.schedule.0;
        steps
            .windows(2)
            .filter(|w| w[1].at_ms <= ms && w[1].records_per_sec > w[0].records_per_sec)
            .map(|w| w[1].at_ms)
            .next_back()
    }
}

/// What a dip is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DipReference {
    /// The rate offered that very second (a rate schedule is known).
    Offered,
    /// The mean throughput of the [`BASELINE_S`] seconds before the start (no schedule).
    Before,
}

/// The lowest throughput after a reconfiguration started, against what it is compared with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThroughputDip {
    /// Records/s the lowest second is compared with (see `reference`).
    pub offered: f64,
    /// Its throughput, records/s.
    pub min: f64,
    /// The second of that minimum (since run start).
    pub at_t_s: i64,
    /// What `offered` is.
    pub reference: DipReference,
}

impl ThroughputDip {
    /// `min / offered`: 1.0 means no dip, 0.0 means processing stopped.
    pub fn ratio(&self) -> f64 {
        self.min / self.offered
    }

    /// The throughput fallen to and its reference, for a table cell: `4 100 of 8 000 rec/s`.
    pub fn short(&self) -> String {
        format!("{} of {} rec/s", fmt_records(self.min), fmt_records(self.offered))
    }
}

/// The throughput dip of a reconfiguration: over its seconds `window` (from its start second to
/// the next reconfiguration's start or the input's last second, which is partial, and at most
/// [`DISRUPTION_WINDOW_S`] long; the caller gives it), the second with the lowest throughput /
/// reference. With `offered` (per second since run start: the rate offered that second, `None`
/// where not known) the reference is the offered rate and seconds without one are skipped;
/// without it, the mean over the [`BASELINE_S`] seconds before the window. `None` if no second
/// qualifies or the reference is 0.
///
/// ```
/// use koala_coordinator::report::throughput_dip;
/// // The rate is 100/s, then drops to 50/s at second 15 by schedule; the job keeps up except a
/// // 25/s second at 12: the dip is 25 against 100, the scheduled drop is not a dip.
/// let series: Vec<(i64, f64)> = (0..30).map(|t| (t, match t { 12 => 25.0, t if t >= 15 => 50.0, _ => 100.0 })).collect();
/// let offered = |t: i64| Some(if t >= 15 { 50.0 } else { 100.0 });
/// let dip = throughput_dip(&series, 10..29, Some(&offered)).unwrap();
/// assert_eq!((dip.offered, dip.min, dip.at_t_s), (100.0, 25.0, 12));
/// assert_eq!(dip.to_string(), "min 25 rec/s of 100 offered at t=12 s");
/// ```
pub fn throughput_dip(
    throughput: &[(i64, f64)],
    window: Range<i64>,
    offered: Option<&dyn Fn(i64) -> Option<f64>>,
) -> Option<ThroughputDip> {
    let start_t_s = window.start;
    let window = start_t_s..window.end.min(start_t_s + DISRUPTION_WINDOW_S);
    let candidates: Vec<(i64, f64, f64)> = match offered {
        Some(offered) => throughput
            .iter()
            .filter(|(t, _)| window.contains(t))
            .filter_map(|&(t, v)| offered(t).filter(|o| *o > 0.0).map(|o| (t, v, o)))
            .collect(),
        None => {
            let before: Vec<f64> = throughput
                .iter()
                .filter(|(t, _)| (start_t_s - BASELINE_S..start_t_s).contains(t))
                .map(|(_, v)| *v)
                .collect();
            let baseline = before.iter().sum::<f64>() / before.len().max(1) as f64;
            if before.is_empty() || baseline <= 0.0 {
                return None;
            }
            throughput.iter().filter(|(t, _)| window.contains(t)).map(|&(t, v)| (t, v, baseline)).collect()
        }
    };
    let reference = if offered.is_some() { DipReference::Offered } else { DipReference::Before };
    candidates
        .into_iter()
        .min_by(|a, b| (a.1 / a.2).total_cmp(&(b.1 / b.2)))
        .map(|(at_t_s, min, offered)| ThroughputDip { offered, min, at_t_s, reference })
}

/// The last second the sources took input in (the last with throughput above 0): the input
/// ended there (a bounded generator's `records`, a Kafka topic with nothing more, `duration_s`),
/// so neither that partial second nor the seconds after it are a dip, and latency is judged
/// only up to it.
pub fn input_last_t_s(throughput: &[(i64, f64)]) -> Option<i64> {
    throughput.iter().filter(|(_, v)| *v > 0.0).map(|(t, _)| *t).max()
}

/// A rate in records for people: whole records with thin groups of three (`4 100`, `60 000`).
pub fn fmt_records(v: f64) -> String {
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    if v < 0.0 && digits != "0" { format!("-{out}") } else { out }
}

impl fmt::Display for ThroughputDip {
    /// The throughput the job fell to and what it is compared with, never a percentage that
    /// reads backwards: `min 4 100 rec/s of 8 000 offered at t=5 s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let against = match self.reference {
            DipReference::Offered => "offered",
            DipReference::Before => "before the start",
        };
        write!(
            f,
            "min {} rec/s of {} {against} at t={} s",
            fmt_records(self.min),
            fmt_records(self.offered),
            self.at_t_s
        )
    }
}

/// Backlog recovery time (paper §5.1.3: "from the start of reconfiguration until lag returns to
/// zero") of a reconfiguration starting at second `start_t_s`, in seconds, from a per-second
/// latency series `lag` (ms; `None` = no sample that second): the report passes end-to-end latency
/// (the worst sink's median) for backlog recovery and mean source lag for lag recovery. "Zero" is the lag before the
/// overload: pre = mean lag over the [`BASELINE_S`] seconds before `overload_t_s` (the second the
/// offered rate last went up at or before the start; the start itself if none or unknown), and
/// threshold = max(1.5 × pre, pre + 50 ms). A second is *healthy* if it has a lag sample at or
/// under the threshold. If every second of `[start, start + DISRUPTION_WINDOW_S)` that the series
/// covers is healthy, recovery is 0. Otherwise, after the first unhealthy second, recovery ends at
/// the first second that begins [`RECOVERY_HOLD_S`] healthy seconds in a row; the result is that
/// second − start. Only seconds up to `input_last_t_s` (the input's last second,
/// [`input_last_t_s`]; the series' last if `None`) are judged: once the input ended there is no
/// latency to measure (seconds after it without samples are not an excursion). `None` if there is no lag before the overload, or lag never recovers while input lasts.
pub fn backlog_recovery_s(
    lag: &[(i64, Option<f64>)],
    start_t_s: i64,
    overload_t_s: Option<i64>,
    input_last_t_s: Option<i64>,
) -> Option<u64> {
    let by_second: BTreeMap<i64, f64> = lag.iter().filter_map(|&(t, v)| Some((t, v?))).collect();
    let base_end = overload_t_s.map_or(start_t_s, |o| o.min(start_t_s));
    let before: Vec<f64> = by_second.range(base_end - BASELINE_S..base_end).map(|(_, v)| *v).collect();
    if before.is_empty() {
        return None;
    }
    let pre = before.iter().sum::<f64>() / before.len() as f64;
    let threshold = (1.5 * pre).max(pre + 50.0);
    let healthy = |t: i64| by_second.get(&t).is_some_and(|v| *v <= threshold);
    let series_last = lag.iter().map(|(t, _)| *t).max()?;
    let last_t = input_last_t_s.map_or(series_last, |i| i.min(series_last));
    let window_end = (start_t_s + DISRUPTION_WINDOW_S).min(last_t + 1);
    let Some(excursion) = (start_t_s..window_end).find(|t| !healthy(*t)) else {
        return Some(0);
    };
    (excursion + 1..=last_t - (RECOVERY_HOLD_S - 1))
        .find(|s| (*s..*s + RECOVERY_HOLD_S).all(healthy))
        .and_then(|s| u64::try_from(s - start_t_s).ok())
}

/// The latest recovery a run can show for a reconfiguration starting at `start_t_s`: a recovery
/// is judged up to the input's last second and needs [`RECOVERY_HOLD_S`] healthy seconds, so one
/// not found took longer than this (`None` without input).
pub fn recovery_watched_s(start_t_s: i64, input_last_t_s: Option<i64>) -> Option<i64> {
    input_last_t_s.map(|last| last - start_t_s - (RECOVERY_HOLD_S - 1))
}

/// A recovery time for a table: `17 s`, or, when the run's input ended first, `> 44 s` (the
/// seconds it was watched after the reconfiguration began: not recovered *within the run*, which
/// says nothing of after it); `never` only when nothing was watched.
pub fn fmt_recovery(recovery_s: Option<u64>, watched_s: Option<i64>) -> String {
    match (recovery_s, watched_s) {
        (Some(s), _) => format!("{s} s"),
        (None, Some(w)) if w >= 0 => format!("> {w} s"),
        (None, _) => "never".into(),
    }
}

/// The trailing moving average over `window` seconds of a per-second series (the paper plots
/// throughput and lag as 10 s moving averages): each second's value is the mean of the values
/// of the `window` seconds ending there that the series has.
pub fn moving_average(series: &[(i64, f64)], window: i64) -> Vec<(i64, f64)> {
    series
        .iter()
        .map(|&(t, _)| {
            let inside: Vec<f64> =
                series.iter().filter(|(s, _)| (t - window + 1..=t).contains(s)).map(|(_, v)| *v).collect();
            (t, inside.iter().sum::<f64>() / inside.len().max(1) as f64)
        })
        .collect()
}

/// State moved between tasks over a run, split by when it moved (one definition for every
/// protocol, docs/architecture.md §9: an entry counts its stored key and its value).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StateMoved {
    /// Bytes a record waited for: Koala's fetches (Σ `state_bytes_on_demand`).
    pub on_demand: f64,
    /// Bytes moved while the job kept processing, without a record asking: Koala's progressive
    /// migration and background drain, DRRS's pushes (Σ `state_bytes_background`).
    pub background: f64,
    /// Bytes moved with the hand-over, before the moved buckets could be processed:
    /// stop-and-restart's transfer, Remote's write-back to its state servers, a Koala hand-over's
    /// messages (Σ `state_bytes_eager`).
    pub eager: f64,
}

impl StateMoved {
    /// From the run's totals of `state_bytes_on_demand`, `state_bytes_background` and
    /// `state_bytes_eager` (disjoint).
    pub fn from_totals(on_demand: f64, background: f64, eager: f64) -> Self {
        // `+ 0.0` turns the −0.0 an empty float sum gives into 0.
        let clean = |v: f64| v.max(0.0) + 0.0;
        Self { on_demand: clean(on_demand), background: clean(background), eager: clean(eager) }
    }

    /// All three together.
    pub fn total(&self) -> f64 {
        self.on_demand + self.background + self.eager
    }
}

/// State moved per reconfiguration, from the per-second totals of each kind (second since run
/// start, bytes): a second's bytes go to the reconfiguration that started last at or before it
/// (bytes before the first go to the first), so the reconfigurations add up to the run's
/// [`StateMoved`] exactly. `starts`: the reconfigurations' start seconds, ascending.
///
/// ```
/// use koala_coordinator::report::state_moved_by_epoch;
/// // Koala's scale-out at 4 s completes at once; its buckets' state follows on demand later.
/// let on_demand = [(5, 1000.0), (6, 500.0), (9, 200.0)];
/// let epochs = state_moved_by_epoch(&[4, 8], &on_demand, &[], &[(8, 30.0)]);
/// assert_eq!((epochs[0].on_demand, epochs[0].eager), (1500.0, 0.0));
/// assert_eq!((epochs[1].on_demand, epochs[1].eager), (200.0, 30.0));
/// ```
pub fn state_moved_by_epoch(
    starts: &[i64],
    on_demand: &[(i64, f64)],
    background: &[(i64, f64)],
    eager: &[(i64, f64)],
) -> Vec<StateMoved> {
    let mut out = vec![StateMoved::default(); starts.len()];
    let epoch_of = |t: i64| starts.iter().rposition(|s| *s <= t).unwrap_or(0);
    for (series, field) in [(on_demand, 0), (background, 1), (eager, 2)] {
        for &(t, bytes) in series {
            let Some(moved) = out.get_mut(epoch_of(t)) else { continue };
            let slot = match field {
                0 => &mut moved.on_demand,
                1 => &mut moved.background,
                _ => &mut moved.eager,
            };
            *slot += bytes.max(0.0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag(values: &[Option<f64>]) -> Vec<(i64, Option<f64>)> {
        (0..).zip(values.iter().copied()).collect()
    }

    #[test]
    fn no_dip_without_baseline_or_window() {
        let flat: Vec<(i64, f64)> = (0..20).map(|t| (t, 100.0)).collect();
        assert_eq!(throughput_dip(&flat, 0..19, None), None, "nothing before the start");
        assert_eq!(throughput_dip(&flat, 25..85, None), None, "nothing after the start");
        let zero: Vec<(i64, f64)> = (0..20).map(|t| (t, 0.0)).collect();
        assert_eq!(throughput_dip(&zero, 10..19, None), None, "zero baseline");
        assert_eq!(throughput_dip(&flat, 10..19, None).map(|d| d.ratio()), Some(1.0));
    }

    #[test]
    fn dip_only_counts_its_own_window() {
        let series: Vec<(i64, f64)> = (0..100).map(|t| (t, if t == 70 { 1.0 } else { 50.0 })).collect();
        assert_eq!(throughput_dip(&series, 10..99, None).map(|d| d.min), Some(50.0), "70 is past 60 s");
        assert_eq!(throughput_dip(&series, 11..99, None).map(|d| d.at_t_s), Some(70));
        assert_eq!(throughput_dip(&series, 11..70, None).map(|d| d.min), Some(50.0), "the next one's");
    }

    #[test]
    fn the_end_of_input_is_neither_a_dip_nor_a_missing_recovery() {
        // 8 000/s until the input ends in second 19 (partial), then nothing: a bounded or Kafka
        // job that keeps running reports seconds of 0 and no latency.
        let series: Vec<(i64, f64)> = (0..30)
            .map(|t| {
                (
                    t,
                    match t {
                        0..=18 => 8000.0,
                        19 => 3000.0,
                        _ => 0.0,
                    },
                )
            })
            .collect();
        let end = input_last_t_s(&series).expect("input");
        assert_eq!(end, 19);
        let dip = throughput_dip(&series, 10..end, None).expect("dip");
        assert_eq!((dip.min, dip.offered), (8000.0, 8000.0));
        assert_eq!(dip.to_string(), "min 8 000 rec/s of 8 000 before the start at t=10 s");
        let latency: Vec<(i64, Option<f64>)> = (0..30).map(|t| (t, (t <= 19).then_some(20.0))).collect();
        assert_eq!(backlog_recovery_s(&latency, 10, None, Some(end)), Some(0));
        assert_eq!(backlog_recovery_s(&latency, 10, None, None), None, "judged past the input");
    }

    #[test]
    fn records_are_grouped_by_thousands() {
        assert_eq!(fmt_records(4100.0), "4 100");
        assert_eq!(fmt_records(999.4), "999");
        assert_eq!(fmt_records(1_234_567.0), "1 234 567");
        assert_eq!(fmt_records(0.0), "0");
    }

    #[test]
    fn a_scheduled_rate_drop_is_not_a_dip_but_falling_behind_the_offered_rate_is() {
        // Offered 60/s until 45 s, then 20/s; the job keeps up except at 30 s.
        let offered = |t: i64| Some(if t >= 45 { 20.0 } else { 60.0 });
        let series: Vec<(i64, f64)> =
            (0..60).map(|t| (t, if t == 30 { 45.0 } else { offered(t).unwrap_or(0.0) })).collect();
        let dip = throughput_dip(&series, 25..59, Some(&offered)).expect("dip");
        assert_eq!(
            (dip.min, dip.offered, dip.at_t_s, dip.reference),
            (45.0, 60.0, 30, DipReference::Offered)
        );
        // Against the seconds before (the old definition), the scheduled drop looks like a dip.
        let naive = throughput_dip(&series, 25..59, None).expect("dip");
        assert_eq!((naive.min, naive.at_t_s), (20.0, 45));
        // Seconds with no known offered rate are not judged.
        let unknown = |t: i64| (t != 30).then_some(60.0);
        assert_eq!(throughput_dip(&series, 25..59, Some(&unknown)).map(|d| d.at_t_s), Some(45));
    }

    #[test]
    fn offered_rate_integrates_the_schedule_over_each_second() {
        let config = "duration_s = 60\n[params.source]\nrate = [{ at_ms = 0, records_per_sec = 30000.0 }, { at_ms = 20000, records_per_sec = 60000.0 }, { at_ms = 45000, records_per_sec = 30000.0 }]\n";
        // The run started 250 ms into unix second 1000.
        let offered = OfferedRate::from_config(config, 1_000_250).expect("schedule");
        assert_eq!(offered.in_second(1000), None, "the sources started within it");
        assert_eq!(offered.in_second(1001), Some(30_000.0));
        // Unix second 1020 is schedule ms 19_750..20_750: 250 ms at 30k, 750 ms at 60k.
        assert_eq!(offered.in_second(1020), Some(30_000.0 * 0.25 + 60_000.0 * 0.75));
        assert_eq!(offered.in_second(1030), Some(60_000.0));
        assert_eq!(offered.in_second(1059), Some(30_000.0), "ms 58_750..59_750");
        assert_eq!(offered.in_second(1060), None, "the sources stopped within it");
        assert_eq!(offered.last_increase_before(25_000), Some(20_000));
        assert_eq!(offered.last_increase_before(19_999), None);
        assert_eq!(offered.last_increase_before(50_000), Some(20_000), "a drop is no increase");
        let unlimited = "[params.source]\nrate = [{ at_ms = 0, records_per_sec = 0.0 }]\n";
        assert_eq!(OfferedRate::from_config(unlimited, 0), None);
        assert_eq!(OfferedRate::from_config("{\"not\": \"toml\"}", 0), None);
    }

    #[test]
    fn recovery_is_zero_when_lag_never_rises() {
        let series = lag(&[Some(10.0); 30]);
        assert_eq!(backlog_recovery_s(&series, 10, None, None), Some(0));
    }

    #[test]
    fn recovery_needs_three_healthy_seconds() {
        // pre = 20 → threshold = max(30, 70) = 70.
        let mut v = vec![Some(20.0); 10];
        v.extend([Some(900.0), Some(500.0), Some(60.0), Some(60.0), Some(80.0)]);
        v.extend([Some(60.0), Some(70.0), Some(10.0), Some(10.0)]);
        assert_eq!(backlog_recovery_s(&lag(&v), 10, None, None), Some(5));
    }

    #[test]
    fn recovery_is_measured_against_the_lag_before_the_overload() {
        // Healthy 10 ms until a surge at 10 s; lag grows until the reconfiguration at 15 s and
        // is back to 10 ms from 20 s.
        let mut v = vec![Some(10.0); 10];
        v.extend([100.0, 300.0, 600.0, 900.0, 1200.0, 1500.0, 1000.0, 600.0, 300.0, 100.0].map(Some));
        v.extend([Some(10.0); 10]);
        let series = lag(&v);
        assert_eq!(backlog_recovery_s(&series, 15, Some(10), None), Some(5));
        // Measured against the 10 s just before the start, the backlog is the baseline: the
        // threshold (1.5 × mean of 5–14 s = 472.5 ms) "recovers" at 18 s, with 300 ms of lag.
        assert_eq!(backlog_recovery_s(&series, 15, None, None), Some(3));
    }

    #[test]
    fn missing_lag_is_not_recovered() {
        let mut v = vec![Some(20.0); 10];
        v.extend([None, None, Some(20.0), Some(20.0), None, Some(20.0), Some(20.0), Some(20.0)]);
        assert_eq!(backlog_recovery_s(&lag(&v), 10, None, None), Some(5));
    }

    #[test]
    fn recovery_none_when_lag_never_recovers_or_no_baseline() {
        let mut v = vec![Some(20.0); 10];
        v.extend([Some(900.0), Some(20.0), Some(20.0)]);
        assert_eq!(backlog_recovery_s(&lag(&v), 10, None, None), None, "only 2 healthy seconds");
        let mut growing = vec![Some(5.0); 10];
        growing.extend((1..40).map(|i| Some(f64::from(i) * 100.0)));
        assert_eq!(backlog_recovery_s(&lag(&growing), 10, None, None), None);
        assert_eq!(backlog_recovery_s(&lag(&[None, Some(5.0)]), 0, None, None), None);
    }

    #[test]
    fn a_recovery_after_the_input_ended_reads_as_longer_than_the_run_watched() {
        assert_eq!(fmt_recovery(Some(17), Some(44)), "17 s");
        assert_eq!(fmt_recovery(None, Some(44)), "> 44 s");
        assert_eq!(fmt_recovery(None, None), "never");
    }

    #[test]
    fn moving_average_trails_over_the_seconds_present() {
        let series = [(0, 10.0), (1, 20.0), (2, 30.0), (4, 50.0)];
        assert_eq!(moving_average(&series, 2), vec![(0, 10.0), (1, 15.0), (2, 25.0), (4, 50.0)]);
        assert_eq!(moving_average(&series, 10).last(), Some(&(4, 27.5)));
    }

    #[test]
    fn state_moved_splits_on_demand_background_and_eager() {
        let s = StateMoved::from_totals(1000.0, 300.0, 20.0);
        assert_eq!((s.on_demand, s.background, s.eager, s.total()), (1000.0, 300.0, 20.0, 1320.0));
        assert_eq!(StateMoved::from_totals(-0.0, 0.0, 0.0), StateMoved::default());
    }
}
