//! Typed streams: [`Stream<T>`] (unkeyed) and [`KeyedStream<K, T>`] (partitioned by a key), with
//! the stateless operators, `key_by` and the sinks. Keyed stateful operators live in
//! [`crate::stateful`], windows in [`crate::window`], joins in [`crate::join`].

use std::sync::Arc;

use koala_types::{OperatorId, decode, encode};

use crate::builder::{Dataflow, TypeTag};
use crate::data::Data;
use crate::graph::{InputSpec, KeyFn, OperatorFactory, OperatorKind, Partitioning};
use crate::logic::{DataflowError, OperatorLogic, SinkFormat, ValueToJson};
use crate::ops::stateless::{StatelessLogic, filter_fn, flat_map_fn, map_fn};

/// The output of an operator, carrying values of type `T`.
pub struct Stream<T> {
    pub(crate) df: Dataflow,
    pub(crate) op: OperatorId,
    partitioning: Partitioning,
    _type: TypeTag<T>,
}

impl<T> Clone for Stream<T> {
    fn clone(&self) -> Self {
        Self {
            df: self.df.clone(),
            op: self.op,
            partitioning: self.partitioning.clone(),
            _type: TypeTag::default(),
        }
    }
}

impl<T> std::fmt::Debug for Stream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({}, {:?})", self.op, self.partitioning)
    }
}

impl<T: Data> Stream<T> {
    pub(crate) fn new(df: Dataflow, op: OperatorId) -> Self {
        Self { df, op, partitioning: Partitioning::Forward, _type: TypeTag::default() }
    }

    /// The operator producing this stream.
    pub fn operator(&self) -> OperatorId {
        self.op
    }

    fn input(&self) -> InputSpec {
        InputSpec { from: self.op, partitioning: self.partitioning.clone() }
    }

    fn stateless<O: Data>(&self, name: &str, logic: StatelessLogic) -> Stream<O> {
        let factory: OperatorFactory = Arc::new(move |_| Box::new(logic.clone()) as Box<dyn OperatorLogic>);
        let kind =
            OperatorKind::Transform { factory, stateful: false, event_time: false, allowed_lateness: 0 };
        let id = self.df.add(name, vec![self.input()], kind);
        Stream::new(self.df.clone(), id)
    }

    /// Applies `f` to every value; keeps key and event time.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, local};
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| vec![(1i64, 0), (2, 0)].into_iter())
    ///     .map("negate", |x: i64| -x)
    ///     .sink_json_lines("out");
    /// assert_eq!(local::run(&df.build()?)?["out"], vec![serde_json::json!(-1), serde_json::json!(-2)]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn map<O: Data>(&self, name: &str, f: impl Fn(T) -> O + Send + Sync + 'static) -> Stream<O> {
        self.stateless(name, map_fn(f))
    }

    /// Keeps the values for which `f` is true.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, local};
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| (0..6u32).map(|x| (x, 0)))
    ///     .filter("even", |x: &u32| x % 2 == 0)
    ///     .sink_json_lines("out");
    /// use serde_json::json;
    /// assert_eq!(local::run(&df.build()?)?["out"], vec![json!(0), json!(2), json!(4)]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn filter(&self, name: &str, f: impl Fn(&T) -> bool + Send + Sync + 'static) -> Stream<T> {
        self.stateless(name, filter_fn(f))
    }

    /// Replaces every value by the values `f` returns (zero or more), in order.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, local};
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| vec![("a b".to_string(), 0)].into_iter())
    ///     .flat_map("words", |s: String| s.split(' ').map(str::to_string).collect::<Vec<_>>())
    ///     .sink_json_lines("out");
    /// assert_eq!(local::run(&df.build()?)?["out"], vec![serde_json::json!("a"), serde_json::json!("b")]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn flat_map<O: Data, I: IntoIterator<Item = O>>(
        &self,
        name: &str,
        f: impl Fn(T) -> I + Send + Sync + 'static,
    ) -> Stream<O> {
        self.stateless(name, flat_map_fn(f))
    }

    /// Partitions the stream by the key `f` computes. Creates no operator: the next operator's
    /// input becomes key-partitioned, and upstream tasks compute the key (`encode(&f(&value))`)
    /// as they emit.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, ValueState, local};
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| vec![("x".to_string(), 0), ("y".to_string(), 1), ("x".to_string(), 2)].into_iter())
    ///     .key_by(|s: &String| s.clone())
    ///     .stateful_map("count", |k: &String, _v: String, n: &mut ValueState<u32>| {
    ///         (k.clone(), n.update(|n| { *n += 1; *n }))
    ///     })
    ///     .sink_json_lines("out");
    /// let out = &local::run(&df.build()?)?["out"];
    /// assert_eq!(out.last(), Some(&serde_json::json!(["x", 2])));
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn key_by<K: Data>(&self, f: impl Fn(&T) -> K + Send + Sync + 'static) -> KeyedStream<K, T> {
        let key_fn: KeyFn = Arc::new(move |bytes: &[u8]| {
            let value: T = decode(bytes)?;
            encode(&f(&value))
        });
        KeyedStream { df: self.df.clone(), op: self.op, key_fn, _type: TypeTag::default() }
    }

    /// Distributes the values round-robin over the next operator's tasks.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, local};
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| (0..3u8).map(|x| (x, 0)))
    ///     .rebalance()
    ///     .sink_json_lines("out");
    /// assert_eq!(local::run(&df.build()?)?["out"].len(), 3);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn rebalance(&self) -> Stream<T> {
        Self { partitioning: Partitioning::Rebalance, ..self.clone() }
    }

    fn sink(&self, name: &str, format: SinkFormat) {
        self.df.add(name, vec![self.input()], OperatorKind::Sink { format });
    }

    /// Writes every value as one JSON line, into a file per task under the job's output
    /// directory (`<dir>/<name>-<task>.jsonl`).
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, local};
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| vec![((1u8, "a".to_string()), 0)].into_iter())
    ///     .sink_json_lines("out");
    /// assert_eq!(local::run(&df.build()?)?["out"], vec![serde_json::json!([1, "a"])]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn sink_json_lines(&self, name: &str) {
        self.sink(name, SinkFormat::JsonLines(json_renderer::<T>()));
    }

    /// Writes every value as one JSON line on standard output.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, local};
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| vec![(7u8, 0)].into_iter()).sink_stdout("print");
    /// // The local executor collects stdout sinks instead of printing them.
    /// assert_eq!(local::run(&df.build()?)?["print"], vec![serde_json::json!(7)]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn sink_stdout(&self, name: &str) {
        self.sink(name, SinkFormat::Stdout(json_renderer::<T>()));
    }

    /// Writes every value through a connector's sink (e.g. Kafka), built per task by `factory`.
    pub fn sink_with(&self, name: &str, factory: crate::logic::SinkFactory) {
        self.sink(name, SinkFormat::Custom(factory));
    }

    /// Counts and drops every value (throughput experiments).
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, local};
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| vec![(7u8, 0)].into_iter()).sink_discard("drop");
    /// assert!(local::run(&df.build()?)?["drop"].is_empty());
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn sink_discard(&self, name: &str) {
        self.sink(name, SinkFormat::Discard);
    }
}

/// The erased `T -> JSON` renderer sinks use.
fn json_renderer<T: Data>() -> ValueToJson {
    Arc::new(|bytes: &[u8]| {
        let value: T = decode(bytes)?;
        serde_json::to_string(&value)
            .map_err(|e| DataflowError::Other(format!("rendering a sink value as JSON: {e}")))
    })
}

/// A stream partitioned by a key of type `K`, computed from each `T`. Consumed by the keyed
/// stateful operators, windows and joins; made with [`Stream::key_by`].
pub struct KeyedStream<K, T> {
    pub(crate) df: Dataflow,
    pub(crate) op: OperatorId,
    key_fn: KeyFn,
    _type: TypeTag<(K, T)>,
}

impl<K, T> Clone for KeyedStream<K, T> {
    fn clone(&self) -> Self {
        Self { df: self.df.clone(), op: self.op, key_fn: self.key_fn.clone(), _type: TypeTag::default() }
    }
}

impl<K, T> std::fmt::Debug for KeyedStream<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyedStream({})", self.op)
    }
}

impl<K: Data, T: Data> KeyedStream<K, T> {
    /// The key-partitioned edge into a consumer.
    pub(crate) fn input(&self) -> InputSpec {
        InputSpec { from: self.op, partitioning: Partitioning::Key(self.key_fn.clone()) }
    }

    /// Adds a keyed operator reading this stream (and `more` inputs) and returns its output.
    pub(crate) fn keyed_operator<O: Data>(
        &self,
        name: &str,
        more: Vec<InputSpec>,
        factory: OperatorFactory,
        event_time: bool,
        allowed_lateness: u64,
    ) -> Stream<O> {
        let mut inputs = vec![self.input()];
        inputs.extend(more);
        let kind = OperatorKind::Transform { factory, stateful: true, event_time, allowed_lateness };
        let id = self.df.add(name, inputs, kind);
        Stream::new(self.df.clone(), id)
    }
}
