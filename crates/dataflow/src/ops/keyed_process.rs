//! The one logic behind all keyed stateful record operators: per record, decode the key and the
//! value, hand the key's value state and list state to the user's closure, emit what it returns;
//! at the end of the batch write back the states that changed.

use std::marker::PhantomData;
use std::sync::Arc;

use koala_types::{Record, decode};

use crate::data::Data;
use crate::logic::{DataflowError, OperatorContext, OperatorLogic, StateId};
use crate::ops::keyed_output;
use crate::state::{BatchStates, LIST_STATE, ListState, VALUE_STATE, ValueState};

/// The user's closure, in its most general shape.
pub(crate) type ProcessFn<K, T, S, L, O> =
    dyn Fn(&K, T, &mut ValueState<S>, &mut ListState<L>, &mut Vec<O>) + Send + Sync;

/// Which of the two states an operator declared (only declared states are fetched).
#[derive(Clone, Copy, Debug)]
pub(crate) enum StateShape {
    /// Value state only.
    Value,
    /// List state only.
    List,
    /// Both.
    ValueAndList,
}

impl StateShape {
    fn ids(self) -> &'static [StateId] {
        match self {
            Self::Value => &[VALUE_STATE],
            Self::List => &[LIST_STATE],
            Self::ValueAndList => &[VALUE_STATE, LIST_STATE],
        }
    }

    fn has_value(self) -> bool {
        matches!(self, Self::Value | Self::ValueAndList)
    }

    fn has_list(self) -> bool {
        matches!(self, Self::List | Self::ValueAndList)
    }
}

/// One key's decoded key and states within a batch.
struct KeyEntry<K, S, L> {
    key: K,
    value: ValueState<S>,
    list: ListState<L>,
}

/// A keyed stateful operator task.
pub(crate) struct KeyedProcessLogic<K, T, S, L, O> {
    f: Arc<ProcessFn<K, T, S, L, O>>,
    shape: StateShape,
    out: Vec<O>,
    _input: PhantomData<fn(T)>,
}

impl<K, T, S, L, O> KeyedProcessLogic<K, T, S, L, O> {
    pub(crate) fn new(f: Arc<ProcessFn<K, T, S, L, O>>, shape: StateShape) -> Self {
        Self { f, shape, out: Vec::new(), _input: PhantomData }
    }
}

impl<K: Data, T: Data, S: Data, L: Data, O: Data> OperatorLogic for KeyedProcessLogic<K, T, S, L, O> {
    fn state_ids(&self) -> &[StateId] {
        self.shape.ids()
    }

    fn on_records(
        &mut self,
        _input: usize,
        records: &[Record],
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), DataflowError> {
        let shape = self.shape;
        let mut batch = BatchStates::with_capacity(records.len());
        for record in records {
            let value: T = decode(&record.value)?;
            let state = &*ctx.state;
            let entry = batch.entry(&record.key, || {
                Ok(KeyEntry::<K, S, L> {
                    key: decode(&record.key)?,
                    value: if shape.has_value() {
                        ValueState::load(state, VALUE_STATE, &record.key)?
                    } else {
                        ValueState::new(None)
                    },
                    list: if shape.has_list() {
                        ListState::load(state, LIST_STATE, &record.key)?
                    } else {
                        ListState::new(Vec::new())
                    },
                })
            })?;
            (self.f)(&entry.key, value, &mut entry.value, &mut entry.list, &mut self.out);
            for o in self.out.drain(..) {
                ctx.output.push(keyed_output(&record.key, &o, record.time, record.due_ms)?);
            }
        }
        for (key, entry) in batch.into_entries() {
            // The typed wrappers never hand an undeclared state to the closure.
            debug_assert!(shape.has_value() || !entry.value.is_changed());
            debug_assert!(shape.has_list() || !entry.list.is_changed());
            if shape.has_value() {
                entry.value.store(ctx.state, VALUE_STATE, key)?;
            }
            if shape.has_list() {
                entry.list.store(ctx.state, LIST_STATE, key)?;
            }
        }
        Ok(())
    }
}
