//! Stopping a job this process runs (`koala run`, `demo`, `compare`, `bench`, `experiment`,
//! `coordinator`), for the three ways a user stops one:
//!
//! - **The first Ctrl-C or SIGTERM** sets the job's stop flag: the coordinator ends the sources,
//!   the job drains what is in flight, prints its summary and is recorded as interrupted. It says
//!   so at once, and that a second one forces the exit.
//! - **A second one** ends the process now (exit 130): it says what that leaves behind (no
//!   summary, the worker processes and state servers it started killed, the run recorded as
//!   interrupted) and how to go on (`koala run --resume DIR` when the job takes checkpoints).
//! - **A closed standard output** (`koala run job.toml | head -3`, [`crate::terminal`]) stops
//!   the job like the first Ctrl-C, quietly; the process then exits 141, as one killed by
//!   SIGPIPE would, after the job and its processes ended cleanly.
//!
//! Signals are read on a thread of their own (`signal_hook::iterator`), so the messages are
//! printed outside the signal handler.

use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::Context;

static STOP: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// Set once a second Ctrl-C is ending the process: the main thread then says nothing more (the
/// job's end, a lost worker, is the forced exit's doing).
static FORCING: AtomicBool = AtomicBool::new(false);
/// The job a forced exit concerns, if one runs.
static JOB: Mutex<Option<RunningJob>> = Mutex::new(None);
/// Processes this one started for its job (workers, state servers): a forced exit kills them.
static CHILDREN: Mutex<Vec<Arc<Mutex<Child>>>> = Mutex::new(Vec::new());

/// What a second Ctrl-C tells about the job under way, and where it records the run's end.
#[derive(Clone, Debug)]
pub struct RunningJob {
    /// The run id.
    pub run: String,
    /// Its metrics database.
    pub metrics_db: PathBuf,
    /// The job's output directory.
    pub output_dir: PathBuf,
    /// Whether it takes checkpoints (then it can be resumed from the last one).
    pub checkpoints: bool,
}

/// Whether Ctrl-C, SIGTERM or a closed standard output stopped a job of this process (`koala
/// experiment` then runs no more).
pub fn interrupted() -> bool {
    STOP.get().is_some_and(|s| s.load(Ordering::SeqCst))
}

/// The flag Ctrl-C and SIGTERM set, with the thread that reads them started (once per process).
pub fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    if let Some(stop) = STOP.get() {
        return Ok(stop.clone());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut signals =
        signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
            .context("installing the Ctrl-C / SIGTERM handler")?;
    let flag = stop.clone();
    std::thread::Builder::new()
        .name("koala-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                let name = if signal == signal_hook::consts::SIGTERM { "SIGTERM" } else { "Ctrl-C" };
                if flag.swap(true, Ordering::SeqCst) {
                    force_exit(name);
                }
                crate::terminal::note(&first_interrupt_note(name));
            }
        })
        .context("starting the signal thread")?;
    let stop = STOP.get_or_init(|| stop).clone();
    // An output that closed before the job started stops it as soon as it starts.
    if crate::terminal::stdout_closed() {
        stop.store(true, Ordering::SeqCst);
    }
    Ok(stop)
}

/// Whether a second Ctrl-C is ending the process (the main thread waits for it to).
pub fn forcing() -> bool {
    FORCING.load(Ordering::SeqCst)
}

/// The standard output closed: the job stops as at a first Ctrl-C, without a word (there is no
/// one to read it).
pub fn stdout_closed() {
    if let Some(stop) = STOP.get() {
        stop.store(true, Ordering::SeqCst);
    }
}

/// Names the job under way (`None`: none), for what a second Ctrl-C says and records.
pub fn set_job(job: Option<RunningJob>) {
    if let Ok(mut slot) = JOB.lock() {
        *slot = job;
    }
}

/// Tracks a process started for the job, so a forced exit kills it; the caller waits for it
/// (and kills it) as usual through the returned handle.
pub fn track(child: Child) -> Arc<Mutex<Child>> {
    let child = Arc::new(Mutex::new(child));
    if let Ok(mut children) = CHILDREN.lock() {
        children.retain(|c| Arc::strong_count(c) > 1);
        children.push(child.clone());
    }
    child
}

fn first_interrupt_note(name: &str) -> String {
    format!(
        "{name}: stopping the job: its sources end now, it drains what is in flight and prints its \
         summary (the run is recorded as interrupted). {name} again stops at once, without draining."
    )
}

/// The second Ctrl-C: say what stopping now leaves, kill the job's processes, record the run as
/// interrupted and exit 130.
fn force_exit(name: &str) -> ! {
    FORCING.store(true, Ordering::SeqCst);
    let job = JOB.lock().ok().and_then(|j| j.clone());
    // Before the kill: the coordinator, seeing its workers go, would record a failure.
    if let Some(job) = &job {
        record_forced_end(job, name);
    }
    let killed = kill_children();
    let mut text = format!("second {name}: stopping now, without draining and without a summary");
    if killed > 0 {
        text.push_str(&format!("; the job's {killed} worker and state-server processes are killed"));
    }
    if let Some(job) = &job {
        let dir = job.output_dir.display();
        if job.checkpoints {
            text.push_str(&format!(
                ". Sink output past the last completed checkpoint may be partial; go on from that \
                 checkpoint with `koala run --resume {dir}`"
            ));
        } else {
            text.push_str(&format!(
                ". The job takes no checkpoints (checkpoint_interval_ms), so it cannot be resumed: \
                 run it again with `koala run <config>` (its sink files in {dir} are partial)"
            ));
        }
    }
    crate::terminal::note(&text);
    std::process::exit(130);
}

/// Kills every tracked process still running; returns how many it killed.
fn kill_children() -> usize {
    let children = CHILDREN.lock().map(|c| c.clone()).unwrap_or_default();
    let mut killed = 0;
    for child in children {
        // A child being waited for is left to its waiter (it is ending).
        let Ok(mut child) = child.try_lock() else { continue };
        if matches!(child.try_wait(), Ok(None)) && child.kill().is_ok() {
            let _ = child.wait();
            killed += 1;
        }
    }
    killed
}

/// Records the forced end in the metrics store, beside the coordinator's own connection (WAL).
fn record_forced_end(job: &RunningJob, name: &str) {
    use koala_coordinator::metrics_store::{MetricsStore, RunStatus};
    let detail = format!("a second {name} stopped it at once, without draining");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if let Ok(mut store) = MetricsStore::open(&job.metrics_db) {
        let _ = store.end_run(&job.run, RunStatus::Interrupted, now, Some(&detail));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_first_interrupt_says_a_second_one_forces_the_exit() {
        let note = super::first_interrupt_note("Ctrl-C");
        assert!(note.contains("drains") && note.contains("Ctrl-C again stops at once"), "{note}");
    }
}
