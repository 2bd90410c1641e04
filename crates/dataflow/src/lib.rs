//! The typed dataflow API of koala-rs (DESIGN.md §3): a [`Dataflow`] builder, typed streams and
//! operators, compiled down to an erased [`graph::JobGraph`] that the runtime executes.

pub mod graph;
pub mod logic;
pub mod source;

pub use graph::{JobGraph, OperatorKind, OperatorSpec, Partitioning, TaskInstance};
pub use logic::{DataflowError, OperatorContext, OperatorLogic, SourceLogic, SourcePoll};
pub use source::{RateSchedule, RateStep, SourceOptions};
