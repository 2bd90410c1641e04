//! Two-input keyed joins: [`KeyedStream::window_join`] (pairs of one window, emitted when the
//! window fires) and [`KeyedStream::join`] (unwindowed: every pair, as soon as both sides are
//! there). Input 0 is the left stream, input 1 the right; both are partitioned by the same key.

use std::sync::Arc;

use crate::data::Data;
use crate::graph::{OperatorFactory, TaskInstance};
use crate::logic::OperatorLogic;
use crate::ops::join::KeyedJoinLogic;
use crate::ops::window_join::{WindowJoinFn, WindowJoinLogic};
use crate::stream::{KeyedStream, Stream};
use crate::window::{Window, WindowSpec};

impl<K: Data, L: Data> KeyedStream<K, L> {
    /// Records the problem if `right` belongs to another dataflow.
    fn check_same_dataflow<R>(&self, name: &str, right: &KeyedStream<K, R>) {
        if !self.df.same_as(&right.df) {
            self.df.error(format!("operator {name:?} joins streams of two different dataflows"));
        }
    }

    /// Joins the values of each key that fall into the same window: when a window fires, emits
    /// `f(key, window, left, right)` for every pair (left values in arrival order, each with every
    /// right value in arrival order), with event time `end - 1`.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, Window, WindowSpec, local};
    /// let df = Dataflow::new();
    /// // (user, amount) events at the given times.
    /// let events = |list: Vec<((&'static str, u32), u64)>| {
    ///     move |_| list.clone().into_iter().map(|((u, x), t)| ((u.to_string(), x), t))
    /// };
    /// let clicks = df.source("clicks", SourceOptions::default(), events(vec![(("u1", 1), 2), (("u2", 2), 3)]));
    /// let views = df.source("views", SourceOptions::default(), events(vec![(("u1", 10), 4), (("u1", 11), 14)]));
    /// let by_user = |(user, _): &(String, u32)| user.clone();
    /// clicks
    ///     .key_by(by_user)
    ///     .window_join("join", &views.key_by(by_user), WindowSpec::tumbling(10),
    ///         |user: &String, w: Window, (_, c): &(String, u32), (_, v): &(String, u32)| (user.clone(), w.start, *c, *v))
    ///     .sink_json_lines("out");
    /// // Only u1 has both a click and a view in window [0, 10).
    /// assert_eq!(local::run(&df.build()?)?["out"], vec![serde_json::json!(["u1", 0, 1, 10])]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn window_join<R: Data, O: Data>(
        &self,
        name: &str,
        right: &KeyedStream<K, R>,
        spec: WindowSpec,
        f: impl Fn(&K, Window, &L, &R) -> O + Send + Sync + 'static,
    ) -> Stream<O> {
        self.check_same_dataflow(name, right);
        if let Some(problem) = spec.problem() {
            self.df.error(format!("operator {name:?}: {problem}"));
        }
        let f: Arc<WindowJoinFn<K, L, R, O>> = Arc::new(f);
        let factory: OperatorFactory = Arc::new(move |_task: TaskInstance| {
            Box::new(WindowJoinLogic::new(f.clone(), spec)) as Box<dyn OperatorLogic>
        });
        self.keyed_operator(name, vec![right.input()], factory, true, 0)
    }

    /// Joins every left value with every right value of the same key, unwindowed: each arriving
    /// value is stored and emitted as `f(key, left, right)` with every stored value of the other
    /// side, in arrival order, with the arriving record's event time. State grows without bound.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, SourceOptions, local};
    /// let df = Dataflow::new();
    /// let users = df.source("users", SourceOptions::default(), |_| vec![((1u32, "ann".to_string()), 0)].into_iter());
    /// let orders = df.source("orders", SourceOptions::default(), |_| vec![((1u32, 30u64), 1), ((2, 40), 2)].into_iter());
    /// users
    ///     .key_by(|(id, _): &(u32, String)| *id)
    ///     .join("join", &orders.key_by(|(id, _): &(u32, u64)| *id),
    ///         |_id: &u32, (_, name): &(u32, String), (_, amount): &(u32, u64)| (name.clone(), *amount))
    ///     .sink_json_lines("out");
    /// assert_eq!(local::run(&df.build()?)?["out"], vec![serde_json::json!(["ann", 30])]);
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn join<R: Data, O: Data>(
        &self,
        name: &str,
        right: &KeyedStream<K, R>,
        f: impl Fn(&K, &L, &R) -> O + Send + Sync + 'static,
    ) -> Stream<O> {
        self.check_same_dataflow(name, right);
        let f = Arc::new(f);
        let factory: OperatorFactory = Arc::new(move |_task: TaskInstance| {
            Box::new(KeyedJoinLogic::<K, L, R, O, _>::new(f.clone())) as Box<dyn OperatorLogic>
        });
        self.keyed_operator(name, vec![right.input()], factory, false, 0)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Dataflow, SourceOptions};

    #[test]
    fn joining_streams_of_two_dataflows_is_rejected() {
        let a = Dataflow::new();
        let b = Dataflow::new();
        let left =
            a.source("l", SourceOptions::default(), |_| std::iter::empty::<(u8, u64)>()).key_by(|x: &u8| *x);
        let right =
            b.source("r", SourceOptions::default(), |_| std::iter::empty::<(u8, u64)>()).key_by(|x: &u8| *x);
        left.join("j", &right, |_: &u8, l: &u8, r: &u8| (*l, *r)).sink_discard("out");
        let err = a.build().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("\"j\" joins streams of two different dataflows"), "{err}");
    }
}
