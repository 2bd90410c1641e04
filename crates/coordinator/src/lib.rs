//! Coordinator: job config, deployment, placement, partition policies, the job driver, metrics
//! store and reports (docs/architecture.md §3, §6, §7, §9).

pub mod config;
pub mod control;
pub mod metrics_store;
pub mod partition;
pub mod progress;
pub mod reconfig;
pub mod report;
pub mod server;

pub use config::{ConfigError, JobConfig};
pub use progress::{Progress, ProgressEvent};
pub use server::{CoordinatorError, JobRun, JobSummary, resolve, run_job};
