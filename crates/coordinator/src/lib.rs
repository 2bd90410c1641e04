//! Coordinator: job config, deployment, placement, partition policies, the job driver, metrics
//! store and reports (docs/architecture.md §3, §6, §7, §9).

pub mod autoscale;
pub mod checkpoint;
mod clock;
pub mod config;
pub mod control;
pub mod ending;
mod error;
#[cfg(test)]
mod hostile_input;
pub mod http;
mod job;
pub mod metrics_store;
pub mod partition;
mod placement;
pub mod progress;
pub mod reconfig;
pub mod report;
pub mod request_record;
pub mod resume;
pub mod server;

pub use config::{ConfigError, JobConfig, StateSection};
pub use error::CoordinatorError;
pub use progress::{Progress, ProgressEvent};
pub use server::{JobRun, JobSummary, resolve, run_job};
