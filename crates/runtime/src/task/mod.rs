//! Task loops: one thread per task, one loop per kind of operator.

mod drrs;
mod koala;
mod koala_intake;
pub(crate) mod location;
mod operator;
pub(crate) mod setup;
mod sink;
mod sink_parts;
mod source;
mod transfer;

/// The protocols' peer-lane messages, for the wire schema pin (`crate::wire_schema`) and the
/// fuzz targets (`crate::fuzzing`).
#[cfg(any(test, feature = "fuzzing"))]
pub use {drrs::Wire as DrrsWire, koala::Wire as KoalaWire};

use koala_protocol::WorkerMessage;

pub use self::operator::run_operator;
pub use self::setup::{TaskCommand, TaskSetup};
pub use self::sink::run_sink;
pub use self::source::run_source;
use crate::RuntimeError;

/// Runs a task to completion and reports how it ended: finished, failed with an error, or
/// panicked (reported with the panic message, so the job fails instead of hanging).
pub fn run_task(setup: TaskSetup, body: fn(TaskSetup) -> Result<(), RuntimeError>) {
    let task = setup.task;
    let events = setup.events.clone();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(setup)));
    match failure(outcome) {
        None => {
            let _ = events.send(WorkerMessage::TaskFinished { task });
        }
        Some(error) => {
            tracing::error!(%task, %error, "task failed");
            let _ = events.send(WorkerMessage::TaskFailed { task, error });
        }
    }
}

/// Why a task body did not finish cleanly, if it did not.
fn failure(outcome: std::thread::Result<Result<(), RuntimeError>>) -> Option<String> {
    match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Some(format!("panicked: {message}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_task_reports_its_panic_message() {
        let quiet = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let outcome = std::panic::catch_unwind(|| -> Result<(), RuntimeError> { panic!("boom {}", 7) });
        std::panic::set_hook(quiet);
        assert_eq!(failure(outcome).as_deref(), Some("panicked: boom 7"));
        let err = Err(RuntimeError::Control("bad".into()));
        assert!(failure(Ok(err)).is_some_and(|m| m.contains("bad")));
        assert_eq!(failure(Ok(Ok(()))), None);
    }
}
