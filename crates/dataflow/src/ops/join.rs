//! Unwindowed keyed join logic: one list state per side (state ids 0 = left, 1 = right). Each
//! arriving value is joined with every stored value of the other side, then stored.

use std::sync::Arc;

use koala_types::{Record, decode};

use crate::builder::TypeTag;
use crate::data::Data;
use crate::logic::{DataflowError, OperatorContext, OperatorLogic, StateId};
use crate::ops::keyed_output;
use crate::state::{BatchStates, ListState};

/// State id of the stored left values.
const LEFT: StateId = 0;
/// State id of the stored right values.
const RIGHT: StateId = 1;

/// One key's decoded key and both sides within a batch.
struct KeySides<K, L, R> {
    key: K,
    left: ListState<L>,
    right: ListState<R>,
}

/// An unwindowed join task.
pub(crate) struct KeyedJoinLogic<K, L, R, O, F> {
    f: Arc<F>,
    _types: TypeTag<(K, L, R, O)>,
}

impl<K, L, R, O, F> KeyedJoinLogic<K, L, R, O, F> {
    pub(crate) fn new(f: Arc<F>) -> Self {
        Self { f, _types: TypeTag::default() }
    }
}

impl<K, L, R, O, F> OperatorLogic for KeyedJoinLogic<K, L, R, O, F>
where
    K: Data,
    L: Data,
    R: Data,
    O: Data,
    F: Fn(&K, &L, &R) -> O + Send + Sync + 'static,
{
    fn state_ids(&self) -> &[StateId] {
        &[LEFT, RIGHT]
    }

    fn on_records(
        &mut self,
        input: usize,
        records: &[Record],
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), DataflowError> {
        if input > 1 {
            return Err(DataflowError::Other(format!(
                "a join has inputs 0 and 1, got records on input {input}"
            )));
        }
        let mut batch = BatchStates::with_capacity(records.len());
        for record in records {
            let state = &*ctx.state;
            let sides = batch.entry(&record.key, || {
                Ok(KeySides::<K, L, R> {
                    key: decode(&record.key)?,
                    left: ListState::load(state, LEFT, &record.key)?,
                    right: ListState::load(state, RIGHT, &record.key)?,
                })
            })?;
            if input == 0 {
                let l: L = decode(&record.value)?;
                for r in sides.right.items() {
                    let out = (self.f)(&sides.key, &l, r);
                    ctx.output.push(keyed_output(&record.key, &out, record.time, record.due_ms)?);
                }
                sides.left.push(l);
            } else {
                let r: R = decode(&record.value)?;
                for l in sides.left.items() {
                    let out = (self.f)(&sides.key, l, &r);
                    ctx.output.push(keyed_output(&record.key, &out, record.time, record.due_ms)?);
                }
                sides.right.push(r);
            }
        }
        for (key, sides) in batch.into_entries() {
            sides.left.store(ctx.state, LEFT, key)?;
            sides.right.store(ctx.state, RIGHT, key)?;
        }
        Ok(())
    }
}
