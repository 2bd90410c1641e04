//! Random sequences of write batches, bucket deletes and reads leave every backend — fjall, fjall
//! behind a write-back cache (tiny, so entries are evicted all the time, and large, so nothing
//! is), memory — equal to a simple ordered-map model (gets, scans in key order, chunk limits,
//! key-only scans in pages). Reads in the middle of a sequence make the cache write back and
//! then serve entries that later writes and deletes change.

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::atomic::{AtomicU32, Ordering};

use koala_state::{
    CachedEnv, ENTRY_OVERHEAD_BYTES, FjallEnv, MemoryEnv, StateBackend, StateEnv, StateKey, StateWrite,
};
use koala_types::{OperatorId, TaskId};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

#[derive(Clone, Debug)]
enum Op {
    Write(Vec<StateWrite>),
    DeleteBuckets(Vec<u16>),
    /// Reads one bucket mid-sequence: its values, then its keys (key-only scan).
    Read(u16),
}

fn state_key() -> impl Strategy<Value = StateKey> {
    // Mostly short keys (kept inline in memory), some longer than the inline size (26 bytes).
    let long = proptest::collection::vec(0u8..4, 1..3).prop_map(|tail| [vec![0; 26], tail].concat());
    let user_key = prop_oneof![4 => proptest::collection::vec(0u8..4, 0..3), 1 => long];
    (0u16..6, 0u8..2, user_key).prop_map(|(bucket, state, key)| StateKey { bucket, state, key })
}

fn op() -> impl Strategy<Value = Op> {
    let write = prop_oneof![
        3 => (state_key(), proptest::collection::vec(any::<u8>(), 0..24))
            .prop_map(|(k, v)| StateWrite::Put(k, v)),
        1 => state_key().prop_map(StateWrite::Delete),
    ];
    prop_oneof![
        4 => proptest::collection::vec(write, 0..12).prop_map(Op::Write),
        1 => proptest::collection::vec(0u16..7, 0..3).prop_map(Op::DeleteBuckets),
        2 => (0u16..7).prop_map(Op::Read),
    ]
}

fn apply(model: &mut BTreeMap<StateKey, Vec<u8>>, op: &Op) {
    match op {
        Op::Write(writes) => {
            for write in writes {
                match write {
                    StateWrite::Put(k, v) => model.insert(k.clone(), v.clone()),
                    StateWrite::Delete(k) => model.remove(k),
                };
            }
        }
        Op::DeleteBuckets(buckets) => model.retain(|k, _| !buckets.contains(&k.bucket)),
        Op::Read(_) => {}
    }
}

fn check(
    store: &dyn StateBackend,
    ops: &[Op],
    chunk_bytes: usize,
    exact_len: bool,
) -> Result<(), TestCaseError> {
    let fail = |e: koala_state::StateError| TestCaseError::fail(e.to_string());
    let mut model = BTreeMap::new();
    for op in ops {
        apply(&mut model, op);
        match op {
            Op::Write(writes) => store.write_many(writes.clone()).map_err(fail)?,
            Op::DeleteBuckets(buckets) => store.delete_buckets(buckets).map_err(fail)?,
            Op::Read(bucket) => {
                // Every key ever written to the bucket, present or not, then the key-only scan.
                let probes: Vec<StateKey> = ops
                    .iter()
                    .filter_map(|op| match op {
                        Op::Write(writes) => Some(writes.iter().map(|w| w.key().clone())),
                        _ => None,
                    })
                    .flatten()
                    .filter(|k| k.bucket == *bucket)
                    .collect();
                let expected: Vec<Option<Vec<u8>>> = probes.iter().map(|k| model.get(k).cloned()).collect();
                prop_assert_eq!(store.get_many(&probes).map_err(fail)?, expected);
                let keys: Vec<StateKey> = model.keys().filter(|k| k.bucket == *bucket).cloned().collect();
                prop_assert_eq!(store.bucket_keys_after(*bucket, None, usize::MAX).map_err(fail)?, keys);
            }
        }
    }
    let probes: Vec<StateKey> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Write(writes) => Some(writes.iter().map(|w| w.key().clone())),
            Op::DeleteBuckets(_) | Op::Read(_) => None,
        })
        .flatten()
        .collect();
    let expected: Vec<Option<Vec<u8>>> = probes.iter().map(|k| model.get(k).cloned()).collect();
    prop_assert_eq!(store.get_many(&probes).map_err(fail)?, expected);

    // Key-only scans, in pages, from the start and from a position that need not be stored.
    for bucket in 0..7u16 {
        let in_bucket: Vec<&StateKey> = model.keys().filter(|k| k.bucket == bucket).collect();
        for (page, after) in [(1, None), (3, None), (2, Some(StateKey::new(bucket, 1, vec![1])))] {
            let mut keys = Vec::new();
            let mut at = after.clone();
            loop {
                let got = store.bucket_keys_after(bucket, at.as_ref(), page).map_err(fail)?;
                prop_assert!(got.len() <= page);
                let end = got.len() < page;
                at = got.last().cloned().or(at);
                keys.extend(got);
                if end {
                    break;
                }
            }
            let expected: Vec<StateKey> = in_bucket
                .iter()
                .filter(|k| after.as_ref().is_none_or(|a| **k > a))
                .map(|k| (*k).clone())
                .collect();
            prop_assert_eq!(keys, expected, "bucket {} in pages of {} after {:?}", bucket, page, after);
        }
    }

    let mut scanned = Vec::new();
    let mut oversized = false;
    let total = store
        .scan_buckets(&[5, 0, 1, 2, 3, 4, 6], chunk_bytes, &mut |chunk| {
            let size: usize = chunk.iter().map(|(k, v)| k.encoded_len() + v.len()).sum();
            oversized |= chunk.is_empty() || (size > chunk_bytes && chunk.len() > 1);
            scanned.extend(chunk);
            Ok(())
        })
        .map_err(fail)?;
    prop_assert!(!oversized, "a chunk broke the size limit");
    let expected: Vec<(StateKey, Vec<u8>)> = model.into_iter().collect();
    let expected_bytes: usize = expected.iter().map(|(k, v)| k.encoded_len() + v.len()).sum();
    prop_assert_eq!(total, expected_bytes as u64);
    if exact_len {
        prop_assert_eq!(store.approximate_len().map_err(fail)?, expected.len() as u64);
    }
    prop_assert_eq!(scanned, expected);
    Ok(())
}

#[test]
fn random_batches_match_model() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let fjall = FjallEnv::open(dir.path().join("plain"))?;
    // Room for about three entries: nearly every write evicts.
    let tiny = CachedEnv::new(FjallEnv::open(dir.path().join("tiny"))?, 3 * (ENTRY_OVERHEAD_BYTES + 16));
    let large = CachedEnv::new(FjallEnv::open(dir.path().join("large"))?, 64 << 20);
    let memory = MemoryEnv::new();
    let case = AtomicU32::new(0);
    let mut runner = TestRunner::new(Config::with_cases(64));
    let strategy = (proptest::collection::vec(op(), 0..16), 0usize..80);
    runner.run(&strategy, |(ops, chunk_bytes)| {
        // A fresh task per case: cheap on fjall (a keyspace), and exercises many stores in one dir.
        let task = TaskId::new(OperatorId(case.fetch_add(1, Ordering::Relaxed)), 0);
        let open = |env: &dyn StateEnv| env.open_task(task).map_err(|e| TestCaseError::fail(e.to_string()));
        check(open(&memory)?.as_ref(), &ops, chunk_bytes, true)?;
        check(open(&fjall)?.as_ref(), &ops, chunk_bytes, false)?;
        check(open(&tiny)?.as_ref(), &ops, chunk_bytes, false)?;
        check(open(&large)?.as_ref(), &ops, chunk_bytes, false)?;
        Ok(())
    })?;
    Ok(())
}
