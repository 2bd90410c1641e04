//! The end-of-input watchdog (`[runtime] end_timeout_s`): once every source task has finished,
//! the job must end by itself. If nothing moves towards that end — no task finishes, reports its
//! inputs ended or is released, no reconfiguration completes — for the bound, the job fails with
//! every unfinished task and what it still waits for (`koala_protocol::engine::Waiting`), instead
//! of running until someone kills it.
//!
//! ```
//! use std::time::{Duration, Instant};
//! # use koala_coordinator::ending::EndWatch;
//! let mut watch = EndWatch::new(Duration::from_secs(60));
//! let t0 = Instant::now();
//! assert_eq!(watch.overdue(false, 0, t0 + Duration::from_secs(600)), None, "the input has not ended");
//! assert_eq!(watch.overdue(true, 0, t0), None);
//! assert_eq!(watch.overdue(true, 1, t0 + Duration::from_secs(50)), None, "a task finished: the wait starts again");
//! assert_eq!(watch.overdue(true, 1, t0 + Duration::from_secs(100)), None);
//! assert_eq!(watch.overdue(true, 1, t0 + Duration::from_secs(110)), Some(Duration::from_secs(60)));
//! ```

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

/// The watchdog's state: when it last saw the job move after its input ended.
#[derive(Clone, Debug)]
pub struct EndWatch {
    bound: Duration,
    /// The progress mark last seen, and since when, once the input ended.
    since: Option<(u64, Instant)>,
}

impl EndWatch {
    /// A watchdog with the bound `[runtime] end_timeout_s`.
    pub fn new(bound: Duration) -> Self {
        Self { bound, since: None }
    }

    /// Called on every turn of the coordinator's loop: whether every source task has finished,
    /// a mark of the job's progress towards its end (it changes whenever a task finishes, reports
    /// its inputs ended or is released, or a reconfiguration completes;
    /// `Engine::end_progress`), and the time. Returns how long nothing moved once that reaches
    /// the bound: the job is stuck.
    pub fn overdue(&mut self, input_ended: bool, progress: u64, now: Instant) -> Option<Duration> {
        if !input_ended {
            // Not ended yet, or sources restored by a recovery.
            self.since = None;
            return None;
        }
        match self.since {
            Some((mark, since)) if mark == progress => {
                let still = now.saturating_duration_since(since);
                (still >= self.bound).then_some(still)
            }
            _ => {
                self.since = Some((progress, now));
                None
            }
        }
    }
}

/// One number for any hashable progress mark (`Engine::end_progress`).
pub fn mark(progress: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    progress.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The watchdog fires only after the input ended and only once nothing moved for the whole
    /// bound; any progress starts the wait again, and a restored input (recovery) resets it.
    #[test]
    fn fires_only_after_the_bound_without_progress() {
        let bound = Duration::from_millis(500);
        let mut w = EndWatch::new(bound);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(w.overdue(false, 7, at(0)), None);
        assert_eq!(w.overdue(false, 7, at(10_000)), None, "never while a source runs");
        assert_eq!(w.overdue(true, 7, at(10_000)), None, "the wait starts when the input ends");
        assert_eq!(w.overdue(true, 7, at(10_499)), None);
        assert_eq!(w.overdue(true, 8, at(10_499)), None, "progress");
        assert_eq!(w.overdue(true, 8, at(10_998)), None);
        assert_eq!(w.overdue(true, 8, at(10_999)), Some(bound));
        assert_eq!(w.overdue(false, 8, at(11_000)), None, "sources restored by a recovery");
        assert_eq!(w.overdue(true, 8, at(11_100)), None, "a new wait");
        assert_eq!(w.overdue(true, 8, at(11_700)), Some(Duration::from_millis(600)));
        assert_ne!(mark((1, 2, 3, 4)), mark((1, 2, 4, 3)));
    }
}
