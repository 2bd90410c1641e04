//! Keyed stateful operators: a closure per record with typed per-key state ([`ValueState`],
//! [`ListState`]). The runtime fetches the state of every key of a batch before the batch and
//! writes back what changed after it (docs/architecture.md §5); outputs keep the input key and
//! event time.

use std::sync::Arc;

use crate::data::Data;
use crate::graph::{OperatorFactory, TaskInstance};
use crate::logic::OperatorLogic;
use crate::ops::keyed_process::{KeyedProcessLogic, ProcessFn, StateShape};
use crate::ops::timer_process::{KeyContext, TimerProcessLogic};
use crate::state::{ListState, ValueState};
use crate::stream::{KeyedStream, Stream};

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

    /// A keyed operator with a value, a list and event-time and processing-time timers per key
    /// ([`KeyContext`]). `on_record` runs per value; `on_timer` runs when the watermark reaches
    /// an event-time timer the key registered and did not delete — or the task's clock a
    /// processing-time one (`Timers::register_processing_time`; `Timers::fired_domain` tells
    /// which fired) — with the key's state, in timestamp order (keys with timers at the same
    /// time in key order). Record outputs carry the record's event time, event-time timer
    /// outputs the timer's, processing-time timer outputs the task's watermark. Records later than the watermark are dropped (as by windows), so a
    /// timer at `t` has seen every record before `t`. The timers move with their keys under
    /// every protocol (docs/architecture.md §2).
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, KeyContext, SourceOptions, local};
    /// // Per key: the sum of its values in the 10 ms after its first one, emitted at that time.
    /// let df = Dataflow::new();
    /// let values = vec![((1u8, 5u32), 0), ((2, 1), 3), ((1, 6), 9), ((3, 0), 20), ((1, 100), 25), ((2, 2), 40)];
    /// let options = SourceOptions { max_disorder_ms: 0, ..Default::default() };
    /// df.source("src", options, move |_| values.clone().into_iter())
    ///     .key_by(|(k, _): &(u8, u32)| *k)
    ///     .process_with_timers(
    ///         "sum10",
    ///         |_k: &u8, (_, v): (u8, u32), c: &mut KeyContext<u32, ()>, _out: &mut Vec<(u8, u32)>| {
    ///             if c.timers.pending().next().is_none() {
    ///                 c.value.clear();
    ///                 let end = c.timers.now() + 10;
    ///                 c.timers.register(end);
    ///             }
    ///             c.value.update(|s| *s += v);
    ///         },
    ///         |k: &u8, _time, c: &mut KeyContext<u32, ()>, out: &mut Vec<(u8, u32)>| {
    ///             out.extend(c.value.take().map(|s| (*k, s)));
    ///         },
    ///     )
    ///     .sink_json_lines("out");
    /// let out = local::run_with(&df.build()?, &local::LocalOptions { batch_size: 1, ..Default::default() })?;
    /// use serde_json::json;
    /// /// // The watermark 20 fires keys 1 (at 10) and 2 (at 13); 40 fires 3 (at 30) and 1 (at 35).
    /// let expected = [json!([1, 11]), json!([2, 1]), json!([3, 0]), json!([1, 100]), json!([2, 2])];
    /// assert_eq!(out["out"], expected);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn process_with_timers<S: Data, L: Data, O: Data>(
        &self,
        name: &str,
        on_record: impl Fn(&K, T, &mut KeyContext<S, L>, &mut Vec<O>) + Send + Sync + 'static,
        on_timer: impl Fn(&K, koala_types::Timestamp, &mut KeyContext<S, L>, &mut Vec<O>) + Send + Sync + 'static,
    ) -> Stream<O> {
        let on_record: Arc<crate::ops::timer_process::OnRecordFn<K, T, S, L, O>> = Arc::new(on_record);
        let on_timer: Arc<crate::ops::timer_process::OnTimerFn<K, S, L, O>> = Arc::new(on_timer);
        let factory: OperatorFactory = Arc::new(move |_task: TaskInstance| {
            Box::new(TimerProcessLogic::new(on_record.clone(), on_timer.clone())) as Box<dyn OperatorLogic>
        });
        self.keyed_operator(name, Vec::new(), factory, true, 0)
    }
}
