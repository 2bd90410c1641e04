//! The control plane of koala-rs without I/O (docs/architecture.md §8): the typed messages
//! coordinator and workers exchange, and the pure state machines both sides drive — the watermark
//! aligner, the Koala protocol cores, the DRRS cores and the stop-and-restart task cores. Nothing here opens a
//! socket or spawns a thread, so the same code runs under the real runtime and under a
//! deterministic simulator.

pub mod checkpoint;
mod common;
pub mod control;
pub mod drrs;
pub mod engine;
mod fault;
pub mod koala;
pub mod memory;
mod moves;
pub mod phases;
pub mod plan;
pub mod relay;
#[cfg(feature = "sim")]
pub mod sim;
pub mod stop_restart;
pub mod switch;
pub mod watermark;

pub use common::unstarted::{FirstStart, UnstartedInputs};
pub use control::{
    CheckpointOptions, ClientReply, ControlHello, CoordinatorMessage, Deployment, EmulatedCapacity, Protocol,
    ReconfigPlan, ReconfigRequest, RestorePoint, RuntimeOptions, StateBackendKind, StateOptions, TaskAck,
    TaskSample, WorkerMessage,
};
pub use moves::{AssignmentMismatch, Moves, moves_between};
pub use watermark::WatermarkAligner;
