//! The erased [`crate::logic::OperatorLogic`] implementations behind the typed operators: each
//! decodes records, calls the user's closures and encodes what they return. Not public: users
//! reach them through [`crate::Stream`] and [`crate::KeyedStream`].

pub(crate) mod join;
pub(crate) mod keyed_process;
pub(crate) mod stateless;
pub(crate) mod timer_process;
pub(crate) mod window_aggregate;
pub(crate) mod window_join;

use koala_types::{Record, encode};
use serde::Serialize;

use crate::logic::DataflowError;

/// Encodes `value` into a record that keeps the input's key (keyed outputs keep their key) and
/// the due time of the input record that produced it (timer outputs: 0 here, the runner stamps
/// them, [`crate::logic::OperatorLogic::on_timer`]).
pub(crate) fn keyed_output<O: Serialize>(
    key: &[u8],
    value: &O,
    time: u64,
    due_ms: u64,
) -> Result<Record, DataflowError> {
    Ok(Record { key: key.to_vec(), value: encode(value)?, time, due_ms })
}

#[cfg(test)]
mod tests;
