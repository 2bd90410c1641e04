//! Stores that keep nothing: every read misses and every write is dropped. `[state] backend =
//! "none"` runs a job's pipeline exactly as with state, minus the store, which makes it the
//! ceiling `koala bench` compares the real backends with. Results of stateful operators are wrong
//! by design; never use it for anything but measuring.

use koala_types::{BucketId, TaskId};

use crate::{ScanSink, StateBackend, StateEnv, StateError, StateKey, StateWrite};

/// An env whose stores keep nothing (see the module docs).
#[derive(Debug, Default)]
pub struct DiscardEnv;

impl StateEnv for DiscardEnv {
    fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError> {
        Ok(Box::new(DiscardBackend { task }))
    }

    fn drop_task(&self, _task: TaskId) -> Result<(), StateError> {
        Ok(())
    }

    fn persist(&self) -> Result<(), StateError> {
        Ok(())
    }
}

#[derive(Debug)]
struct DiscardBackend {
    task: TaskId,
}

impl StateBackend for DiscardBackend {
    fn task(&self) -> TaskId {
        self.task
    }

    fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        Ok(vec![None; keys.len()])
    }

    fn write_many(&self, _writes: Vec<StateWrite>) -> Result<(), StateError> {
        Ok(())
    }

    fn scan_buckets(&self, _: &[BucketId], _: usize, _: ScanSink<'_>) -> Result<u64, StateError> {
        Ok(0)
    }

    fn bucket_keys_after(
        &self,
        _: BucketId,
        _: Option<&StateKey>,
        _: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        Ok(Vec::new())
    }

    fn delete_buckets(&self, _: &[BucketId]) -> Result<(), StateError> {
        Ok(())
    }

    fn approximate_len(&self) -> Result<u64, StateError> {
        Ok(0)
    }
}
