//! The typed dataflow API of koala-rs (docs/architecture.md §2): a [`Dataflow`] builder, typed
//! streams and operators, compiled down to an erased [`graph::JobGraph`] that the runtime executes.
//!
//! ```
//! use koala_dataflow::{Dataflow, KeyedEvent, KeyedEvents, KeyedEventsConfig, SourceOptions};
//! use koala_dataflow::{ValueState, local};
//!
//! // Running count per key over generated events, checked with the local reference executor.
//! let df = Dataflow::new();
//! let config = KeyedEventsConfig { key_space: 3, records: Some(30), ..Default::default() };
//! KeyedEvents::source(&df, "events", SourceOptions::default(), config.clone())
//!     .key_by(|e: &KeyedEvent| e.key)
//!     .stateful_map("count", |key: &u64, _e: KeyedEvent, n: &mut ValueState<u64>| {
//!         (*key, n.update(|n| { *n += 1; *n }))
//!     })
//!     .sink_json_lines("counts");
//! let graph = df.build()?;
//! let counts = &local::run(&graph)?["counts"];
//! assert_eq!(counts.len(), 30);
//! # Ok::<(), koala_dataflow::DataflowError>(())
//! ```

mod builder;
mod data;
pub mod generator;
pub mod graph;
mod join;
mod keyed_events;
pub mod local;
pub mod logic;
mod ops;
pub mod source;
pub mod state;
mod stateful;
mod stream;
pub mod window;

pub use graph::{JobGraph, OperatorKind, OperatorSpec, Partitioning, QueryResolver, TaskInstance};
pub use logic::{DataflowError, OperatorContext, OperatorLogic, Restored, SourceLogic, SourcePoll, TimerDue};
pub use source::{RateSchedule, RateStep, SourceOptions};

pub use builder::Dataflow;
pub use data::Data;
pub use generator::{Generator, GeneratorSource, splitmix64};
pub use keyed_events::{KeyedEvent, KeyedEvents, KeyedEventsConfig};
pub use koala_types::TimeDomain;
pub use ops::timer_process::{KeyContext, TIMER_STATE, Timers};
pub use state::{ListState, ValueState};
pub use stream::{KeyedStream, Stream};
pub use window::{Window, WindowSpec, WindowedStream};
