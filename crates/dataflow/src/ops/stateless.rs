//! Stateless per-record operators (map, filter, flat_map), erased to one byte-level closure.

use std::sync::Arc;

use koala_types::{Record, decode};

use crate::data::Data;
use crate::logic::{DataflowError, OperatorContext, OperatorLogic, StateId};
use crate::ops::keyed_output;

/// Turns one input record into zero or more output records.
type RecordFn = dyn Fn(&Record, &mut Vec<Record>) -> Result<(), DataflowError> + Send + Sync;

/// A stateless operator task: applies its record function to every record, in order.
#[derive(Clone)]
pub(crate) struct StatelessLogic {
    f: Arc<RecordFn>,
}

impl OperatorLogic for StatelessLogic {
    fn state_ids(&self) -> &[StateId] {
        &[]
    }

    fn on_records(
        &mut self,
        _input: usize,
        records: &[Record],
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), DataflowError> {
        for record in records {
            (self.f)(record, ctx.output)?;
        }
        Ok(())
    }
}

/// `map`: one output per input, same key, time and due time.
pub(crate) fn map_fn<T: Data, O: Data>(f: impl Fn(T) -> O + Send + Sync + 'static) -> StatelessLogic {
    StatelessLogic {
        f: Arc::new(move |r: &Record, out: &mut Vec<Record>| {
            let value: T = decode(&r.value)?;
            out.push(keyed_output(&r.key, &f(value), r.time, r.due_ms)?);
            Ok(())
        }),
    }
}

/// `filter`: forwards the input record unchanged (no re-encoding) when the predicate holds.
pub(crate) fn filter_fn<T: Data>(f: impl Fn(&T) -> bool + Send + Sync + 'static) -> StatelessLogic {
    StatelessLogic {
        f: Arc::new(move |r: &Record, out: &mut Vec<Record>| {
            let value: T = decode(&r.value)?;
            if f(&value) {
                out.push(r.clone());
            }
            Ok(())
        }),
    }
}

/// `flat_map`: every returned value becomes a record with the input's key, time and due time.
pub(crate) fn flat_map_fn<T: Data, O: Data, I: IntoIterator<Item = O>>(
    f: impl Fn(T) -> I + Send + Sync + 'static,
) -> StatelessLogic {
    StatelessLogic {
        f: Arc::new(move |r: &Record, out: &mut Vec<Record>| {
            let value: T = decode(&r.value)?;
            for o in f(value) {
                out.push(keyed_output(&r.key, &o, r.time, r.due_ms)?);
            }
            Ok(())
        }),
    }
}
