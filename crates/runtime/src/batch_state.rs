//! Per-batch state access (docs/architecture.md §5): fetch each distinct key once, let the
//! operator read and write in input order, write back only what changed.
//!
//! The map borrows the keys from the batch's records (or due timers), so looking a key up
//! allocates nothing; the one owned copy of a key is the [`StateKey`] the store reads and writes
//! with, and its bucket is hashed once per distinct key.

use koala_dataflow::DataflowError;
use koala_dataflow::logic::{KeyedStateAccess, StateId};
use koala_state::{StateBackend, StateKey, StateWrite};
use koala_types::{CodecError, KeyHashMap, bucket_of};

use crate::RuntimeError;

#[derive(Debug)]
struct Slot {
    key: StateKey,
    value: Option<Vec<u8>>,
    dirty: bool,
}

/// The state of the keys of one batch (or of one round of timers), borrowing the keys.
#[derive(Debug, Default)]
pub struct BatchState<'k> {
    /// Per state id (an operator has one or two), user key → index in `slots`.
    index: Vec<(StateId, KeyHashMap<&'k [u8], usize>)>,
    slots: Vec<Slot>,
}

/// What a fetch and write-back cost, for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct StateIo {
    /// Entries read.
    pub reads: u64,
    /// Entries written or deleted.
    pub writes: u64,
}

impl<'k> BatchState<'k> {
    /// Fetches every (state id, key) pair of `keys` × `state_ids` in one batched read.
    pub fn fetch(
        store: &dyn StateBackend,
        num_buckets: u16,
        state_ids: &[StateId],
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<(Self, StateIo), RuntimeError> {
        let keys = keys.into_iter();
        // Sized for every key distinct (uniform keys), so a batch never rehashes.
        let expected = keys.size_hint().0;
        let mut index: Vec<(StateId, KeyHashMap<&'k [u8], usize>)> = state_ids
            .iter()
            .map(|&id| (id, KeyHashMap::with_capacity_and_hasher(expected, Default::default())))
            .collect();
        let mut wanted: Vec<StateKey> = Vec::with_capacity(expected * state_ids.len());
        for key in keys {
            let mut bucket = None;
            for (state, map) in &mut index {
                if let std::collections::hash_map::Entry::Vacant(slot) = map.entry(key) {
                    slot.insert(wanted.len());
                    let bucket = *bucket.get_or_insert_with(|| bucket_of(key, num_buckets));
                    wanted.push(StateKey { bucket, state: *state, key: key.to_vec() });
                }
            }
        }
        let values = if wanted.is_empty() { Vec::new() } else { store.get_many(&wanted)? };
        let reads = wanted.len() as u64;
        let slots =
            wanted.into_iter().zip(values).map(|(key, value)| Slot { key, value, dirty: false }).collect();
        Ok((Self { index, slots }, StateIo { reads, writes: 0 }))
    }

    /// Writes back the entries the operator changed.
    pub fn write_back(self, store: &dyn StateBackend) -> Result<StateIo, RuntimeError> {
        let writes: Vec<StateWrite> = self
            .slots
            .into_iter()
            .filter(|slot| slot.dirty)
            .map(|slot| match slot.value {
                Some(v) => StateWrite::Put(slot.key, v),
                None => StateWrite::Delete(slot.key),
            })
            .collect();
        let n = writes.len() as u64;
        if n > 0 {
            store.write_many(writes)?;
        }
        Ok(StateIo { reads: 0, writes: n })
    }

    fn position(&self, state: StateId, key: &[u8]) -> Result<usize, DataflowError> {
        self.index
            .iter()
            .find(|(id, _)| *id == state)
            .and_then(|(_, map)| map.get(key).copied())
            .ok_or_else(|| DataflowError::StateNotFetched { state, key: key.to_vec() })
    }

    fn slot(&mut self, state: StateId, key: &[u8]) -> Result<&mut Slot, DataflowError> {
        let at = self.position(state, key)?;
        self.slots.get_mut(at).ok_or_else(|| DataflowError::StateNotFetched { state, key: key.to_vec() })
    }
}

impl KeyedStateAccess for BatchState<'_> {
    fn get(&self, state: StateId, key: &[u8]) -> Result<Option<&[u8]>, DataflowError> {
        let at = self.position(state, key)?;
        self.slots
            .get(at)
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

    /// Encodes into the buffer of the value read for the key (cleared), if it had one. An
    /// encoding error fails the batch, and a failed batch writes nothing back.
    fn put_encoded(
        &mut self,
        state: StateId,
        key: &[u8],
        encode: &mut dyn FnMut(&mut Vec<u8>) -> Result<(), CodecError>,
    ) -> Result<(), DataflowError> {
        let slot = self.slot(state, key)?;
        let mut value = slot.value.take().unwrap_or_default();
        value.clear();
        encode(&mut value)?;
        slot.value = Some(value);
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

#[cfg(test)]
mod tests {
    use super::*;
    use koala_state::{MemoryEnv, StateEnv};
    use koala_types::{OperatorId, TaskId};

    #[test]
    fn each_distinct_key_is_read_once_and_only_changes_are_written() -> Result<(), Box<dyn std::error::Error>>
    {
        let store = MemoryEnv::new().open_task(TaskId::new(OperatorId(1), 0))?;
        let bucket = |k: &[u8]| bucket_of(k, 8);
        store.write_many(vec![
            StateWrite::Put(StateKey::new(bucket(b"a"), 0, b"a".to_vec()), b"1".to_vec()),
            StateWrite::Put(StateKey::new(bucket(b"b"), 0, b"b".to_vec()), b"2".to_vec()),
        ])?;
        let keys: Vec<&[u8]> = vec![b"a", b"b", b"a", b"c"];
        let (mut state, io) = BatchState::fetch(store.as_ref(), 8, &[0, 1], keys)?;
        assert_eq!(io.reads, 6, "3 distinct keys × 2 state ids");
        assert_eq!(state.get(0, b"a")?, Some(b"1".as_slice()));
        assert_eq!(state.get(1, b"a")?, None);
        assert!(matches!(state.get(0, b"z"), Err(DataflowError::StateNotFetched { .. })));
        assert!(matches!(state.put(2, b"a", Vec::new()), Err(DataflowError::StateNotFetched { .. })));
        state.put(0, b"c", b"3".to_vec())?;
        state.delete(0, b"b")?;
        assert_eq!(state.write_back(store.as_ref())?.writes, 2);
        let read = |k: &[u8]| StateKey::new(bucket(k), 0, k.to_vec());
        assert_eq!(
            store.get_many(&[read(b"a"), read(b"b"), read(b"c")])?,
            vec![Some(b"1".to_vec()), None, Some(b"3".to_vec())]
        );
        Ok(())
    }

    /// An encoded put reuses the buffer of the value it replaces, and is written back like a put;
    /// a failed encoding marks nothing dirty.
    #[test]
    fn an_encoded_put_reuses_the_read_value_buffer() -> Result<(), Box<dyn std::error::Error>> {
        let store = MemoryEnv::new().open_task(TaskId::new(OperatorId(1), 0))?;
        let key = |k: &[u8]| StateKey::new(bucket_of(k, 8), 0, k.to_vec());
        store.write_many(vec![StateWrite::Put(key(b"a"), koala_types::encode(&1u64)?)])?;
        let keys: Vec<&[u8]> = vec![b"a", b"b"];
        let (mut state, _) = BatchState::fetch(store.as_ref(), 8, &[0], keys)?;
        let before = state.get(0, b"a")?.map(<[u8]>::as_ptr);
        state.put_encoded(0, b"a", &mut |buf| koala_types::encode_into(&2u64, buf))?;
        assert_eq!(state.get(0, b"a")?.map(<[u8]>::as_ptr), before, "the read value's buffer");
        let failing = &mut |_: &mut Vec<u8>| koala_types::decode::<u64>(&[]).map(|_| ());
        assert!(matches!(state.put_encoded(0, b"b", failing), Err(DataflowError::Codec(_))));
        assert_eq!(state.write_back(store.as_ref())?.writes, 1, "only the encoded put");
        assert_eq!(store.get_many(&[key(b"a"), key(b"b")])?, vec![Some(koala_types::encode(&2u64)?), None]);
        Ok(())
    }
}
