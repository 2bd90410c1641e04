//! Per-batch state access (docs/architecture.md §5): fetch each distinct key once, let the
//! operator read and write in input order, write back only what changed.

use std::collections::HashMap;

use koala_dataflow::DataflowError;
use koala_dataflow::logic::{KeyedStateAccess, StateId};
use koala_state::{StateBackend, StateKey, StateWrite};
use koala_types::bucket_of;

use crate::RuntimeError;

#[derive(Debug)]
struct Slot {
    value: Option<Vec<u8>>,
    dirty: bool,
}

/// The state of the keys of one batch (or of one round of timers).
#[derive(Debug, Default)]
pub struct BatchState {
    slots: HashMap<(StateId, Vec<u8>), Slot>,
}

/// What a fetch and write-back cost, for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct StateIo {
    /// Entries read.
    pub reads: u64,
    /// Entries written or deleted.
    pub writes: u64,
}

impl BatchState {
    /// Fetches every (state id, key) pair of `keys` × `state_ids` in one batched read.
    pub fn fetch<'k>(
        store: &dyn StateBackend,
        num_buckets: u16,
        state_ids: &[StateId],
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<(Self, StateIo), RuntimeError> {
        let mut wanted: Vec<StateKey> = Vec::new();
        let mut slots = HashMap::new();
        for key in keys {
            for &state in state_ids {
                if slots.contains_key(&(state, key.to_vec())) {
                    continue;
                }
                slots.insert((state, key.to_vec()), Slot { value: None, dirty: false });
                wanted.push(StateKey { bucket: bucket_of(key, num_buckets), state, key: key.to_vec() });
            }
        }
        let values = if wanted.is_empty() { Vec::new() } else { store.get_many(&wanted)? };
        let reads = wanted.len() as u64;
        for (k, v) in wanted.into_iter().zip(values) {
            if let Some(slot) = slots.get_mut(&(k.state, k.key)) {
                slot.value = v;
            }
        }
        Ok((Self { slots }, StateIo { reads, writes: 0 }))
    }

    /// Writes back the entries the operator changed.
    pub fn write_back(self, store: &dyn StateBackend, num_buckets: u16) -> Result<StateIo, RuntimeError> {
        let writes: Vec<StateWrite> = self
            .slots
            .into_iter()
            .filter(|(_, slot)| slot.dirty)
            .map(|((state, key), slot)| {
                let sk = StateKey { bucket: bucket_of(&key, num_buckets), state, key };
                match slot.value {
                    Some(v) => StateWrite::Put(sk, v),
                    None => StateWrite::Delete(sk),
                }
            })
            .collect();
        let n = writes.len() as u64;
        if n > 0 {
            store.write_many(writes)?;
        }
        Ok(StateIo { reads: 0, writes: n })
    }

    fn slot(&mut self, state: StateId, key: &[u8]) -> Result<&mut Slot, DataflowError> {
        self.slots
            .get_mut(&(state, key.to_vec()))
            .ok_or_else(|| DataflowError::StateNotFetched { state, key: key.to_vec() })
    }
}

impl KeyedStateAccess for BatchState {
    fn get(&self, state: StateId, key: &[u8]) -> Result<Option<&[u8]>, DataflowError> {
        self.slots
            .get(&(state, key.to_vec()))
            .map(|s| s.value.as_deref())
            .ok_or_else(|| DataflowError::StateNotFetched { state, key: key.to_vec() })
    }

    fn put(&mut self, state: StateId, key: &[u8], value: Vec<u8>) -> Result<(), DataflowError> {
        let slot = self.slot(state, key)?;
        slot.value = Some(value);
        slot.dirty = true;
        Ok(())
    }

    fn delete(&mut self, state: StateId, key: &[u8]) -> Result<(), DataflowError> {
        let slot = self.slot(state, key)?;
        slot.value = None;
        slot.dirty = true;
        Ok(())
    }
}

/// State access for stateless operators: every access is a bug in the operator.
pub struct NoState;

impl KeyedStateAccess for NoState {
    fn get(&self, state: StateId, key: &[u8]) -> Result<Option<&[u8]>, DataflowError> {
        Err(DataflowError::StateNotFetched { state, key: key.to_vec() })
    }
    fn put(&mut self, state: StateId, key: &[u8], _: Vec<u8>) -> Result<(), DataflowError> {
        Err(DataflowError::StateNotFetched { state, key: key.to_vec() })
    }
    fn delete(&mut self, state: StateId, key: &[u8]) -> Result<(), DataflowError> {
        Err(DataflowError::StateNotFetched { state, key: key.to_vec() })
    }
}
