//! The koala-rs worker process (docs/architecture.md §3, §4): it hosts many tasks, each one loop on its own
//! thread, connected by bounded in-memory queues (co-located tasks) or one TCP connection per
//! logical channel (tasks on different workers). Bounded queues and blocking socket writes give
//! backpressure end to end; nothing polls with sleeps.

mod batch_state;
mod channel;
mod checkpoint;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
#[cfg(test)]
mod hostile_bytes;
mod links;
mod memory;
mod metrics;
mod net;
mod output;
mod peer;
mod queue;
#[cfg(test)]
mod scenarios;
mod task;
mod throttle;
mod timers;
#[cfg(test)]
mod wire_schema;
mod worker;
mod worker_state;

pub use checkpoint::RESTORE_EAGERLY;
pub use error::RuntimeError;
pub use worker::{WorkerOptions, run_worker};
pub use worker_state::{WORKER_ID_PLACEHOLDER, data_dir_of};
