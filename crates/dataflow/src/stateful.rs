//! Keyed stateful operators: a closure per record with typed per-key state ([`ValueState`],
//! [`ListState`]). The runtime fetches the state of every key of a batch before the batch and
//! writes back what changed after it (docs/architecture.md §5); outputs keep the input key and
//! event time.

use std::sync::Arc;

use crate::graph::{OperatorFactory, TaskInstance};
use crate::logic::OperatorLogic;
use crate::ops::keyed_process::{KeyedProcessLogic, ProcessFn, StateShape};
use crate::state::{ListState, ValueState};
use crate::stream::{Data, KeyedStream, Stream};

impl<K: Data, T: Data> KeyedStream<K, T> {
    fn process<S: Data, L: Data, O: Data>(
        &self,
        name: &str,
        shape: StateShape,
        f: Arc<ProcessFn<K, T, S, L, O>>,
    ) -> Stream<O> {
        let factory: OperatorFactory = Arc::new(move |_task: TaskInstance| {
            Box::new(KeyedProcessLogic::new(f.clone(), shape)) as Box<dyn OperatorLogic>
        });
        self.keyed_operator(name, Vec::new(), factory, false, 0)
    }

    /// Maps every value to one output with access to the key's [`ValueState`].
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, ValueState, local};
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| vec![(1u8, 0), (2, 0), (1, 0)].into_iter())
    ///     .key_by(|x: &u8| *x)
    ///     .stateful_map("count", |key: &u8, _x: u8, seen: &mut ValueState<u32>| {
    ///         (*key, seen.update(|n| { *n += 1; *n }))
    ///     })
    ///     .sink_json_lines("out");
    /// let out = &local::run(&df.build()?)?["out"];
    /// use serde_json::json;
    /// assert_eq!(*out, vec![json!([1, 1]), json!([2, 1]), json!([1, 2])]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn stateful_map<S: Data, O: Data>(
        &self,
        name: &str,
        f: impl Fn(&K, T, &mut ValueState<S>) -> O + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process(
            name,
            StateShape::Value,
            Arc::new(move |k, t, value, _list: &mut ListState<()>, out| out.push(f(k, t, value))),
        )
    }

    /// Emits zero or more outputs per value with access to the key's [`ValueState`].
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, ValueState, local};
    /// // Emit the running maximum only when it changes.
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| vec![(3i32, 0), (1, 0), (5, 0)].into_iter())
    ///     .key_by(|_: &i32| ())
    ///     .stateful_flat_map("max", |_k: &(), x: i32, max: &mut ValueState<i32>, out: &mut Vec<i32>| {
    ///         if max.get().is_none_or(|m| x > *m) {
    ///             max.set(x);
    ///             out.push(x);
    ///         }
    ///     })
    ///     .sink_json_lines("out");
    /// assert_eq!(local::run(&df.build()?)?["out"], vec![serde_json::json!(3), serde_json::json!(5)]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn stateful_flat_map<S: Data, O: Data>(
        &self,
        name: &str,
        f: impl Fn(&K, T, &mut ValueState<S>, &mut Vec<O>) + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process(
            name,
            StateShape::Value,
            Arc::new(move |k, t, value, _list: &mut ListState<()>, out| f(k, t, value, out)),
        )
    }

    /// Emits zero or more outputs per value with access to the key's [`ListState`].
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, ListState, local};
    /// // The last two values per key, after every value.
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| (1..=3u32).map(|x| (x, 0)))
    ///     .key_by(|_: &u32| 0u8)
    ///     .stateful_flat_map_list("last2", |_k: &u8, x: u32, last: &mut ListState<u32>, out: &mut Vec<Vec<u32>>| {
    ///         last.push(x);
    ///         last.truncate_front(2);
    ///         out.push(last.items().to_vec());
    ///     })
    ///     .sink_json_lines("out");
    /// let out = &local::run(&df.build()?)?["out"];
    /// assert_eq!(out.last(), Some(&serde_json::json!([2, 3])));
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn stateful_flat_map_list<L: Data, O: Data>(
        &self,
        name: &str,
        f: impl Fn(&K, T, &mut ListState<L>, &mut Vec<O>) + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process(
            name,
            StateShape::List,
            Arc::new(move |k, t, _value: &mut ValueState<()>, list, out| f(k, t, list, out)),
        )
    }

    /// Emits zero or more outputs per value with access to both a [`ValueState`] and a
    /// [`ListState`] of the key.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, ListState, ValueState, local};
    /// // Buffer values and emit them with their count every second value.
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| (1..=4u32).map(|x| (x, 0)))
    ///     .key_by(|_: &u32| 0u8)
    ///     .stateful_flat_map2("pairs", |_k: &u8, x: u32, n: &mut ValueState<u32>, buf: &mut ListState<u32>, out: &mut Vec<(u32, Vec<u32>)>| {
    ///         buf.push(x);
    ///         let count = n.update(|n| { *n += 1; *n });
    ///         if buf.len() == 2 {
    ///             out.push((count, buf.items().to_vec()));
    ///             buf.clear();
    ///         }
    ///     })
    ///     .sink_json_lines("out");
    /// let out = &local::run(&df.build()?)?["out"];
    /// assert_eq!(*out, vec![serde_json::json!([2, [1, 2]]), serde_json::json!([4, [3, 4]])]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn stateful_flat_map2<S: Data, L: Data, O: Data>(
        &self,
        name: &str,
        f: impl Fn(&K, T, &mut ValueState<S>, &mut ListState<L>, &mut Vec<O>) + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process(name, StateShape::ValueAndList, Arc::new(f))
    }
}
