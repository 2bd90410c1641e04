//! Per-task counters, turned into one set of samples per second (docs/architecture.md §9).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use koala_protocol::TaskSample;
use koala_types::{TaskId, metric};

use crate::throttle::measured_capacity;

mod batch_clock;
pub(crate) use batch_clock::{BatchClock, BatchEnds};

/// A batch at least this long is logged at debug (`task`, `latency_ms`, `queued_ms`: how long it
/// waited behind the task's earlier batches, not counted in its latency).
const SLOW_BATCH: Duration = Duration::from_millis(50);

/// Counters of one task for the current second.
pub struct TaskMetrics {
    task: TaskId,
    /// Records taken from inputs (sources: produced).
    pub records_in: u64,
    /// Records emitted (sinks: written).
    pub records_out: u64,
    /// Sources and sinks: records emitted or written since the job's start, restored ones
    /// included (`metric::RECORDS_TOTAL`).
    pub records_total: Option<u64>,
    /// Batches processed.
    pub batches: u64,
    /// State entries read.
    pub state_reads: u64,
    /// State entries written.
    pub state_writes: u64,
    /// Records dropped as too late.
    pub late_dropped: u64,
    /// Time blocked on full downstream channels.
    pub backpressure: Duration,
    /// Bytes of state sent to other tasks because a record there needed them (`metric::STATE_BYTES_ON_DEMAND`).
    pub state_bytes_on_demand: u64,
    /// Bytes of state sent to other tasks in the background (`metric::STATE_BYTES_BACKGROUND`).
    pub state_bytes_background: u64,
    /// Bytes of state given up with a hand-over (`metric::STATE_BYTES_EAGER`).
    pub state_bytes_eager: u64,
    /// Koala: keys sent to other tasks (fetched or pulled).
    pub state_keys_sent: u64,
    /// Koala: keys asked of another task that it did not hold.
    pub fetch_not_here: u64,
    /// Time data input was held back by the task's processing budget (`crate::throttle`).
    pub throttled: Duration,
    /// The task's processing budget, records/s, if it has one.
    pub budget: Option<f64>,
    /// Time spent processing batches and timer rounds.
    busy: Duration,
    /// Stateful tasks: records processed per bucket this second, indexed by bucket (empty until
    /// [`Self::count_buckets`] first runs; `metric::bucket_records`).
    bucket_records: Vec<u64>,
    /// When the task last warned that it cannot reach its budget.
    warned_short: Option<std::time::Instant>,
    /// External sources: records behind the end of the input.
    pub offset_lag: Option<u64>,
    /// External sources: records skipped as undecodable since the task started (set before
    /// each tick); the samples are the second's increase.
    pub malformed: Option<u64>,
    /// `malformed` at the previous tick.
    malformed_sent: u64,
    /// Koala: (KLT bytes, KLT entries) at the end of the second.
    pub klt_size: Option<(u64, u64)>,
    /// Stateful tasks with a state cache: its lookups since it opened, at the end of the second
    /// (set before each tick); the samples are the second's difference.
    pub cache_counts: Option<koala_state::CacheCounts>,
    /// `cache_counts` at the previous tick.
    cache_counts_sent: koala_state::CacheCounts,
    /// Koala: time the protocol core spent looking up batches' keys this second, and how many batches.
    pub klt_lookup: (Duration, u64),
    /// Stateful operators: records taken and not yet processed, at the end of the second (the
    /// task's loop sets it before each tick).
    pub queued_records: Option<u64>,
    /// The most records held at any moment of the second (`Self::held`).
    queued_peak: u64,
    /// Time input waited while the protocol held it back, this second (`Self::input_paused`).
    input_paused: Duration,
    /// Since when input has been held back, if it is.
    paused_since: Option<std::time::Instant>,
    batch_latency_us: Histogram<u64>,
    /// Where each batch's latency starts (`BatchClock`).
    pub(crate) batch_clock: BatchClock,
    lag_ms: Histogram<u64>,
    reports_lag: bool,
    /// Sources: the due time (unix ms) of the oldest record not yet emitted, sampled as lag at
    /// every tick while overdue (a paused or blocked source emits nothing to measure).
    pub pending_due_ms: Option<u64>,
    /// Sinks: end-to-end latency (arrival − due time) of the records written, ms.
    latency_ms: Histogram<u64>,
    next_tick: std::time::Instant,
    /// When the current sample's interval began (wall clock).
    interval_start: SystemTime,
}

/// The instant of the next whole wall-clock second after `now`. A tick taken late makes a short
/// next interval, never a skipped second; one that fires a hair before the boundary (the
/// monotonic and wall clocks drift apart) goes on to the boundary after, instead of sending a
/// sliver sample for the same second.
fn next_whole_second(now: std::time::Instant) -> std::time::Instant {
    let into_second = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let mut wait = Duration::from_secs(1) - Duration::from_nanos(u64::from(into_second));
    if wait < Duration::from_millis(50) {
        wait += Duration::from_secs(1);
    }
    now + wait
}

/// Bytes one moved state entry counts in the state-moved metrics (`metric::STATE_BYTES_EAGER` and
/// its siblings): its stored key (header and user key) and its value, as scans count them.
pub(crate) fn entry_bytes(user_key: usize, value: usize) -> u64 {
    (koala_state::KEY_HEADER_LEN + user_key + value) as u64
}

/// Bytes one moved timer counts in the state-moved metrics: its key and its time.
pub(crate) fn timer_bytes(key: &[u8]) -> u64 {
    key.len() as u64 + 8
}

/// Wall-clock now, unix milliseconds (the clock of `Record::due_ms`).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn histogram() -> Histogram<u64> {
    // Three significant digits up to one hour; cannot fail for these bounds.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant figures is valid"))
    })
}

impl TaskMetrics {
    /// Counters for `task`; `reports_lag` for sources.
    pub fn new(task: TaskId, reports_lag: bool) -> Self {
        Self {
            task,
            records_in: 0,
            records_out: 0,
            records_total: None,
            batches: 0,
            state_reads: 0,
            state_writes: 0,
            late_dropped: 0,
            backpressure: Duration::ZERO,
            state_bytes_on_demand: 0,
            state_bytes_background: 0,
            state_bytes_eager: 0,
            state_keys_sent: 0,
            fetch_not_here: 0,
            throttled: Duration::ZERO,
            budget: None,
            busy: Duration::ZERO,
            bucket_records: Vec::new(),
            warned_short: None,
            klt_size: None,
            cache_counts: None,
            cache_counts_sent: koala_state::CacheCounts::default(),
            offset_lag: None,
            malformed: None,
            malformed_sent: 0,
            klt_lookup: (Duration::ZERO, 0),
            queued_records: None,
            queued_peak: 0,
            input_paused: Duration::ZERO,
            paused_since: None,
            batch_latency_us: histogram(),
            batch_clock: BatchClock::new(),
            lag_ms: histogram(),
            reports_lag,
            pending_due_ms: None,
            latency_ms: histogram(),
            next_tick: next_whole_second(std::time::Instant::now()),
            interval_start: SystemTime::now(),
        }
    }

    /// Records one batch processed as it was taken, at `started`, its output ready at `done`: its
    /// busy time and its latency (`Self::batch_ended`).
    pub fn record_batch(&mut self, started: std::time::Instant, done: std::time::Instant) {
        self.record_busy(done.saturating_duration_since(started));
        self.batch_ended(started, done);
    }

    /// Counts one batch processed in `busy` (its latency is recorded by the caller, who knows
    /// when its first record was taken: `Self::batch_ended`).
    pub fn record_busy(&mut self, busy: Duration) {
        self.batches += 1;
        self.busy += busy;
    }

    /// Stateful tasks: counts `records` by their key's bucket (of `num_buckets`), for the
    /// per-bucket load (`metric::bucket_records`): one hash and one increment per record.
    pub fn count_buckets(&mut self, records: &[koala_types::Record], num_buckets: u16) {
        if self.bucket_records.len() != usize::from(num_buckets) {
            self.bucket_records.resize(usize::from(num_buckets), 0);
        }
        for r in records {
            let b = koala_types::bucket_of(&r.key, num_buckets);
            if let Some(n) = self.bucket_records.get_mut(usize::from(b)) {
                *n += 1;
            }
        }
    }

    /// Records the latency of a batch whose first record was taken at `taken` and whose output
    /// was ready at `done`, on the task's one ruler (`BatchClock`, docs/architecture.md §9), and
    /// returns it.
    pub(crate) fn batch_ended(&mut self, taken: std::time::Instant, done: std::time::Instant) -> Duration {
        let latency = self.batch_clock.ended(taken, done);
        let _ = self.batch_latency_us.record((latency.as_micros() as u64).max(1));
        if latency >= SLOW_BATCH {
            let queued = done.saturating_duration_since(taken).saturating_sub(latency);
            tracing::debug!(task = %self.task, latency_ms = latency.as_millis() as u64, queued_ms = queued.as_millis() as u64, "slow batch");
        }
        latency
    }

    /// The task holds `records` now (after an event): the second's peak of `queued_records`.
    pub fn held(&mut self, records: u64) {
        self.queued_peak = self.queued_peak.max(records);
    }

    /// Whether, at `now`, the task has input waiting that its protocol holds back (a pause: see
    /// `metric::INPUT_PAUSED_MS`). Called at every turn of the task's loop; the time from a call
    /// with `true` to the next with `false` counts, split at the second's boundary.
    pub fn input_paused(&mut self, paused: bool, now: std::time::Instant) {
        match (paused, self.paused_since) {
            (true, None) => self.paused_since = Some(now),
            (false, Some(since)) => {
                self.input_paused += now.saturating_duration_since(since);
                self.paused_since = None;
            }
            _ => {}
        }
    }

    /// Records one record's source lag.
    pub fn record_lag(&mut self, lag_ms: u64) {
        let _ = self.lag_ms.record(lag_ms);
    }

    /// Sinks: records the end-to-end latency of records written at `now_ms` (unix ms); records
    /// with an unknown due time (0) are not counted.
    pub fn record_arrivals(&mut self, records: &[koala_types::Record], now_ms: u64) {
        for r in records.iter().filter(|r| r.due_ms > 0) {
            let _ = self.latency_ms.record(now_ms.saturating_sub(r.due_ms));
        }
    }

    /// When the next sample set is due.
    pub fn next_tick(&self) -> std::time::Instant {
        self.next_tick
    }

    /// The time to ask for a task's last report with as it exits: its next tick or now, whichever
    /// is later, so the report is due however soon after the last tick the task exits. (A task's
    /// first tick can be up to 1.05 s away, `next_whole_second`: "now + 1 s" missed it, and a
    /// task that lived a few milliseconds — created by one migration, moved on by the next —
    /// exited without reporting the state it had written back.)
    pub fn last_report_at(&self) -> std::time::Instant {
        std::time::Instant::now().max(self.next_tick)
    }

    /// The samples of the second that ended, if one did; resets the counters.
    pub fn take_if_due(&mut self, now: std::time::Instant) -> Option<Vec<TaskSample>> {
        if now < self.next_tick {
            return None;
        }
        self.next_tick = next_whole_second(now);
        // A pause that goes on counts up to the tick in this second (a last report is asked for
        // with a time in the future: never past the present).
        if let Some(since) = self.paused_since {
            let until = now.min(std::time::Instant::now());
            self.input_paused += until.saturating_duration_since(since);
            self.paused_since = Some(until.max(since));
        }
        Some(self.take())
    }

    /// The samples accumulated so far; resets the counters.
    pub fn take(&mut self) -> Vec<TaskSample> {
        // A sample is stamped with the second its interval's middle falls in: ticks are aligned to
        // whole seconds, so a tick taken a little late (a task busy or blocked at the boundary)
        // still stamps the second it covers, and two tasks' samples of one second line up.
        let now = SystemTime::now();
        let middle = self.interval_start + now.duration_since(self.interval_start).unwrap_or_default() / 2;
        self.interval_start = now;
        let time_s = middle.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let task = self.task;
        let mut out = Vec::with_capacity(16);
        let mut push = |metric: &str, value: f64| {
            out.push(TaskSample { time_s, task, metric: metric.to_string(), value });
        };
        push(metric::RECORDS_IN, self.records_in as f64);
        push(metric::RECORDS_OUT, self.records_out as f64);
        push(metric::BATCHES, self.batches as f64);
        if let Some(total) = self.records_total {
            push(metric::RECORDS_TOTAL, total as f64);
        }
        push(metric::STATE_READS, self.state_reads as f64);
        push(metric::STATE_WRITES, self.state_writes as f64);
        push(metric::LATE_DROPPED, self.late_dropped as f64);
        push(metric::BACKPRESSURE_MS, self.backpressure.as_secs_f64() * 1000.0);
        push(metric::INPUT_PAUSED_MS, self.input_paused.as_secs_f64() * 1000.0);
        push(metric::BUSY_MS, (self.busy + self.throttled).as_secs_f64() * 1000.0);
        for (b, n) in self.bucket_records.iter_mut().enumerate().filter(|(_, n)| **n > 0) {
            if let Ok(b) = u16::try_from(b) {
                push(&metric::bucket_records(b), *n as f64);
            }
            *n = 0;
        }
        if let Some(queued) = self.queued_records {
            push(metric::QUEUED_RECORDS, queued as f64);
            push(metric::QUEUED_RECORDS_MAX, self.queued_peak.max(queued) as f64);
            // The next second's peak is at least what is held as it starts.
            self.queued_peak = queued;
        }
        push(metric::STATE_BYTES_ON_DEMAND, self.state_bytes_on_demand as f64);
        push(metric::STATE_BYTES_BACKGROUND, self.state_bytes_background as f64);
        push(metric::STATE_BYTES_EAGER, self.state_bytes_eager as f64);
        if self.state_keys_sent > 0 || self.fetch_not_here > 0 || self.klt_size.is_some() {
            push(metric::STATE_KEYS_SENT, self.state_keys_sent as f64);
            push(metric::FETCH_NOT_HERE, self.fetch_not_here as f64);
        }
        if let Some(budget) = self.budget {
            push(metric::THROTTLED_MS, self.throttled.as_secs_f64() * 1000.0);
            if let Some((capacity, short)) = measured_capacity(budget, self.records_in, self.busy) {
                push(metric::CAPACITY_RECORDS_PER_SEC, capacity);
                let now = std::time::Instant::now();
                if short && self.warned_short.is_none_or(|w| now >= w + Duration::from_secs(10)) {
                    self.warned_short = Some(now);
                    tracing::warn!(
                        task = %task,
                        budget,
                        capacity = capacity.round(),
                        "task cannot reach its processing budget (task_records_per_sec): its batches took more CPU than the budget leaves room for; lower task_records_per_sec to at most half of what `koala bench` measures"
                    );
                }
            }
        }
        if let Some(lag) = self.offset_lag {
            push(metric::SOURCE_OFFSET_LAG, lag as f64);
        }
        if let Some(skipped) = self.malformed {
            let sent = std::mem::replace(&mut self.malformed_sent, skipped);
            push(metric::RECORDS_MALFORMED, skipped.saturating_sub(sent) as f64);
        }
        if let Some(counts) = self.cache_counts {
            let sent = std::mem::replace(&mut self.cache_counts_sent, counts);
            push(metric::CACHE_HITS, counts.hits.saturating_sub(sent.hits) as f64);
            push(metric::CACHE_MISSES, counts.misses.saturating_sub(sent.misses) as f64);
        }
        if let Some((bytes, entries)) = self.klt_size {
            push(metric::KLT_BYTES, bytes as f64);
            push(metric::KLT_ENTRIES, entries as f64);
        }
        if self.klt_lookup.1 > 0 {
            push(
                metric::KLT_LOOKUP_MEAN_US,
                self.klt_lookup.0.as_secs_f64() * 1e6 / self.klt_lookup.1 as f64,
            );
        }
        self.klt_lookup = (Duration::ZERO, 0);
        if !self.batch_latency_us.is_empty() {
            push(metric::BATCH_LATENCY_MEAN_US, self.batch_latency_us.mean());
            push(metric::BATCH_LATENCY_P99_US, self.batch_latency_us.value_at_quantile(0.99) as f64);
            push(metric::BATCH_LATENCY_MAX_US, self.batch_latency_us.max() as f64);
        }
        if self.reports_lag
            && let Some(due) = self.pending_due_ms
        {
            let now_ms = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            if now_ms > due {
                let _ = self.lag_ms.record(now_ms - due);
            }
        }
        if !self.latency_ms.is_empty() {
            push(metric::LATENCY_P50_MS, self.latency_ms.value_at_quantile(0.5) as f64);
            push(metric::LATENCY_P99_MS, self.latency_ms.value_at_quantile(0.99) as f64);
            push(metric::LATENCY_MAX_MS, self.latency_ms.max() as f64);
        }
        if self.reports_lag && !self.lag_ms.is_empty() {
            push(metric::SOURCE_LAG_MEAN_MS, self.lag_ms.mean());
            push(metric::SOURCE_LAG_P99_MS, self.lag_ms.value_at_quantile(0.99) as f64);
        }
        self.records_in = 0;
        self.records_out = 0;
        self.batches = 0;
        self.state_reads = 0;
        self.state_writes = 0;
        self.late_dropped = 0;
        self.backpressure = Duration::ZERO;
        self.input_paused = Duration::ZERO;
        self.state_bytes_on_demand = 0;
        self.state_bytes_background = 0;
        self.state_bytes_eager = 0;
        self.state_keys_sent = 0;
        self.fetch_not_here = 0;
        self.throttled = Duration::ZERO;
        self.busy = Duration::ZERO;
        self.batch_latency_us.reset();
        self.lag_ms.reset();
        self.latency_ms.reset();
        out
    }
}

#[cfg(test)]
mod tests {
    use koala_types::{OperatorId, Record};
    use std::time::Instant;

    use super::*;

    fn value(samples: &[TaskSample], name: &str) -> Option<f64> {
        samples.iter().find(|s| s.metric == name).map(|s| s.value)
    }

    fn task() -> TaskId {
        TaskId { operator: OperatorId(3), index: 0 }
    }

    #[test]
    fn a_sink_reports_the_end_to_end_latency_of_the_records_it_wrote() {
        let mut m = TaskMetrics::new(task(), false);
        let record = |due_ms| Record { key: Vec::new(), value: Vec::new(), time: 0, due_ms };
        // Written at 100 000 ms: 98 records 10 ms after their due time, one 500 ms, one 2 s; one
        // with an unknown due time, not counted.
        let mut batch: Vec<Record> = (0..98).map(|_| record(99_990)).collect();
        batch.extend([record(99_500), record(98_000), record(0)]);
        m.record_arrivals(&batch, 100_000);
        let samples = m.take();
        assert_eq!(value(&samples, metric::LATENCY_P50_MS), Some(10.0));
        assert_eq!(value(&samples, metric::LATENCY_P99_MS), Some(500.0));
        assert_eq!(value(&samples, metric::LATENCY_MAX_MS), Some(2000.0));
        assert_eq!(value(&samples, metric::SOURCE_LAG_MEAN_MS), None, "a sink reports no lag");
        let next = m.take();
        assert_eq!(value(&next, metric::LATENCY_P99_MS), None, "no record written, no latency sample");
    }

    #[test]
    fn a_source_samples_the_lag_of_its_oldest_overdue_record_while_it_emits_nothing() {
        let mut m = TaskMetrics::new(task(), true);
        // Nothing overdue (its next record is due in an hour): no lag sample.
        m.pending_due_ms = Some(unix_ms() + 3_600_000);
        assert_eq!(value(&m.take(), metric::SOURCE_LAG_MEAN_MS), None);
        // Paused with a record due 5 s ago: each second reports the lag growing.
        m.pending_due_ms = Some(unix_ms() - 5_000);
        let lag = value(&m.take(), metric::SOURCE_LAG_P99_MS).unwrap_or(0.0);
        assert!((5_000.0..6_000.0).contains(&lag), "{lag}");
    }

    /// A source's malformed-record count (a running total) is reported as each second's increase,
    /// so the coordinator's sum over the samples is the total skipped.
    #[test]
    fn a_source_reports_the_malformed_records_it_skipped_each_second() {
        let mut m = TaskMetrics::new(task(), true);
        assert_eq!(
            value(&m.take(), metric::RECORDS_MALFORMED),
            None,
            "a source that cannot skip reports none"
        );
        m.malformed = Some(3);
        assert_eq!(value(&m.take(), metric::RECORDS_MALFORMED), Some(3.0));
        assert_eq!(value(&m.take(), metric::RECORDS_MALFORMED), Some(0.0));
        m.malformed = Some(5);
        assert_eq!(value(&m.take(), metric::RECORDS_MALFORMED), Some(2.0));
    }

    /// A task that exits before its first tick, which can be more than a second away, still
    /// reports what it counted (the lost `state_bytes_eager` of `oracle_random`'s
    /// `remote::seed_28_last_n`: a task created by one migration and moved on by the next).
    #[test]
    fn the_last_report_is_due_before_the_first_tick() {
        let mut m = TaskMetrics::new(task(), false);
        m.next_tick = Instant::now() + Duration::from_millis(1040);
        m.state_bytes_eager = 28;
        assert!(m.take_if_due(Instant::now() + Duration::from_secs(1)).is_none(), "the old last report");
        let last = m.take_if_due(m.last_report_at()).unwrap_or_default();
        assert_eq!(value(&last, metric::STATE_BYTES_EAGER), Some(28.0));
    }

    /// Paused time counts from a call with `true` to the next with `false`; a pause still on at
    /// the tick counts up to the tick and goes on in the next second; a last report asked for with
    /// a time in the future counts no further than the present; a task that sets no queue gauge
    /// reports none.
    #[test]
    fn input_paused_counts_held_back_time_split_at_the_tick() {
        let mut m = TaskMetrics::new(task(), false);
        let t0 = Instant::now() - Duration::from_secs(3);
        m.input_paused(true, t0);
        m.input_paused(true, t0 + Duration::from_millis(100));
        m.input_paused(false, t0 + Duration::from_millis(250));
        m.input_paused(false, t0 + Duration::from_millis(300));
        m.input_paused(true, t0 + Duration::from_millis(400));
        let first = m.take();
        assert_eq!(value(&first, metric::INPUT_PAUSED_MS), Some(250.0));
        assert_eq!(value(&first, metric::QUEUED_RECORDS), None);
        // Still paused at the tick (t0 + 1 s): 600 ms of it in this second.
        let tick = t0 + Duration::from_secs(1);
        m.next_tick = tick;
        m.held(40);
        m.held(12);
        m.queued_records = Some(7);
        let second = m.take_if_due(tick).unwrap_or_default();
        assert_eq!(value(&second, metric::INPUT_PAUSED_MS), Some(600.0));
        assert_eq!(value(&second, metric::QUEUED_RECORDS), Some(7.0));
        assert_eq!(value(&second, metric::QUEUED_RECORDS_MAX), Some(40.0), "the peak within the second");
        // The pause goes on from the tick: the next second counts only what follows it.
        m.input_paused(false, tick + Duration::from_millis(30));
        let third = m.take();
        assert_eq!(value(&third, metric::INPUT_PAUSED_MS), Some(30.0));
        assert_eq!(value(&third, metric::QUEUED_RECORDS_MAX), Some(7.0), "held since the tick");
        // The last report (a time 1 s ahead) counts a pause up to now, not up to that time.
        let before = Instant::now();
        m.input_paused(true, before - Duration::from_millis(10));
        m.next_tick = before;
        let last = m.take_if_due(before + Duration::from_secs(1)).unwrap_or_default();
        let ms = value(&last, metric::INPUT_PAUSED_MS).unwrap_or_default();
        let bound = Instant::now().duration_since(before).as_secs_f64() * 1000.0 + 10.0;
        assert!((10.0..=bound).contains(&ms), "{ms} ms, at most {bound}");
    }

    /// Batch latency and busy time are separate: a caller that knows when a batch's first record
    /// was taken records the latency itself.
    #[test]
    fn batch_latency_is_recorded_apart_from_busy_time() {
        let mut m = TaskMetrics::new(task(), false);
        m.record_busy(Duration::from_micros(100));
        let done = Instant::now();
        m.batch_ended(done - Duration::from_millis(40), done);
        let s = m.take();
        assert_eq!(value(&s, metric::BATCHES), Some(1.0));
        let max = value(&s, metric::BATCH_LATENCY_MAX_US).unwrap_or_default();
        assert!((39_900.0..=40_100.0).contains(&max), "{max}");
    }

    /// A stateful task's per-bucket counts: one sample per bucket with records, summing to the
    /// records counted, reset with each sample; busy time adds the throttle's holds.
    #[test]
    fn bucket_records_and_busy_time_are_sampled_per_second() {
        let mut m = TaskMetrics::new(task(), false);
        let record = |key: &[u8]| Record { key: key.to_vec(), value: Vec::new(), time: 0, due_ms: 0 };
        let keys: Vec<Record> = (0u32..200).map(|k| record(&k.to_le_bytes())).collect();
        m.count_buckets(&keys, 16);
        m.count_buckets(&keys[..50], 16);
        m.record_busy(Duration::from_millis(30));
        m.throttled = Duration::from_millis(700);
        let s = m.take();
        let buckets: Vec<(u16, f64)> =
            s.iter().filter_map(|x| Some((metric::bucket_of_metric(&x.metric)?, x.value))).collect();
        assert_eq!(buckets.iter().map(|b| b.1).sum::<f64>(), 250.0);
        let key0 = koala_types::bucket_of(&0u32.to_le_bytes(), 16);
        assert!(buckets.iter().any(|b| b.0 == key0 && b.1 >= 2.0), "{buckets:?}");
        assert!(buckets.iter().all(|b| b.1 > 0.0 && b.0 < 16), "only buckets with records: {buckets:?}");
        assert_eq!(value(&s, metric::BUSY_MS), Some(730.0));
        let next = m.take();
        assert!(next.iter().all(|x| metric::bucket_of_metric(&x.metric).is_none()), "counts reset");
    }
}
