//! Capacity emulation (docs/architecture.md §4): on a 2-core machine adding tasks adds no CPU and
//! loopback costs nothing, so a scale-out could not add capacity and a state transfer would be
//! free. Two explicit limits make overload and scale-out mean something, the same under every
//! protocol:
//!
//! - [`RecordBudget`]: `[runtime] task_records_per_sec` per task of a stateful operator. A token
//!   bucket charged *after* each batch with the records it processed (records of data batches,
//!   and Koala's parked and forwarded records when they are processed — every call of the one
//!   batch path, `OperatorTask::on_batch`). While the bucket is in debt the task takes no *data*
//!   input: its loop sleeps in its `select` until the debt is paid, still serving commands, its
//!   peer lane and its fetch lane, so markers queued behind nothing, fetches, hand-overs and
//!   control messages never wait behind the budget. Nothing spins.
//! - [`SharedLink`]: `[runtime] link_mb_per_sec` per worker: every frame a worker receives on a
//!   peer or fetch lane from another worker (Koala fetch responses, pulls, hand-overs, forwarded
//!   records; stop-and-restart state chunks) takes its bytes' transmission time on one shared
//!   virtual link ([`LinkPacer`]); the connection's reader thread sleeps until the frame has
//!   "arrived". The link carries frames in slices of [`SLICE_BYTES`], so connections share it
//!   as a network link shares its packets: a small frame (a credit, a fetch, a close) waits at
//!   most a slice behind another connection's large one, not the whole of it. Data channels and
//!   co-located tasks are not limited.
//!
//! Both take the time as an argument, so tests drive them with a synthetic clock.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How much unused budget a task may bank while idle: 50 ms of its rate. Small, so the rate
/// holds over any window longer than that (a task never catches up a pause with a burst).
const BURST: Duration = Duration::from_millis(50);

/// A per-task processing budget: a token bucket that may go into debt by one batch.
#[derive(Debug, Clone)]
pub struct RecordBudget {
    rate: f64,
    burst: f64,
    /// Tokens at `last` (negative = debt).
    tokens: f64,
    last: Instant,
    /// The gate was announced closed until here (throttled time is counted once).
    closed_until: Instant,
}

impl RecordBudget {
    /// A budget of `records_per_sec` (> 0), starting full at `now`.
    pub fn new(records_per_sec: f64, now: Instant) -> Self {
        let burst = (records_per_sec * BURST.as_secs_f64()).max(1.0);
        Self { rate: records_per_sec, burst, tokens: burst, last: now, closed_until: now }
    }

    /// The budget, records per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = self.last.max(now);
    }

    /// Charges `records` processed at `now` (may leave the bucket in debt).
    pub fn charge(&mut self, records: u64, now: Instant) {
        self.refill(now);
        self.tokens -= records as f64;
    }

    /// `None` if the task may take data input at `now`; otherwise until when it may not, and
    /// how much of that closed time is newly announced (throttled time, counted once).
    pub fn closed_until(&mut self, now: Instant) -> Option<(Instant, Duration)> {
        self.refill(now);
        // A debt of a millionth of a record is float rounding, not debt: the gate must open at
        // the instant it announced, or a loop waiting for it would wake and wait 0 ns again.
        if self.tokens > -1e-6 {
            return None;
        }
        let wait_ns = (-self.tokens / self.rate * 1e9).ceil().max(1.0);
        let until = now + Duration::from_nanos(wait_ns as u64);
        let new = until.saturating_duration_since(self.closed_until.max(now));
        self.closed_until = self.closed_until.max(until);
        Some((until, new))
    }
}

/// Whether one second's work shows a task that cannot reach its budget: it was loaded (processed
/// at least half its budget, so batches are full enough to measure) and its processing time per
/// record — wall time of its batches, so CPU shared with other threads counts — would not fit
/// `budget` records into a second. Returns the measured capacity (records per second of
/// processing time) of a loaded second, and whether it falls short.
pub fn measured_capacity(budget: f64, records: u64, busy: Duration) -> Option<(f64, bool)> {
    if (records as f64) < budget / 2.0 || busy.is_zero() {
        return None;
    }
    let capacity = records as f64 / busy.as_secs_f64();
    Some((capacity, capacity < budget))
}

/// How much of a frame the shared link carries before another connection's frame may go: 16 KiB
/// (6 ms at 2.8 MB/s, 1 ms at 15.5 MB/s). Sharing frame by frame instead made every small
/// message wait behind a whole 256 KiB state chunk of another connection (91 ms at 2.8 MB/s),
/// which no real link does, and which slowed most the protocols that talk while state streams
/// (DRRS's credits and closes; Koala's fetches beside its background migration).
pub const SLICE_BYTES: usize = 16 * 1024;

/// A virtual link of fixed bandwidth: slices of frames are sent one after another, each taking
/// its bytes' transmission time, starting when the link is free (an idle link banks nothing).
#[derive(Debug, Clone)]
pub struct LinkPacer {
    bytes_per_sec: f64,
    free_at: Option<Instant>,
}

impl LinkPacer {
    /// A link of `mb_per_sec` megabytes (10^6 bytes) per second (> 0).
    pub fn new(mb_per_sec: f64) -> Self {
        Self { bytes_per_sec: mb_per_sec * 1e6, free_at: None }
    }

    /// Puts `bytes` on the link at `now`; returns when they have arrived. As the next slice of a
    /// frame whose previous slice arrived at `previous`, they start then if the link stayed free
    /// (the reader's oversleep is not lost bandwidth), else behind what others put on it
    /// meanwhile.
    pub fn reserve(&mut self, bytes: usize, now: Instant, previous: Option<Instant>) -> Instant {
        let ready = previous.map_or(now, |p| p.min(now));
        let start = self.free_at.map_or(ready, |f| f.max(ready));
        let arrived = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec);
        self.free_at = Some(arrived);
        arrived
    }
}

/// One worker's incoming link, shared by the reader threads of its peer and fetch connections.
/// Unlimited until a deployment sets a rate.
#[derive(Debug, Default)]
pub struct SharedLink(Mutex<Option<LinkPacer>>);

impl SharedLink {
    /// Sets the link's bandwidth (`None` = unlimited), as the deployment says.
    pub fn set_rate(&self, mb_per_sec: Option<f64>) {
        if let Ok(mut link) = self.0.lock() {
            let unchanged = match (&*link, mb_per_sec) {
                (Some(p), Some(mb)) => p.bytes_per_sec == mb * 1e6,
                (None, None) => true,
                _ => false,
            };
            if !unchanged {
                *link = mb_per_sec.map(LinkPacer::new);
            }
        }
    }

    /// Sleeps until a frame of `bytes` received now has crossed the link (at once if unlimited),
    /// slice by slice, so other connections' frames cross between its slices.
    pub fn pace(&self, bytes: usize) {
        let (mut left, mut previous) = (bytes, None);
        loop {
            let slice = left.min(SLICE_BYTES);
            let arrived = match self.0.lock() {
                Ok(mut link) => link.as_mut().map(|l| l.reserve(slice, Instant::now(), previous)),
                Err(_) => None,
            };
            let Some(arrived) = arrived else { return };
            let wait = arrived.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            left -= slice;
            if left == 0 {
                return;
            }
            previous = Some(arrived);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Drives a budget with a synthetic clock: a task that always has input takes a batch of
    /// `batch` whenever the gate is open and otherwise sleeps until it opens. Returns records
    /// processed in `[0, horizon)`.
    fn saturated(rate: f64, batch: u64, horizon: Duration) -> (u64, Duration) {
        let t0 = Instant::now();
        let mut budget = RecordBudget::new(rate, t0);
        let (mut now, mut processed, mut throttled) = (t0, 0, Duration::ZERO);
        while now < t0 + horizon {
            match budget.closed_until(now) {
                Some((until, new)) => {
                    throttled += new;
                    now = until;
                }
                None => {
                    budget.charge(batch, now);
                    processed += batch;
                    now += Duration::from_micros(10); // the batch's own processing time
                }
            }
        }
        (processed, throttled)
    }

    #[test]
    fn a_saturated_task_processes_its_budget_and_no_more() {
        for (rate, batch) in [(20_000.0, 256), (5_000.0, 1), (1_000.0, 256), (100_000.0, 64)] {
            let (processed, throttled) = saturated(rate, batch, Duration::from_secs(10));
            let bound = rate * 10.0 + rate * BURST.as_secs_f64() + batch as f64;
            assert!(processed as f64 <= bound, "rate {rate}: {processed} > {bound}");
            assert!(processed as f64 >= rate * 10.0 * 0.99, "rate {rate}: only {processed}");
            // The task was held back most of the time: it sleeps, it does not spin.
            assert!(throttled > Duration::from_secs(9), "rate {rate}: throttled {throttled:?}");
        }
    }

    #[test]
    fn an_idle_task_banks_at_most_the_burst() {
        let t0 = Instant::now();
        let mut budget = RecordBudget::new(10_000.0, t0);
        // Idle for 10 s, then a burst of input: only 50 ms worth goes through at once.
        let now = t0 + Duration::from_secs(10);
        assert!(budget.closed_until(now).is_none());
        budget.charge(500, now);
        assert!(budget.closed_until(now).is_none(), "exactly the burst is allowed");
        budget.charge(256, now);
        let (until, new) = budget.closed_until(now).expect("in debt");
        assert_eq!(until, now + Duration::from_micros(25_600));
        assert_eq!(new, until - now);
        // Asking again counts no new throttled time; the gate opens exactly when the debt is paid.
        assert_eq!(budget.closed_until(now + ms(5)).map(|(_, n)| n), Some(Duration::ZERO));
        assert!(budget.closed_until(until).is_none());
    }

    #[test]
    fn capacity_is_judged_only_on_loaded_seconds() {
        assert_eq!(measured_capacity(20_000.0, 9_999, ms(900)), None, "under half the budget");
        assert_eq!(measured_capacity(20_000.0, 20_000, ms(0)), None);
        let (cap, short) = measured_capacity(20_000.0, 20_000, ms(100)).expect("loaded");
        assert_eq!((cap.round(), short), (200_000.0, false));
        let (cap, short) = measured_capacity(20_000.0, 15_000, ms(1000)).expect("loaded");
        assert_eq!((cap.round(), short), (15_000.0, true));
    }

    #[test]
    fn a_link_sends_frames_one_after_another_at_its_bandwidth() {
        let t0 = Instant::now();
        let mut link = LinkPacer::new(100.0); // 100 MB/s: 1 MB takes 10 ms
        assert_eq!(link.reserve(1_000_000, t0, None), t0 + ms(10));
        // A second frame sent at once queues behind the first.
        assert_eq!(link.reserve(1_000_000, t0, None), t0 + ms(20));
        // After the link was idle, a frame starts when it is sent: idleness banks nothing.
        let later = t0 + Duration::from_secs(5);
        assert_eq!(link.reserve(500_000, later, None), later + ms(5));
        // 1 GB over 100 MB/s takes 10 s however it is cut.
        let mut link = LinkPacer::new(100.0);
        let end = (0..4096).fold(t0, |_, _| link.reserve(1 << 18, t0, None));
        assert_eq!(end, t0 + Duration::from_secs_f64(4096.0 * 262_144.0 / 1e8));
    }

    #[test]
    fn a_small_frame_crosses_between_the_slices_of_a_large_one() {
        let t0 = Instant::now();
        let mut link = LinkPacer::new(16.384); // 16 384 000 B/s: a slice of 16 KiB takes 1 ms
        let slice = Duration::from_secs_f64(SLICE_BYTES as f64 / 16_384_000.0);
        // A 256 KiB frame, slice by slice; its reader oversleeps 200 µs after each slice.
        let mut previous = None;
        let mut now = t0;
        let mut arrivals = Vec::new();
        for i in 0..16 {
            let arrived = link.reserve(SLICE_BYTES, now, previous);
            arrivals.push(arrived);
            previous = Some(arrived);
            now = arrived + Duration::from_micros(200);
            if i == 3 {
                // Meanwhile another connection's 100-byte credit: it waits for the slice in
                // flight at most, not for the other twelve.
                let credit = link.reserve(100, arrived - Duration::from_micros(500), None);
                assert!(credit <= arrived + ms(1), "{:?} after the slice", credit - arrived);
            }
        }
        // The oversleeps cost the large frame nothing: it took its 16 slices and the credit.
        let expected = slice * 16 + Duration::from_secs_f64(100.0 / 16_384_000.0);
        let took = arrivals[15] - t0;
        assert!(took.abs_diff(expected) < Duration::from_micros(2), "{took:?} vs {expected:?}");
    }

    #[test]
    fn an_unlimited_shared_link_never_waits_and_a_rate_can_be_set() {
        let link = SharedLink::default();
        link.pace(usize::MAX / 2); // unlimited: returns at once whatever the size
        link.set_rate(Some(1e6)); // 1 TB/s: a small frame takes nanoseconds
        link.pace(1000);
        assert!(link.0.lock().expect("lock").is_some());
        link.set_rate(None);
        assert!(link.0.lock().expect("lock").is_none());
    }
}
