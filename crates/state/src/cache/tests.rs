use super::entries::Line;
use super::*;
use crate::MemoryEnv;
use koala_types::OperatorId;

fn key(bucket: BucketId, user: u32) -> StateKey {
    StateKey::new(bucket, 0, user.to_be_bytes().to_vec())
}

#[test]
fn the_cache_stays_within_its_budget_and_writes_back_dirty_victims() -> Result<(), StateError> {
    let budget = 100 * (ENTRY_OVERHEAD_BYTES + 16);
    let env = CachedEnv::new(MemoryEnv::new(), budget);
    let task = TaskId::new(OperatorId(1), 0);
    let store = env.open_task(task)?;
    let below = env.inner().open_task(task)?;
    for i in 0..1000u32 {
        store.write_many(vec![StateWrite::Put(key(1, i), i.to_le_bytes().to_vec())])?;
        // Dirty victims stay charged while in flight: up to 1/16 of the budget more.
        let cache = store_cache(&env, task)?;
        assert!(cache <= budget + budget / 16, "cache holds {cache} bytes, budget {budget}");
    }
    // Most entries were evicted, so written below; all are readable through the cache.
    let written_below = below.approximate_len()?;
    assert!(written_below >= 800, "only {written_below} entries written back");
    let keys: Vec<StateKey> = (0..1000).map(|i| key(1, i)).collect();
    let values = store.get_many(&keys)?;
    assert!(values.iter().enumerate().all(|(i, v)| *v == Some((i as u32).to_le_bytes().to_vec())));
    // Nothing reaches the inner store before eviction or a bucket scan; a key-only page lists
    // the cached key without writing it back.
    store.write_many(vec![StateWrite::Put(key(2, 0), b"x".to_vec())])?;
    assert_eq!(below.get_many(&[key(2, 0)])?, vec![None]);
    assert_eq!(store.bucket_keys_after(2, None, 10)?, vec![key(2, 0)]);
    assert_eq!(below.get_many(&[key(2, 0)])?, vec![None]);
    store.scan_buckets(&[2], 1 << 20, &mut |_| Ok(()))?;
    assert_eq!(below.get_many(&[key(2, 0)])?, vec![Some(b"x".to_vec())]);
    Ok(())
}

#[test]
fn a_shrink_writes_dirty_entries_back_and_never_loses_one() -> Result<(), StateError> {
    let env = CachedEnv::new(MemoryEnv::new(), 64 << 20);
    let task = TaskId::new(OperatorId(1), 0);
    let store = env.open_task(task)?;
    let below = env.inner().open_task(task)?;
    // 20 000 dirty entries of ~230 charged bytes each (~4.4 MiB), none below yet.
    let n = 20_000u32;
    let value = |i: u32| [i.to_le_bytes().as_slice(), &[7; 36]].concat();
    store.write_many((0..n).map(|i| StateWrite::Put(key((i % 128) as u16, i), value(i))).collect())?;
    assert_eq!(below.approximate_len()?, 0);
    // The worker's re-split at a reconfiguration: the task's share drops to 1 MiB.
    assert!(env.set_cache_budget(task, MIN_BUDGET_BYTES)?);
    {
        let tasks = env.tasks("test")?;
        let shared = tasks.get(&task).ok_or(StateError::Dropped { task, op: "test" })?;
        let cache = shared.idle(shared.lock("test")?, "test")?;
        assert_eq!(cache.capacity, MIN_BUDGET_BYTES);
        // The entries fit the new budget (the written-keys filters, charged too, grew by the
        // keys written back: up to a quarter of the budget more).
        assert!(cache.bytes <= MIN_BUDGET_BYTES, "{} bytes of entries after the shrink", cache.bytes);
    }
    // What left the cache was written below, not dropped: every key is below or still
    // dirty here, and every value reads back.
    let written_below = below.approximate_len()?;
    assert!(written_below >= u64::from(n) / 2, "only {written_below} of {n} entries written back");
    let keys: Vec<StateKey> = (0..n).map(|i| key((i % 128) as u16, i)).collect();
    let read = store.get_many(&keys)?;
    let lost = (0..n).filter(|&i| read[i as usize].as_deref() != Some(value(i).as_slice())).count();
    assert_eq!(lost, 0, "{lost} entries lost by the shrink");
    // A task opened after its budget was set starts with it.
    let later = TaskId::new(OperatorId(1), 1);
    env.set_cache_budget(later, 3 << 20)?;
    env.open_task(later)?;
    let tasks = env.tasks("test")?;
    let shared = tasks.get(&later).ok_or(StateError::Dropped { task: later, op: "test" })?;
    assert_eq!(shared.lock("test")?.capacity, 3 << 20);
    Ok(())
}

#[test]
fn key_pages_merge_dirty_entries_with_the_store_below() -> Result<(), StateError> {
    let env = CachedEnv::new(MemoryEnv::new(), 1 << 20);
    let task = TaskId::new(OperatorId(1), 0);
    let store = env.open_task(task)?;
    let below = env.inner().open_task(task)?;
    // Keys 0, 2, …, 18 of bucket 3 below (a bucket scan writes them back), clean here.
    store.write_many((0..10).map(|i| StateWrite::Put(key(3, 2 * i), vec![1])).collect())?;
    store.scan_buckets(&[3], 1 << 20, &mut |_| Ok(()))?;
    // Dirty here only: 2 and 6 deleted, 5 and 19 new, 4 rewritten, a key of bucket 4.
    store.write_many(vec![
        StateWrite::Delete(key(3, 2)),
        StateWrite::Delete(key(3, 6)),
        StateWrite::Put(key(3, 5), vec![2]),
        StateWrite::Put(key(3, 19), vec![2]),
        StateWrite::Put(key(3, 4), vec![2]),
        StateWrite::Put(key(4, 1), vec![2]),
    ])?;
    let expected: Vec<StateKey> = [0, 4, 5, 8, 10, 12, 14, 16, 18, 19].map(|i| key(3, i)).to_vec();
    // Every key a paged scan lists, `page` keys at a time, each page continuing after the last.
    type Scan<'a> = dyn Fn(Option<&StateKey>, usize) -> Result<Vec<StateKey>, StateError> + 'a;
    let all_pages = |scan: &Scan<'_>, page: usize| -> Result<Vec<StateKey>, StateError> {
        let (mut keys, mut at) = (Vec::new(), None);
        loop {
            let got = scan(at.as_ref(), page)?;
            assert!(got.len() <= page);
            at = got.last().cloned().or(at);
            let end = got.len() < page;
            keys.extend(got);
            if end {
                return Ok(keys);
            }
        }
    };
    // Candidates (for filters) are never fewer, in the same order, each once: here also the two
    // deleted keys, listed without looking their entries up.
    let with_deleted: Vec<StateKey> = [0, 2, 4, 5, 6, 8, 10, 12, 14, 16, 18, 19].map(|i| key(3, i)).to_vec();
    for page in [1, 2, 3, 4, 100] {
        let keys = all_pages(&|at, n| store.bucket_keys_after(3, at, n), page)?;
        assert_eq!(keys, expected, "pages of {page}");
        let candidates = all_pages(&|at, n| store.bucket_key_candidates_after(3, at, n), page)?;
        assert_eq!(candidates, with_deleted, "candidate pages of {page}");
    }
    assert_eq!(store.bucket_keys_after(3, Some(&key(3, 6)), 2)?, vec![key(3, 8), key(3, 10)]);
    assert_eq!(store.bucket_keys_after(3, Some(&key(2, 99)), 2)?, vec![key(3, 0), key(3, 4)]);
    assert_eq!(store.bucket_keys_after(3, Some(&key(4, 0)), 2)?, Vec::<StateKey>::new());
    // Keys that turn dirty after a page are merged into the next one.
    store.write_many(vec![StateWrite::Put(key(3, 1), vec![3]), StateWrite::Delete(key(3, 8))])?;
    assert_eq!(store.bucket_keys_after(3, None, 4)?, [0, 1, 4, 5].map(|i| key(3, i)).to_vec());
    assert_eq!(store.bucket_keys_after(3, Some(&key(3, 5)), 2)?, vec![key(3, 10), key(3, 12)]);
    // None of it was written back: the store below still holds the ten keys it had.
    assert_eq!(below.bucket_keys_after(3, None, 100)?, (0..10).map(|i| key(3, 2 * i)).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn writes_in_flight_are_read_scanned_and_written_in_order() -> Result<(), StateError> {
    // Room for 1 000 entries, so ~60 may be in flight before a writer must catch up.
    let env = CachedEnv::new(MemoryEnv::new(), 1000 * (ENTRY_OVERHEAD_BYTES + 16));
    let task = TaskId::new(OperatorId(1), 0);
    let store = env.open_task(task)?;
    let keys: Vec<StateKey> = (0..5000).map(|i| key(1 + (i % 3) as BucketId, i)).collect();
    let value = |round: u32, i: u32| (round * 10_000 + i).to_le_bytes().to_vec();
    for round in 0..4u32 {
        // Every key is evicted (and queued again) in every round: runs overlap.
        for chunk in keys.chunks(100) {
            store.write_many(
                chunk.iter().map(|k| StateWrite::Put(k.clone(), value(round, key_index(k)))).collect(),
            )?;
        }
        let read = store.get_many(&keys)?;
        assert!(
            read.iter().zip(&keys).all(|(v, k)| *v == Some(value(round, key_index(k)))),
            "round {round}: a read missed the latest write"
        );
    }
    store.write_many(vec![StateWrite::Delete(keys[0].clone())])?;
    let mut scanned = Vec::new();
    store.scan_buckets(&[1, 2, 3], 1 << 20, &mut |chunk| {
        scanned.extend(chunk);
        Ok(())
    })?;
    assert_eq!(scanned.len(), 4999);
    assert!(scanned.iter().all(|(k, v)| *v == value(3, key_index(k))), "a scan read a stale value");
    // Below, after a persist: the last write of every key.
    env.persist()?;
    let below = env.inner().open_task(task)?;
    let read = below.get_many(&keys)?;
    assert_eq!(read[0], None);
    assert!(read[1..].iter().zip(&keys[1..]).all(|(v, k)| *v == Some(value(3, key_index(k)))));
    store.delete_buckets(&[1, 2, 3])?;
    assert_eq!(store.get_many(&keys[..10])?, vec![None; 10]);
    assert_eq!(below.approximate_len()?, 0);
    Ok(())
}

fn key_index(key: &StateKey) -> u32 {
    u32::from_be_bytes([key.key[0], key.key[1], key.key[2], key.key[3]])
}

/// A memory env whose stores refuse every write.
#[derive(Default)]
struct RefusingEnv(MemoryEnv);

struct RefusingBackend(Box<dyn StateBackend>);

impl StateEnv for RefusingEnv {
    fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError> {
        Ok(Box::new(RefusingBackend(self.0.open_task(task)?)))
    }
    fn drop_task(&self, task: TaskId) -> Result<(), StateError> {
        self.0.drop_task(task)
    }
    fn persist(&self) -> Result<(), StateError> {
        Ok(())
    }
}

impl StateBackend for RefusingBackend {
    fn task(&self) -> TaskId {
        self.0.task()
    }
    fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        self.0.get_many(keys)
    }
    fn write_many(&self, _: Vec<StateWrite>) -> Result<(), StateError> {
        Err(StateError::Unsupported { task: self.task(), op: "write_many" })
    }
    fn scan_buckets(&self, b: &[BucketId], c: usize, sink: ScanSink<'_>) -> Result<u64, StateError> {
        self.0.scan_buckets(b, c, sink)
    }
    fn bucket_keys_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        self.0.bucket_keys_after(bucket, after, limit)
    }
    fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
        self.0.delete_buckets(buckets)
    }
    fn approximate_len(&self) -> Result<u64, StateError> {
        self.0.approximate_len()
    }
}

#[test]
fn a_failed_background_write_back_fails_later_operations() -> Result<(), StateError> {
    let env = CachedEnv::new(RefusingEnv::default(), 10 * (ENTRY_OVERHEAD_BYTES + 16));
    let store = env.open_task(TaskId::new(OperatorId(1), 0))?;
    let failed = (0..1000u32)
        .find_map(|i| store.write_many(vec![StateWrite::Put(key(1, i), vec![1])]).err())
        .map(|e| error_chain(&e));
    let failed = failed.ok_or(StateError::Unsupported { task: store.task(), op: "test: nothing failed" })?;
    assert!(failed.contains("background write-back failed"), "{failed}");
    assert!(failed.contains("write_many is not supported"), "the cause is kept: {failed}");
    assert!(store.get_many(&[key(1, 0)]).is_err(), "the store stays failed");
    Ok(())
}

#[test]
fn the_charged_overhead_covers_the_real_layout() {
    let slot = std::mem::size_of::<Line>();
    let key = std::mem::size_of::<CompactKey>();
    assert!(ENTRY_OVERHEAD_BYTES >= 2 * (slot + 1) + key, "slot {slot} B, key {key} B");
}

#[test]
fn persist_writes_back_every_dirty_entry() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let task = TaskId::new(OperatorId(1), 0);
    {
        let env = CachedEnv::new(crate::FjallEnv::open(dir.path())?, 1 << 20);
        let store = env.open_task(task)?;
        store.write_many(vec![StateWrite::Put(key(3, 1), b"a".to_vec())])?;
        assert_eq!(env.inner().open_task(task)?.get_many(&[key(3, 1)])?, vec![None]);
        env.persist()?;
    }
    let reopened = crate::FjallEnv::open(dir.path())?;
    assert_eq!(reopened.open_task(task)?.get_many(&[key(3, 1)])?, vec![Some(b"a".to_vec())]);
    Ok(())
}

/// A memory env that counts the keys read from it.
#[derive(Default)]
struct CountingEnv {
    inner: MemoryEnv,
    reads: Arc<std::sync::atomic::AtomicUsize>,
}

struct CountingBackend {
    inner: Box<dyn StateBackend>,
    reads: Arc<std::sync::atomic::AtomicUsize>,
}

impl StateEnv for CountingEnv {
    fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError> {
        Ok(Box::new(CountingBackend { inner: self.inner.open_task(task)?, reads: self.reads.clone() }))
    }
    fn drop_task(&self, task: TaskId) -> Result<(), StateError> {
        self.inner.drop_task(task)
    }
    fn persist(&self) -> Result<(), StateError> {
        Ok(())
    }
}

impl StateBackend for CountingBackend {
    fn task(&self) -> TaskId {
        self.inner.task()
    }
    fn get_many(&self, keys: &[StateKey]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        self.reads.fetch_add(keys.len(), Ordering::Relaxed);
        self.inner.get_many(keys)
    }
    fn write_many(&self, writes: Vec<StateWrite>) -> Result<(), StateError> {
        self.inner.write_many(writes)
    }
    fn scan_buckets(
        &self,
        buckets: &[BucketId],
        chunk: usize,
        sink: ScanSink<'_>,
    ) -> Result<u64, StateError> {
        self.inner.scan_buckets(buckets, chunk, sink)
    }
    fn bucket_keys_after(
        &self,
        bucket: BucketId,
        after: Option<&StateKey>,
        limit: usize,
    ) -> Result<Vec<StateKey>, StateError> {
        self.inner.bucket_keys_after(bucket, after, limit)
    }
    fn delete_buckets(&self, buckets: &[BucketId]) -> Result<(), StateError> {
        self.inner.delete_buckets(buckets)
    }
    fn approximate_len(&self) -> Result<u64, StateError> {
        self.inner.approximate_len()
    }
}

/// A cache over a [`CountingEnv`], a task's store in it, and the count of keys read below.
type Counted = (CachedEnv<CountingEnv>, Box<dyn StateBackend>, Arc<std::sync::atomic::AtomicUsize>);

/// A cache of `budget` bytes over a [`CountingEnv`] (see [`Counted`]).
fn counted_cache(budget: usize) -> Result<Counted, StateError> {
    let counting = CountingEnv::default();
    let reads = counting.reads.clone();
    let env = CachedEnv::new(counting, budget);
    let store = env.open_task(TaskId::new(OperatorId(1), 0))?;
    Ok((env, store, reads))
}

#[test]
fn a_miss_of_a_key_never_written_below_reads_nothing_below() -> Result<(), StateError> {
    let (_env, store, reads) = counted_cache(100 * (ENTRY_OVERHEAD_BYTES + 16))?;
    let read_below = || reads.load(Ordering::Relaxed);
    let fresh: Vec<StateKey> = (0..50).map(|i| key(1, 1_000_000 + i)).collect();
    assert_eq!(store.get_many(&fresh)?, vec![None; 50]);
    assert_eq!(read_below(), 0, "new keys of an empty store are absent without a read");

    // Most of 1 000 keys are evicted, so written below; each reads back.
    for i in 0..1000u32 {
        store.write_many(vec![StateWrite::Put(key(1, i), i.to_le_bytes().to_vec())])?;
    }
    let keys: Vec<StateKey> = (0..1000).map(|i| key(1, i)).collect();
    let values = store.get_many(&keys)?;
    assert!(values.iter().enumerate().all(|(i, v)| *v == Some((i as u32).to_le_bytes().to_vec())));
    let after_written = read_below();
    assert!(after_written >= 800, "evicted keys are read below: {after_written}");
    // Keys never written: only false positives of the filter read below.
    let strangers: Vec<StateKey> = (0..1000).map(|i| key(1, 2_000_000 + i)).collect();
    assert_eq!(store.get_many(&strangers)?, vec![None; 1000]);
    let false_positives = read_below() - after_written;
    assert!(false_positives < 100, "{false_positives} of 1 000 new keys read below");
    // A deleted bucket has nothing below.
    store.delete_buckets(&[1])?;
    let before = read_below();
    assert_eq!(store.get_many(&keys[..100])?, vec![None; 100]);
    assert_eq!(read_below(), before, "a deleted bucket's keys are absent without a read");
    Ok(())
}

#[test]
fn keys_read_between_evictions_stay_cached_and_the_rest_are_evicted() -> Result<(), StateError> {
    // Room for about 100 entries; 10 hot keys are read after every 10 writes of new keys.
    let (_env, store, reads) = counted_cache(100 * (ENTRY_OVERHEAD_BYTES + 16))?;
    let read_below = || reads.load(Ordering::Relaxed);
    let hot: Vec<StateKey> = (0..10).map(|i| key(i as BucketId, i)).collect();
    store.write_many(hot.iter().map(|k| StateWrite::Put(k.clone(), b"hot".to_vec())).collect())?;
    for i in 0..5_000u32 {
        store.write_many(vec![StateWrite::Put(key((i % 64) as BucketId, 1000 + i), vec![1])])?;
        if i % 10 == 9 {
            assert_eq!(store.get_many(&hot)?, vec![Some(b"hot".to_vec()); 10]);
        }
    }
    assert_eq!(read_below(), 0, "a hot key was evicted: CLOCK gave it no second chance");
    // The cold keys were evicted: an early one is read from below.
    assert_eq!(store.get_many(&[key(0, 1000)])?, vec![Some(vec![1])]);
    assert_eq!(read_below(), 1, "an early cold key was still cached");
    Ok(())
}

#[test]
fn a_cache_over_a_store_that_already_holds_data_reads_every_miss_below() -> Result<(), StateError> {
    let counting = CountingEnv::default();
    let task = TaskId::new(OperatorId(1), 0);
    counting.open_task(task)?.write_many(vec![StateWrite::Put(key(4, 7), b"old".to_vec())])?;
    let env = CachedEnv::new(counting, 1 << 20);
    let store = env.open_task(task)?;
    assert_eq!(store.get_many(&[key(4, 7), key(4, 8)])?, vec![Some(b"old".to_vec()), None]);
    Ok(())
}

/// Keys that turn dirty, are evicted, and turn dirty again make a bucket's dirty list
/// compact many times; key pages still list exactly the live keys in stored order, and the
/// list stays within twice its live keys (plus the slack before a compaction).
#[test]
fn compacted_dirty_lists_stay_sorted_and_bounded() -> Result<(), StateError> {
    let env = CachedEnv::new(MemoryEnv::new(), 200 * (ENTRY_OVERHEAD_BYTES + 16));
    let task = TaskId::new(OperatorId(1), 0);
    let store = env.open_task(task)?;
    let mut model = std::collections::BTreeSet::new();
    // A permutation of 0..3000 (7 is coprime to 3000), so keys arrive out of order.
    for round in 0..3u32 {
        for i in 0..3000u32 {
            let user = (i * 7 + round) % 3000;
            if (user + round) % 5 == 0 {
                store.write_many(vec![StateWrite::Delete(key(9, user))])?;
                model.remove(&user);
            } else {
                store.write_many(vec![StateWrite::Put(key(9, user), vec![round as u8])])?;
                model.insert(user);
            }
            if i % 500 == 0 {
                let pages: Vec<StateKey> = store.bucket_keys_after(9, None, usize::MAX)?;
                let expected: Vec<StateKey> = model.iter().map(|&u| key(9, u)).collect();
                assert_eq!(pages, expected, "round {round}, after {i} writes");
            }
            let tasks = env.tasks("test")?;
            let cache = tasks.get(&task).ok_or(StateError::Dropped { task, op: "test" })?.lock("test")?;
            if let Some(list) = cache.dirty.get(&9) {
                assert!(
                    list.keys.len() <= 2 * list.live + 65,
                    "{} listed, {} live",
                    list.keys.len(),
                    list.live
                );
                assert!(list.keys[..list.sorted].is_sorted_by(|a, b| a.stored_order() < b.stored_order()));
            }
        }
    }
    Ok(())
}

fn store_cache(env: &CachedEnv<MemoryEnv>, task: TaskId) -> Result<usize, StateError> {
    let tasks = env.tasks("test")?;
    let shared = tasks.get(&task).ok_or(StateError::Dropped { task, op: "test" })?;
    Ok(shared.lock("test")?.bytes)
}
