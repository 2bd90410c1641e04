//! The lines `koala run` prints while a job runs, in the order of one clock: a per-second
//! progress line comes out once every task reported that second (about 2 s late), and a
//! reconfiguration's lines wait for the progress line of their second, so the live log and the
//! report's `t` agree. A completion line says how much state the reconfiguration moved, read off
//! the seconds from its start to its completion (the report's ruler for every protocol).

use std::collections::BTreeMap;

use koala_coordinator::Progress;

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

#[cfg(test)]
mod tests {
    use super::*;

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
