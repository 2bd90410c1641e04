//! Event-time windows over a keyed stream: tumbling and sliding [`WindowSpec`]s, the
//! [`Window`] a result belongs to, and [`WindowedStream::aggregate`].
//!
//! A record at time `t` belongs to every window with `start <= t < end`; window starts are
//! multiples of the slide (tumbling: of the size). A window fires once the watermark reaches its
//! end; its result carries event time `end - 1`. With allowed lateness `L` a fired window is kept
//! until the watermark reaches `end + L`, and every late record that updates it re-emits the
//! updated result.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::data::Data;
use crate::graph::{OperatorFactory, TaskInstance};
use crate::logic::OperatorLogic;
use crate::ops::window_aggregate::{AggregateFns, WindowAggregateLogic};
use crate::stream::{KeyedStream, Stream};

/// The extent of one window: `[start, end)` in event time (milliseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Window {
    /// First millisecond in the window.
    pub start: u64,
    /// First millisecond after the window.
    pub end: u64,
}

/// How records are grouped into windows.
///
/// ```
/// use koala_dataflow::{Window, WindowSpec};
///
/// let tumbling: Vec<Window> = WindowSpec::tumbling(10).windows_of(25).collect();
/// assert_eq!(tumbling, vec![Window { start: 20, end: 30 }]);
/// let sliding: Vec<u64> = WindowSpec::sliding(10, 5).windows_of(25).map(|w| w.start).collect();
/// assert_eq!(sliding, vec![20, 25]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowSpec {
    size_ms: u64,
    slide_ms: u64,
}

impl WindowSpec {
    /// Back-to-back windows of `size_ms`.
    pub fn tumbling(size_ms: u64) -> Self {
        Self { size_ms, slide_ms: size_ms }
    }

    /// Windows of `size_ms` starting every `slide_ms` (overlapping when `slide_ms < size_ms`).
    pub fn sliding(size_ms: u64, slide_ms: u64) -> Self {
        Self { size_ms, slide_ms }
    }

    /// Length of a window.
    pub fn size_ms(&self) -> u64 {
        self.size_ms
    }

    /// Distance between the starts of consecutive windows.
    pub fn slide_ms(&self) -> u64 {
        self.slide_ms
    }

    /// The window starting at `start`.
    pub fn window_at(&self, start: u64) -> Window {
        Window { start, end: start.saturating_add(self.size_ms) }
    }

    /// The windows a record at `time` belongs to, by ascending start.
    pub fn windows_of(&self, time: u64) -> impl Iterator<Item = Window> + use<> {
        let spec = *self;
        let slide = self.slide_ms.max(1);
        // The first start s (a multiple of the slide) with s + size > time.
        let first = if self.size_ms == 0 {
            None
        } else if time < self.size_ms {
            Some(0)
        } else {
            ((time - self.size_ms) / slide + 1).checked_mul(slide)
        };
        std::iter::successors(first, move |s| s.checked_add(slide))
            .take_while(move |s| *s <= time)
            .map(move |s| spec.window_at(s))
    }

    /// Why the spec is unusable, if it is.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        if self.size_ms == 0 {
            Some("window size must be positive")
        } else if self.slide_ms == 0 {
            Some("window slide must be positive")
        } else {
            None
        }
    }
}

/// A keyed stream grouped into windows, made with [`KeyedStream::window`].
pub struct WindowedStream<K, T> {
    keyed: KeyedStream<K, T>,
    spec: WindowSpec,
    allowed_lateness: u64,
}

impl<K, T> std::fmt::Debug for WindowedStream<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedStream")
            .field("keyed", &self.keyed)
            .field("spec", &self.spec)
            .field("allowed_lateness", &self.allowed_lateness)
            .finish()
    }
}

impl<K: Data, T: Data> KeyedStream<K, T> {
    /// Groups the values of each key into event-time windows.
    pub fn window(&self, spec: WindowSpec) -> WindowedStream<K, T> {
        WindowedStream { keyed: self.clone(), spec, allowed_lateness: 0 }
    }
}

impl<K: Data, T: Data> WindowedStream<K, T> {
    /// Accepts records up to `ms` behind the watermark; windows they update re-emit their
    /// result. Default 0: a window's result is final when it fires.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, Window, WindowSpec, local};
    /// // Disorder 0: the watermark follows the newest time, so the value at 4 is late for [0, 5).
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), |_| vec![(1u32, 1), (2, 6), (3, 4)].into_iter())
    ///     .key_by(|_: &u32| ())
    ///     .window(WindowSpec::tumbling(5))
    ///     .allowed_lateness(5)
    ///     .aggregate("sum", || 0u32, |s: &mut u32, v: &u32| *s += v, |_: &(), w: Window, s: u32| (w.start, s))
    ///     .sink_json_lines("out");
    /// let out = local::run_with(&df.build()?, &local::LocalOptions { batch_size: 1, ..Default::default() })?;
    /// use serde_json::json;
    /// // [0, 5) fires with 1, then again with 1 + 3 when the late value arrives; [5, 10) with 2.
    /// assert_eq!(out["out"], vec![json!([0, 1]), json!([0, 4]), json!([5, 2])]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn allowed_lateness(mut self, ms: u64) -> Self {
        self.allowed_lateness = ms;
        self
    }

    /// Folds each window's values into an accumulator (`init`, then `add` per value) and emits
    /// `finish(key, window, accumulator)` when the window fires, with event time `end - 1`.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, Window, WindowSpec, local};
    /// // Sum per key and 10 ms tumbling window: values are (key, amount) at the given times.
    /// let events = vec![(("a", 1), 1), (("a", 2), 5), (("b", 7), 6), (("a", 4), 12)];
    /// let df = Dataflow::new();
    /// df.source("src", SourceOptions::default(), move |_| {
    ///     events.clone().into_iter().map(|((k, v), t)| ((k.to_string(), v), t))
    /// })
    /// .key_by(|(k, _): &(String, i64)| k.clone())
    /// .window(WindowSpec::tumbling(10))
    /// .aggregate(
    ///     "sum",
    ///     || 0i64,
    ///     |sum: &mut i64, (_, v): &(String, i64)| *sum += v,
    ///     |k: &String, w: Window, sum: i64| (k.clone(), w.start, sum),
    /// )
    /// .sink_json_lines("out");
    /// let mut out = local::run(&df.build()?)?.remove("out").unwrap_or_default();
    /// out.sort_by_key(|v| v.to_string());
    /// use serde_json::json;
    /// assert_eq!(out, vec![json!(["a", 0, 3]), json!(["a", 10, 4]), json!(["b", 0, 7])]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn aggregate<A, O>(
        &self,
        name: &str,
        init: impl Fn() -> A + Send + Sync + 'static,
        add: impl Fn(&mut A, &T) + Send + Sync + 'static,
        finish: impl Fn(&K, Window, A) -> O + Send + Sync + 'static,
    ) -> Stream<O>
    where
        A: Data + Clone,
        O: Data,
    {
        if let Some(problem) = self.spec.problem() {
            self.keyed.df.error(format!("operator {name:?}: {problem}"));
        }
        let fns =
            Arc::new(AggregateFns { init: Box::new(init), add: Box::new(add), finish: Box::new(finish) });
        let (spec, lateness) = (self.spec, self.allowed_lateness);
        let factory: OperatorFactory = Arc::new(move |_task: TaskInstance| {
            Box::new(WindowAggregateLogic::new(fns.clone(), spec, lateness)) as Box<dyn OperatorLogic>
        });
        self.keyed.keyed_operator(name, Vec::new(), factory, true, lateness)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn windows_of_contains_exactly_the_covering_windows(
            size in 1u64..50, slide in 1u64..50, t in 0u64..1000,
        ) {
            let spec = WindowSpec::sliding(size, slide);
            let got: Vec<Window> = spec.windows_of(t).collect();
            let expected: Vec<Window> = (0..=t)
                .filter(|s| s % slide == 0 && s + size > t)
                .map(|s| spec.window_at(s))
                .collect();
            prop_assert_eq!(got, expected);
        }
    }

    #[test]
    fn zero_size_has_no_windows() {
        assert_eq!(WindowSpec::tumbling(0).windows_of(5).count(), 0);
        assert!(WindowSpec::sliding(10, 0).problem().is_some());
    }
}
