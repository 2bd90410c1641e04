//! Window aggregation logic. Each key has one value state holding all its open windows (a map
//! from window start to accumulator), so the windows of a key move with the key's bucket. A timer
//! at a window's end fires it; with allowed lateness a second timer at `end + lateness` removes it.

use std::collections::BTreeMap;
use std::sync::Arc;

use koala_types::{Record, Timestamp, decode};
use serde::{Deserialize, Serialize};

use crate::builder::TypeTag;
use crate::data::Data;
use crate::logic::{DataflowError, OperatorContext, OperatorLogic, StateId};
use crate::ops::keyed_output;
use crate::state::{BatchStates, VALUE_STATE, ValueState};
use crate::window::{Window, WindowSpec};

/// Makes an empty accumulator.
type InitFn<A> = Box<dyn Fn() -> A + Send + Sync>;
/// Folds a value into an accumulator.
type AddFn<A, T> = Box<dyn Fn(&mut A, &T) + Send + Sync>;
/// Turns a window's accumulator into its result.
type FinishFn<K, A, O> = Box<dyn Fn(&K, Window, A) -> O + Send + Sync>;

/// The user's closures of one `aggregate`.
pub(crate) struct AggregateFns<K, T, A, O> {
    pub(crate) init: InitFn<A>,
    pub(crate) add: AddFn<A, T>,
    pub(crate) finish: FinishFn<K, A, O>,
}

/// One open window of a key.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Slot<A> {
    acc: A,
    /// Whether its result was emitted (then later updates re-emit it).
    fired: bool,
}

/// The open windows of one key, by start.
type OpenWindows<A> = BTreeMap<u64, Slot<A>>;

/// A window aggregation task.
pub(crate) struct WindowAggregateLogic<K, T, A, O> {
    fns: Arc<AggregateFns<K, T, A, O>>,
    spec: WindowSpec,
    lateness: u64,
    _types: TypeTag<(K, T, A, O)>,
}

impl<K, T, A, O> WindowAggregateLogic<K, T, A, O> {
    pub(crate) fn new(fns: Arc<AggregateFns<K, T, A, O>>, spec: WindowSpec, lateness: u64) -> Self {
        Self { fns, spec, lateness, _types: TypeTag::default() }
    }
}

/// Event time of a window's result: its last millisecond.
pub(crate) fn result_time(window: Window) -> Timestamp {
    window.end.saturating_sub(1)
}

impl<K: Data, T: Data, A: Data + Clone, O: Data> OperatorLogic for WindowAggregateLogic<K, T, A, O> {
    fn state_ids(&self) -> &[StateId] {
        &[VALUE_STATE]
    }

    fn on_records(
        &mut self,
        _input: usize,
        records: &[Record],
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), DataflowError> {
        let mut batch = BatchStates::with_capacity(records.len());
        let watermark = ctx.watermark;
        let passed = |time: Timestamp| watermark.is_some_and(|w| w >= time);
        for record in records {
            let value: T = decode(&record.value)?;
            let state = &*ctx.state;
            let (key, windows) = batch.entry(&record.key, || {
                let key: K = decode(&record.key)?;
                let windows = ValueState::<OpenWindows<A>>::load(state, VALUE_STATE, &record.key)?;
                Ok((key, windows))
            })?;
            for window in self.spec.windows_of(record.time) {
                let cleanup = window.end.saturating_add(self.lateness);
                if passed(cleanup) {
                    continue; // already fired and removed: too late even with the lateness
                }
                let open = windows.get_or_insert_default();
                let is_new = !open.contains_key(&window.start);
                let slot =
                    open.entry(window.start).or_insert_with(|| Slot { acc: (self.fns.init)(), fired: false });
                (self.fns.add)(&mut slot.acc, &value);
                if passed(window.end) {
                    // Late but allowed: the window's end timer has fired (or fires with this
                    // watermark); emit the updated result now.
                    slot.fired = true;
                    let result = (self.fns.finish)(key, window, slot.acc.clone());
                    ctx.output.push(keyed_output(&record.key, &result, result_time(window), record.due_ms)?);
                } else if is_new {
                    ctx.timers.push((record.key.clone(), window.end));
                }
                if is_new && cleanup != window.end {
                    ctx.timers.push((record.key.clone(), cleanup));
                }
            }
        }
        for (key, (_, windows)) in batch.into_entries() {
            windows.store(ctx.state, VALUE_STATE, key)?;
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        key_bytes: &[u8],
        time: Timestamp,
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), DataflowError> {
        let mut state = ValueState::<OpenWindows<A>>::load(&*ctx.state, VALUE_STATE, key_bytes)?;
        let fires_or_expires = |(start, slot): (&u64, &Slot<A>)| {
            let end = self.spec.window_at(*start).end;
            end <= time && (!slot.fired || end.saturating_add(self.lateness) <= time)
        };
        if !state.get().is_some_and(|open| open.iter().any(fires_or_expires)) {
            return Ok(()); // e.g. a duplicate timer: leave the state untouched
        }
        let Some(mut open) = state.take() else {
            return Ok(());
        };
        let key: K = decode(key_bytes)?;
        let due: Vec<u64> = open
            .iter()
            .filter(|(start, _)| self.spec.window_at(**start).end <= time)
            .map(|(start, _)| *start)
            .collect();
        for start in due {
            let window = self.spec.window_at(start);
            let expired = window.end.saturating_add(self.lateness) <= time;
            let result = if expired {
                match open.remove(&start) {
                    Some(slot) if !slot.fired => Some((self.fns.finish)(&key, window, slot.acc)),
                    _ => None,
                }
            } else {
                match open.get_mut(&start) {
                    Some(slot) if !slot.fired => {
                        slot.fired = true;
                        Some((self.fns.finish)(&key, window, slot.acc.clone()))
                    }
                    _ => None,
                }
            };
            if let Some(result) = result {
                ctx.output.push(keyed_output(key_bytes, &result, result_time(window), 0)?);
            }
        }
        if !open.is_empty() {
            state.set(open);
        }
        state.store(ctx.state, VALUE_STATE, key_bytes)
    }
}
