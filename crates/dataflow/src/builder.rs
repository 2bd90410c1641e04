//! The [`Dataflow`] builder: collects operators while user code chains typed streams, then
//! validates and emits the erased [`JobGraph`] (docs/architecture.md §2). Building happens on one
//! thread, so the shared builder state is an `Rc<RefCell<..>>` every stream holds a handle to.

use std::cell::RefCell;
use std::collections::HashSet;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use koala_types::OperatorId;

use crate::data::Data;
use crate::generator::{Generator, GeneratorSource};
use crate::graph::{InputSpec, JobGraph, OperatorKind, OperatorSpec, TaskInstance};
use crate::logic::{DataflowError, SourceLogic};
use crate::source::SourceOptions;
use crate::stream::Stream;

/// Operators added so far and problems found while adding them (reported by [`Dataflow::build`]).
#[derive(Default)]
struct BuilderState {
    operators: Vec<OperatorSpec>,
    errors: Vec<String>,
}

/// Builds a job: add sources, chain operators on the returned streams, then call
/// [`Dataflow::build`].
///
/// ```
/// use koala_dataflow::{Dataflow, SourceOptions, local};
///
/// let df = Dataflow::new();
/// df.source("numbers", SourceOptions::default(), |_task| (1..=3u64).map(|n| (n, n)))
///     .map("double", |n: u64| n * 2)
///     .sink_json_lines("out");
/// let outputs = local::run(&df.build()?)?;
/// assert_eq!(outputs["out"], vec![serde_json::json!(2), serde_json::json!(4), serde_json::json!(6)]);
/// # Ok::<(), koala_dataflow::DataflowError>(())
/// ```
#[derive(Clone, Default)]
pub struct Dataflow {
    inner: Rc<RefCell<BuilderState>>,
}

impl std::fmt::Debug for Dataflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.inner.borrow();
        let names: Vec<&str> = state.operators.iter().map(|o| o.name.as_str()).collect();
        f.debug_struct("Dataflow").field("operators", &names).finish()
    }
}

impl Dataflow {
    /// An empty job.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a source whose tasks each run the generator `factory` builds for them. Values are
    /// emitted unkeyed (empty key); the event time is the generator's timestamp.
    ///
    /// Every task calls `factory` with its [`TaskInstance`]; a generator that ignores it makes
    /// every task emit the same records.
    pub fn source<T, G, F>(&self, name: &str, options: SourceOptions, factory: F) -> Stream<T>
    where
        T: Data,
        G: Generator<T> + 'static,
        F: Fn(TaskInstance) -> G + Send + Sync + 'static,
    {
        let factory = Arc::new(move |task: TaskInstance| {
            Box::new(GeneratorSource::new(factory(task))) as Box<dyn SourceLogic>
        });
        let id = self.add(name, Vec::new(), OperatorKind::Source { factory, options });
        Stream::new(self.clone(), id)
    }

    /// Adds a source implemented by a connector (e.g. Kafka): `factory` builds each task's
    /// [`SourceLogic`], which must emit values encoded as `T`. The caller vouches for the type.
    pub fn source_from<T: Data>(
        &self,
        name: &str,
        options: SourceOptions,
        factory: crate::graph::SourceFactory,
    ) -> Stream<T> {
        let id = self.add(name, Vec::new(), OperatorKind::Source { factory, options });
        Stream::new(self.clone(), id)
    }

    /// Validates the job and returns its erased graph.
    ///
    /// Fails, naming the operator, on an empty or duplicate operator name or on any problem
    /// recorded while the job was built (e.g. joining streams of two different dataflows).
    pub fn build(&self) -> Result<JobGraph, DataflowError> {
        let state = self.inner.borrow();
        let mut errors = state.errors.clone();
        let mut seen = HashSet::new();
        for op in &state.operators {
            if op.name.trim().is_empty() {
                errors.push(format!("operator {} has an empty name", op.id));
            } else if !seen.insert(op.name.as_str()) {
                errors.push(format!("operator name {:?} is used more than once", op.name));
            }
        }
        if state.operators.is_empty() {
            errors.push("the dataflow has no operators".to_string());
        }
        if errors.is_empty() {
            Ok(JobGraph { operators: state.operators.clone() })
        } else {
            Err(DataflowError::Other(format!("invalid dataflow: {}", errors.join("; "))))
        }
    }

    /// Appends an operator and returns its id.
    pub(crate) fn add(&self, name: &str, inputs: Vec<InputSpec>, kind: OperatorKind) -> OperatorId {
        let mut state = self.inner.borrow_mut();
        // More than u32::MAX operators cannot be built in memory anyway; saturate rather than wrap.
        let id = OperatorId(u32::try_from(state.operators.len()).unwrap_or(u32::MAX));
        state.operators.push(OperatorSpec { id, name: name.to_string(), inputs, kind });
        id
    }

    /// Records a problem found while building; [`Dataflow::build`] reports it.
    pub(crate) fn error(&self, message: String) {
        self.inner.borrow_mut().errors.push(message);
    }

    /// Whether two handles build the same job.
    pub(crate) fn same_as(&self, other: &Dataflow) -> bool {
        Rc::ptr_eq(&self.inner, &other.inner)
    }
}

/// Zero-sized marker that keeps stream types invariant-free and `Send`-neutral.
pub(crate) type TypeTag<T> = PhantomData<fn() -> T>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_names_are_rejected_naming_the_operator() {
        let df = Dataflow::new();
        let s = df.source("src", SourceOptions::default(), |_| std::iter::empty::<(u64, u64)>());
        s.map("m", |x: u64| x).sink_discard("m");
        let err = df.build().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("\"m\" is used more than once"), "{err}");
    }

    #[test]
    fn empty_dataflow_is_rejected() {
        assert!(Dataflow::new().build().is_err());
    }

    #[test]
    fn operators_are_in_topological_order() -> Result<(), DataflowError> {
        let df = Dataflow::new();
        df.source("src", SourceOptions::default(), |_| std::iter::empty::<(u64, u64)>())
            .key_by(|x: &u64| *x % 2)
            .stateful_map("count", |_k: &u64, _x: u64, n: &mut crate::ValueState<u64>| {
                n.update(|n| {
                    *n += 1;
                    *n
                })
            })
            .sink_discard("sink");
        let graph = df.build()?;
        for op in &graph.operators {
            assert!(op.inputs.iter().all(|i| i.from < op.id));
        }
        let count = graph.by_name("count").map(|o| o.is_stateful());
        assert_eq!(count, Some(true));
        Ok(())
    }
}
