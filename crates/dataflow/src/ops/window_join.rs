//! Window join logic: per key one value state with, per open window, the buffered values of both
//! sides in arrival order. The window's end timer emits all pairs and drops the window.

use std::collections::BTreeMap;
use std::sync::Arc;

use koala_types::{Record, Timestamp, decode};
use serde::{Deserialize, Serialize};

use crate::builder::TypeTag;
use crate::data::Data;
use crate::logic::{DataflowError, OperatorContext, OperatorLogic, StateId};
use crate::ops::keyed_output;
use crate::ops::window_aggregate::result_time;
use crate::state::{BatchStates, VALUE_STATE, ValueState};
use crate::window::{Window, WindowSpec};

/// The user's pair function.
pub(crate) type WindowJoinFn<K, L, R, O> = dyn Fn(&K, Window, &L, &R) -> O + Send + Sync;

/// Both sides of one window of one key.
#[derive(Debug, Serialize, Deserialize)]
struct Buffers<L, R> {
    left: Vec<L>,
    right: Vec<R>,
}

impl<L, R> Default for Buffers<L, R> {
    fn default() -> Self {
        Self { left: Vec::new(), right: Vec::new() }
    }
}

/// The open windows of one key, by start.
type OpenWindows<L, R> = BTreeMap<u64, Buffers<L, R>>;

/// A window join task.
pub(crate) struct WindowJoinLogic<K, L, R, O> {
    f: Arc<WindowJoinFn<K, L, R, O>>,
    spec: WindowSpec,
    _types: TypeTag<(K, L, R, O)>,
}

impl<K, L, R, O> WindowJoinLogic<K, L, R, O> {
    pub(crate) fn new(f: Arc<WindowJoinFn<K, L, R, O>>, spec: WindowSpec) -> Self {
        Self { f, spec, _types: TypeTag::default() }
    }
}

impl<K: Data, L: Data, R: Data, O: Data> OperatorLogic for WindowJoinLogic<K, L, R, O> {
    fn state_ids(&self) -> &[StateId] {
        &[VALUE_STATE]
    }

    fn on_records(
        &mut self,
        input: usize,
        records: &[Record],
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), DataflowError> {
        if input > 1 {
            return Err(DataflowError::Other(format!(
                "a window join has inputs 0 and 1, got records on input {input}"
            )));
        }
        let watermark = ctx.watermark;
        let mut batch = BatchStates::with_capacity(records.len());
        for record in records {
            let state = &*ctx.state;
            let windows = batch.entry(&record.key, || {
                ValueState::<OpenWindows<L, R>>::load(state, VALUE_STATE, &record.key)
            })?;
            for window in self.spec.windows_of(record.time) {
                if watermark.is_some_and(|w| w >= window.end) {
                    continue; // the window has fired: the record is too late for it
                }
                let open = windows.get_or_insert_default();
                let is_new = !open.contains_key(&window.start);
                let buffers = open.entry(window.start).or_default();
                // Decoded per window: a value of a sliding window is stored once per window.
                if input == 0 {
                    buffers.left.push(decode(&record.value)?);
                } else {
                    buffers.right.push(decode(&record.value)?);
                }
                if is_new {
                    ctx.timers.push((record.key.clone(), window.end));
                }
            }
        }
        for (key, windows) in batch.into_entries() {
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
        let mut state = ValueState::<OpenWindows<L, R>>::load(&*ctx.state, VALUE_STATE, key_bytes)?;
        let is_due = |start: &u64| self.spec.window_at(*start).end <= time;
        if !state.get().is_some_and(|open| open.keys().any(is_due)) {
            return Ok(()); // e.g. a duplicate timer: leave the state untouched
        }
        let Some(mut open) = state.take() else {
            return Ok(());
        };
        let key: K = decode(key_bytes)?;
        let due: Vec<u64> = open.keys().copied().filter(is_due).collect();
        for start in due {
            let window = self.spec.window_at(start);
            let Some(buffers) = open.remove(&start) else {
                continue;
            };
            for l in &buffers.left {
                for r in &buffers.right {
                    let pair = (self.f)(&key, window, l, r);
                    ctx.output.push(keyed_output(key_bytes, &pair, result_time(window), 0)?);
                }
            }
        }
        if !open.is_empty() {
            state.set(open);
        }
        state.store(ctx.state, VALUE_STATE, key_bytes)
    }
}
