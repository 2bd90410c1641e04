//! One conformance suite run against every backend — memory, fjall, fjall behind a write-back
//! cache big enough for every test, and fjall behind a tiny one that evicts on nearly every
//! write — all must give the same answers. The remote backend (state servers started in this
//! process on port 0, alone and behind the caches) runs the same cases except the two about
//! per-task key spaces, which it replaces by their shared-key-space counterparts: its key space
//! belongs to the operator, not the task (docs/architecture.md §5, "Remote state"). The
//! lazy-recovery wrapper (`koala_state::lazy`) runs the per-task cases over memory and over
//! fjall behind a cache.

use std::error::Error;

use koala_state::lazy::{GroupLoader, LazyBackend};
use koala_state::{
    CachedEnv, ENTRY_OVERHEAD_BYTES, FjallEnv, MAX_USER_KEY_LEN, MemoryEnv, RemoteEnv, StateBackend,
    StateEnv, StateError, StateKey, StateServer, StateWrite,
};
use koala_types::handshake::Token;
use koala_types::{BucketId, OperatorId, TaskId};

type TestResult = Result<(), Box<dyn Error>>;

fn task(op: u32, index: u32) -> TaskId {
    TaskId::new(OperatorId(op), index)
}

fn key(bucket: BucketId, state: u8, user: &str) -> StateKey {
    StateKey::new(bucket, state, user.as_bytes().to_vec())
}

fn put(k: &StateKey, value: &str) -> StateWrite {
    StateWrite::Put(k.clone(), value.as_bytes().to_vec())
}

fn val(value: &str) -> Option<Vec<u8>> {
    Some(value.as_bytes().to_vec())
}

/// Entries, chunk sizes as the sink saw them, and the total bytes a scan reported.
type Scanned = (Vec<(StateKey, Vec<u8>)>, Vec<usize>, u64);

/// Every entry of `buckets`, with the chunk sizes the sink saw.
fn scan_all(
    store: &dyn StateBackend,
    buckets: &[BucketId],
    chunk_bytes: usize,
) -> Result<Scanned, StateError> {
    let mut entries = Vec::new();
    let mut chunk_sizes = Vec::new();
    let total = store.scan_buckets(buckets, chunk_bytes, &mut |chunk| {
        chunk_sizes.push(chunk.iter().map(|(k, v)| k.encoded_len() + v.len()).sum());
        entries.extend(chunk);
        Ok(())
    })?;
    Ok((entries, chunk_sizes, total))
}

fn get_put_delete_and_missing_keys(env: &dyn StateEnv) -> TestResult {
    let store = env.open_task(task(1, 0))?;
    let (a, b, c) = (key(3, 0, "a"), key(3, 1, "a"), key(4, 0, "c"));
    assert_eq!(store.get_many(&[a.clone(), b.clone()])?, vec![None, None]);
    store.write_many(vec![put(&a, "1"), put(&b, "2")])?;
    assert_eq!(
        store.get_many(&[c.clone(), b.clone(), a.clone(), b.clone()])?,
        vec![None, val("2"), val("1"), val("2")]
    );
    store.write_many(vec![put(&a, "10"), StateWrite::Delete(b.clone()), StateWrite::Delete(c.clone())])?;
    assert_eq!(store.get_many(&[a, b, c])?, vec![val("10"), None, None]);
    assert_eq!(store.get_many(&[])?, Vec::<Option<Vec<u8>>>::new());
    store.write_many(Vec::new())?;
    let empty_key = StateKey::new(0, 0, Vec::new());
    store.write_many(vec![StateWrite::Put(empty_key.clone(), Vec::new())])?;
    assert_eq!(store.get_many(&[empty_key])?, vec![Some(Vec::new())]);
    Ok(())
}

fn last_write_wins_within_a_batch(env: &dyn StateEnv) -> TestResult {
    let store = env.open_task(task(1, 0))?;
    let (a, b, c) = (key(1, 0, "a"), key(1, 0, "b"), key(1, 0, "c"));
    store.write_many(vec![put(&c, "old")])?;
    store.write_many(vec![
        put(&a, "1"),
        put(&a, "2"),
        put(&b, "1"),
        StateWrite::Delete(b.clone()),
        StateWrite::Delete(c.clone()),
        put(&c, "new"),
    ])?;
    assert_eq!(store.get_many(&[a, b, c])?, vec![val("2"), None, val("new")]);
    Ok(())
}

fn rejected_batch_writes_nothing(env: &dyn StateEnv) -> TestResult {
    let store = env.open_task(task(1, 0))?;
    let good = key(1, 0, "good");
    let too_long = StateKey::new(1, 0, vec![7; MAX_USER_KEY_LEN + 1]);
    let result = store.write_many(vec![put(&good, "x"), StateWrite::Put(too_long.clone(), vec![])]);
    assert!(matches!(result, Err(StateError::Layout { .. })), "{result:?}");
    assert_eq!(store.get_many(&[good])?, vec![None]);
    assert!(matches!(store.get_many(&[too_long]), Err(StateError::Layout { .. })));
    let longest = StateKey::new(1, 0, vec![7; MAX_USER_KEY_LEN]);
    store.write_many(vec![StateWrite::Put(longest.clone(), b"v".to_vec())])?;
    assert_eq!(store.get_many(&[longest])?, vec![val("v")]);
    Ok(())
}

fn scan_returns_requested_buckets_in_key_order(env: &dyn StateEnv) -> TestResult {
    let store = env.open_task(task(2, 1))?;
    let mut expected = Vec::new();
    let mut writes = Vec::new();
    for bucket in [u16::MAX, 300, 5, 1, 0] {
        for state in [2u8, 0] {
            for user in ["zz", "b", "a", ""] {
                let k = key(bucket, state, user);
                let v = format!("{bucket}/{state}/{user}");
                writes.push(put(&k, &v));
                if [0, 5, 300, u16::MAX].contains(&bucket) {
                    expected.push((k, v.into_bytes()));
                }
            }
        }
    }
    store.write_many(writes)?;
    expected.sort();
    let (entries, chunks, total) = scan_all(store.as_ref(), &[u16::MAX, 5, 300, 0, 5, 9], 64)?;
    assert_eq!(entries, expected);
    let expected_bytes: usize = expected.iter().map(|(k, v)| k.encoded_len() + v.len()).sum();
    assert_eq!(total, expected_bytes as u64);
    assert_eq!(chunks.iter().sum::<usize>(), expected_bytes);
    assert!(chunks.iter().all(|&c| c <= 64), "{chunks:?}");
    assert!(chunks.len() > 1);
    let (entries, chunks, total) = scan_all(store.as_ref(), &[42], 64)?;
    assert_eq!((entries.len(), chunks.len(), total), (0, 0, 0));
    Ok(())
}

/// Every key of `bucket` after `after`, read in pages of `page` keys.
fn keys_in_pages(
    store: &dyn StateBackend,
    bucket: BucketId,
    mut after: Option<StateKey>,
    page: usize,
) -> Result<Vec<StateKey>, StateError> {
    let mut keys = Vec::new();
    loop {
        let got = store.bucket_keys_after(bucket, after.as_ref(), page)?;
        let end = got.len() < page;
        after = got.last().cloned().or(after);
        keys.extend(got);
        if end {
            return Ok(keys);
        }
    }
}

fn bucket_keys_after_pages_through_one_bucket(env: &dyn StateEnv) -> TestResult {
    let store = env.open_task(task(2, 2))?;
    let mut writes = Vec::new();
    for bucket in [u16::MAX, 5, 4, 3] {
        for state in [1u8, 0] {
            for user in ["c", "a", "b", ""] {
                writes.push(put(&key(bucket, state, user), "value"));
            }
        }
    }
    store.write_many(writes)?;
    let bucket_4: Vec<StateKey> =
        [(0, ""), (0, "a"), (0, "b"), (0, "c"), (1, ""), (1, "a"), (1, "b"), (1, "c")]
            .iter()
            .map(|&(state, user)| key(4, state, user))
            .collect();
    for page in [1, 3, 8, 100] {
        assert_eq!(keys_in_pages(store.as_ref(), 4, None, page)?, bucket_4, "pages of {page}");
    }
    // A position need not be stored; one in another bucket starts at the start or yields nothing.
    assert_eq!(store.bucket_keys_after(4, Some(&key(4, 0, "aa")), 3)?, bucket_4[2..5].to_vec());
    assert_eq!(store.bucket_keys_after(4, Some(&key(3, 9, "zz")), 2)?, bucket_4[..2].to_vec());
    assert_eq!(store.bucket_keys_after(4, Some(&key(5, 0, "")), 2)?, Vec::<StateKey>::new());
    assert_eq!(store.bucket_keys_after(4, None, 0)?, Vec::<StateKey>::new());
    assert_eq!(store.bucket_keys_after(9, None, 5)?, Vec::<StateKey>::new());
    assert_eq!(keys_in_pages(store.as_ref(), u16::MAX, None, 3)?.len(), 8, "the last bucket");

    // Take keys as they are handed out and continue after the last one: every key once, even
    // one written ahead of the position meanwhile; one written behind it needs a fresh start.
    let mut after: Option<StateKey> = None;
    let mut handed_out = Vec::new();
    loop {
        let got = store.bucket_keys_after(4, after.as_ref(), 3)?;
        store.write_many(got.iter().cloned().map(StateWrite::Delete).collect())?;
        if handed_out.is_empty() {
            store.write_many(vec![put(&key(4, 1, "d"), "ahead"), put(&key(4, 0, ""), "behind")])?;
        }
        after = got.last().cloned().or(after);
        let end = got.len() < 3;
        handed_out.extend(got);
        if end {
            break;
        }
    }
    let mut expected = bucket_4.clone();
    expected.push(key(4, 1, "d"));
    assert_eq!(handed_out, expected);
    assert_eq!(store.bucket_keys_after(4, None, 3)?, vec![key(4, 0, "")], "written behind");
    assert_eq!(keys_in_pages(store.as_ref(), 3, None, 2)?.len(), 8, "other buckets untouched");
    Ok(())
}

fn chunking_packs_greedily_and_sends_oversized_entries_alone(env: &dyn StateEnv) -> TestResult {
    let store = env.open_task(task(2, 2))?;
    // Entries of 3 + 1 + 6 = 10 bytes, and one of 3 + 1 + 96 = 100 bytes.
    store.write_many(vec![
        put(&key(7, 0, "a"), "aaaaaa"),
        put(&key(7, 0, "b"), "bbbbbb"),
        put(&key(7, 0, "c"), &"c".repeat(96)),
        put(&key(7, 0, "d"), "dddddd"),
        put(&key(7, 0, "e"), "eeeeee"),
        put(&key(7, 0, "f"), "ffffff"),
    ])?;
    let (_, chunks, total) = scan_all(store.as_ref(), &[7], 20)?;
    assert_eq!(chunks, vec![20, 100, 20, 10]);
    assert_eq!(total, 150);
    let (_, chunks, _) = scan_all(store.as_ref(), &[7], 0)?;
    assert_eq!(chunks, vec![10, 10, 100, 10, 10, 10]);
    Ok(())
}

fn scan_stops_at_a_failing_sink(env: &dyn StateEnv) -> TestResult {
    let store = env.open_task(task(2, 3))?;
    let writes = (0..10).map(|i| put(&key(1, 0, &i.to_string()), "v")).collect();
    store.write_many(writes)?;
    let mut calls = 0;
    let result = store.scan_buckets(&[1], 0, &mut |_| {
        calls += 1;
        if calls == 3 { Err(StateError::sink("receiver closed")) } else { Ok(()) }
    });
    assert!(matches!(result, Err(StateError::Sink(_))), "{result:?}");
    assert_eq!(calls, 3);
    Ok(())
}

fn delete_buckets_removes_only_those_buckets(env: &dyn StateEnv) -> TestResult {
    let store = env.open_task(task(3, 0))?;
    // More keys in bucket 5 than one fjall delete batch holds.
    let writes = (0..20_000u32)
        .map(|i| StateWrite::Put(StateKey::new(5, (i % 3) as u8, i.to_be_bytes().to_vec()), vec![1]))
        .chain([put(&key(4, 0, "keep"), "4"), put(&key(6, 0, "keep"), "6"), put(&key(1, 0, "x"), "1")])
        .collect();
    store.write_many(writes)?;
    store.delete_buckets(&[5, 1, 5, 99])?;
    store.delete_buckets(&[5])?;
    let (entries, _, _) = scan_all(store.as_ref(), &[0, 1, 4, 5, 6], 1 << 20)?;
    let keys: Vec<StateKey> = entries.into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec![key(4, 0, "keep"), key(6, 0, "keep")]);
    let probe = StateKey::new(5, 1, 1u32.to_be_bytes().to_vec());
    assert_eq!(store.get_many(std::slice::from_ref(&probe))?, vec![None]);
    store.write_many(vec![StateWrite::Put(probe.clone(), b"back".to_vec())])?;
    assert_eq!(store.get_many(&[probe])?, vec![val("back")]);
    Ok(())
}

fn tasks_are_isolated(env: &dyn StateEnv) -> TestResult {
    let (t1, t2, t3) = (task(1, 0), task(1, 1), task(2, 0));
    let stores = [env.open_task(t1)?, env.open_task(t2)?, env.open_task(t3)?];
    let k = key(9, 0, "shared-name");
    for (i, store) in stores.iter().enumerate() {
        store.write_many(vec![put(&k, &i.to_string())])?;
    }
    stores[0].delete_buckets(&[9])?;
    assert_eq!(stores[0].get_many(std::slice::from_ref(&k))?, vec![None]);
    assert_eq!(stores[1].get_many(std::slice::from_ref(&k))?, vec![val("1")]);
    assert_eq!(stores[2].get_many(std::slice::from_ref(&k))?, vec![val("2")]);
    let (entries, _, _) = scan_all(stores[2].as_ref(), &[9], 1024)?;
    assert_eq!(entries, vec![(k, b"2".to_vec())]);
    assert_eq!(stores[1].task(), t2);
    Ok(())
}

fn opening_a_task_twice_shares_its_data(env: &dyn StateEnv) -> TestResult {
    let first = env.open_task(task(4, 0))?;
    let second = env.open_task(task(4, 0))?;
    first.write_many(vec![put(&key(1, 0, "k"), "v")])?;
    assert_eq!(second.get_many(&[key(1, 0, "k")])?, vec![val("v")]);
    Ok(())
}

fn drop_task_deletes_the_store_and_invalidates_handles(env: &dyn StateEnv) -> TestResult {
    let (gone, kept) = (task(5, 0), task(5, 1));
    let store = env.open_task(gone)?;
    let other = env.open_task(kept)?;
    store.write_many(vec![put(&key(1, 0, "k"), "v")])?;
    other.write_many(vec![put(&key(1, 0, "k"), "w")])?;
    env.drop_task(gone)?;
    assert!(matches!(store.get_many(&[key(1, 0, "k")]), Err(StateError::Dropped { .. })));
    let write = store.write_many(vec![put(&key(1, 0, "k"), "v")]);
    assert!(matches!(write, Err(StateError::Dropped { .. })));
    let scan = store.scan_buckets(&[1], 1, &mut |_| Ok(()));
    assert!(matches!(scan, Err(StateError::Dropped { .. })));
    drop(store);
    let reopened = env.open_task(gone)?;
    assert_eq!(reopened.get_many(&[key(1, 0, "k")])?, vec![None]);
    assert_eq!(reopened.approximate_len()?, 0);
    assert_eq!(other.get_many(&[key(1, 0, "k")])?, vec![val("w")]);
    env.drop_task(task(99, 99))?;
    env.persist()?;
    Ok(())
}

fn approximate_len_counts_written_keys(env: &dyn StateEnv) -> TestResult {
    let store = env.open_task(task(6, 0))?;
    assert_eq!(store.approximate_len()?, 0);
    store.write_many((0..100).map(|i| put(&key(i, 0, "k"), "v")).collect())?;
    assert_eq!(store.approximate_len()?, 100);
    Ok(())
}

/// Remote: tasks of one operator share a key space, operators do not; releasing a bucket keeps
/// it for the next owner.
fn tasks_of_an_operator_share_state(env: &dyn StateEnv) -> TestResult {
    let (t0, t1, other) = (task(1, 0), task(1, 1), task(2, 0));
    let stores = [env.open_task(t0)?, env.open_task(t1)?, env.open_task(other)?];
    assert!(stores.iter().all(|s| s.is_shared()));
    let k = key(9, 0, "shared-name");
    stores[0].write_many(vec![put(&k, "written by task 0")])?;
    stores[2].write_many(vec![put(&k, "another operator")])?;
    // Task 0 gives bucket 9 away: what it wrote (maybe only cached so far) reaches the server.
    stores[0].release_buckets(&[9])?;
    assert_eq!(stores[1].get_many(std::slice::from_ref(&k))?, vec![val("written by task 0")]);
    stores[1].write_many(vec![put(&k, "written by task 1")])?;
    stores[1].release_buckets(&[9])?;
    // The bucket comes back to task 0, which must not read its own stale copy.
    assert_eq!(stores[0].get_many(std::slice::from_ref(&k))?, vec![val("written by task 1")]);
    assert_eq!(stores[2].get_many(std::slice::from_ref(&k))?, vec![val("another operator")]);
    let (entries, _, _) = scan_all(stores[1].as_ref(), &[9], 1024)?;
    assert_eq!(entries, vec![(k, b"written by task 1".to_vec())]);
    Ok(())
}

/// Remote: dropping a task invalidates its handles but keeps the operator's data.
fn drop_task_keeps_the_shared_state_and_invalidates_handles(env: &dyn StateEnv) -> TestResult {
    let (gone, kept) = (task(5, 0), task(5, 1));
    let store = env.open_task(gone)?;
    let other = env.open_task(kept)?;
    store.write_many(vec![put(&key(1, 0, "k"), "v")])?;
    store.release_buckets(&[1])?;
    env.drop_task(gone)?;
    assert!(matches!(store.get_many(&[key(1, 0, "k")]), Err(StateError::Dropped { .. })));
    assert!(matches!(store.write_many(vec![put(&key(1, 0, "k"), "x")]), Err(StateError::Dropped { .. })));
    assert_eq!(other.get_many(&[key(1, 0, "k")])?, vec![val("v")]);
    assert_eq!(env.open_task(gone)?.get_many(&[key(1, 0, "k")])?, vec![val("v")]);
    env.drop_task(task(99, 99))?;
    env.persist()?;
    Ok(())
}

/// Stores of one task refuse to release buckets (their state must move) and keep them.
fn private_stores_refuse_release(env: &dyn StateEnv) -> TestResult {
    let store = env.open_task(task(7, 0))?;
    assert!(!store.is_shared());
    store.write_many(vec![put(&key(2, 0, "k"), "v")])?;
    assert!(matches!(store.release_buckets(&[2]), Err(StateError::Unsupported { .. })));
    assert_eq!(store.get_many(&[key(2, 0, "k")])?, vec![val("v")]);
    Ok(())
}

/// The job token the remote backend's servers check and its env presents (on loopback a token
/// is not required, but a given one is checked: every request of the suite passes the gate with
/// it).
fn job_token() -> Result<Token, Box<dyn Error>> {
    Ok(Token::parse("conformance-suite-job-token", "test")?)
}

/// A state server on port 0 in this process, and its directory.
fn server() -> Result<(StateServer, tempfile::TempDir), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    Ok((StateServer::start("127.0.0.1:0", dir.path(), Some(job_token()?), None)?, dir))
}

/// Running state servers and their directories (kept alive as long as the test uses them).
type Servers = Vec<(StateServer, tempfile::TempDir)>;

/// An env on two fresh servers (so batches are split), and what keeps them alive.
fn remote_env() -> Result<(RemoteEnv, Servers), Box<dyn Error>> {
    let servers = vec![server()?, server()?];
    let env = RemoteEnv::new(servers.iter().map(|(s, _)| s.addr().to_string()).collect(), Some(job_token()?));
    Ok((env, servers))
}

macro_rules! remote_conformance {
    ($($case:ident),* $(,)?) => {
        mod remote {
            $(#[test]
            fn $case() -> super::TestResult {
                let (env, _servers) = super::remote_env()?;
                super::$case(&env)
            })*
        }
        mod remote_cached {
            $(#[test]
            fn $case() -> super::TestResult {
                let (env, _servers) = super::remote_env()?;
                super::$case(&super::CachedEnv::new(env, 64 << 20))
            })*
        }
        mod remote_tiny_cache {
            $(#[test]
            fn $case() -> super::TestResult {
                let (env, _servers) = super::remote_env()?;
                let tiny = 2 * (super::ENTRY_OVERHEAD_BYTES + 32);
                super::$case(&super::CachedEnv::new(env, tiny))
            })*
        }
    };
}

remote_conformance!(
    get_put_delete_and_missing_keys,
    last_write_wins_within_a_batch,
    rejected_batch_writes_nothing,
    scan_returns_requested_buckets_in_key_order,
    bucket_keys_after_pages_through_one_bucket,
    chunking_packs_greedily_and_sends_oversized_entries_alone,
    scan_stops_at_a_failing_sink,
    delete_buckets_removes_only_those_buckets,
    tasks_of_an_operator_share_state,
    opening_a_task_twice_shares_its_data,
    drop_task_keeps_the_shared_state_and_invalidates_handles,
    approximate_len_counts_written_keys,
);

/// An env whose stores log their changes for checkpoints ([`koala_state::ChangeTracking`]), as
/// a task's store is wrapped when its job has checkpoints.
struct Tracked<E>(E);

impl<E: StateEnv> StateEnv for Tracked<E> {
    fn open_task(&self, task: TaskId) -> Result<Box<dyn koala_state::StateBackend>, koala_state::StateError> {
        Ok(Box::new(koala_state::ChangeTracking::new(self.0.open_task(task)?, BucketId::MAX, 64)))
    }

    fn drop_task(&self, task: TaskId) -> Result<(), koala_state::StateError> {
        self.0.drop_task(task)
    }

    fn persist(&self) -> Result<(), koala_state::StateError> {
        self.0.persist()
    }
}

/// Stores behind the lazy-recovery wrapper: every bucket group starts unloaded, with a loader
/// that finds nothing (a store restored from an empty checkpoint) and its background loader
/// running, so every case meets groups loaded by its own accesses and by the background.
struct LazyEnv<E>(E);

/// The loader of an empty checkpoint: it clears the group, as a restore does.
struct EmptyCheckpoint;

impl GroupLoader for EmptyCheckpoint {
    fn load(&self, store: &dyn StateBackend, buckets: std::ops::Range<BucketId>) -> Result<(), StateError> {
        let _ = (store, buckets);
        Ok(())
    }
}

impl<E: StateEnv> StateEnv for LazyEnv<E> {
    fn open_task(&self, task: TaskId) -> Result<Box<dyn StateBackend>, StateError> {
        let store = LazyBackend::new(self.0.open_task(task)?, 128, 8, Box::new(EmptyCheckpoint));
        store.start_background()?;
        Ok(Box::new(store))
    }

    fn drop_task(&self, task: TaskId) -> Result<(), StateError> {
        self.0.drop_task(task)
    }

    fn persist(&self) -> Result<(), StateError> {
        self.0.persist()
    }
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod lazy_memory {
            $(#[test]
            fn $case() -> super::TestResult {
                super::$case(&super::LazyEnv(super::MemoryEnv::new()))
            })*
        }
        mod lazy_fjall_cached {
            $(#[test]
            fn $case() -> super::TestResult {
                let dir = tempfile::tempdir()?;
                super::$case(&super::LazyEnv(super::CachedEnv::new(super::FjallEnv::open(dir.path())?, 64 << 20)))
            })*
        }
        mod memory {
            $(#[test]
            fn $case() -> super::TestResult {
                super::$case(&super::MemoryEnv::new())
            })*
        }
        mod fjall {
            $(#[test]
            fn $case() -> super::TestResult {
                let dir = tempfile::tempdir()?;
                super::$case(&super::FjallEnv::open(dir.path())?)
            })*
        }
        mod fjall_cached {
            $(#[test]
            fn $case() -> super::TestResult {
                let dir = tempfile::tempdir()?;
                super::$case(&super::CachedEnv::new(super::FjallEnv::open(dir.path())?, 64 << 20))
            })*
        }
        mod fjall_cached_tracked {
            $(#[test]
            fn $case() -> super::TestResult {
                let dir = tempfile::tempdir()?;
                super::$case(&super::Tracked(super::CachedEnv::new(super::FjallEnv::open(dir.path())?, 64 << 20)))
            })*
        }
        mod fjall_tiny_cache {
            $(#[test]
            fn $case() -> super::TestResult {
                let dir = tempfile::tempdir()?;
                let tiny = 2 * (super::ENTRY_OVERHEAD_BYTES + 32);
                super::$case(&super::CachedEnv::new(super::FjallEnv::open(dir.path())?, tiny))
            })*
        }
    };
}

conformance!(
    get_put_delete_and_missing_keys,
    last_write_wins_within_a_batch,
    rejected_batch_writes_nothing,
    scan_returns_requested_buckets_in_key_order,
    bucket_keys_after_pages_through_one_bucket,
    chunking_packs_greedily_and_sends_oversized_entries_alone,
    scan_stops_at_a_failing_sink,
    delete_buckets_removes_only_those_buckets,
    tasks_are_isolated,
    opening_a_task_twice_shares_its_data,
    drop_task_deletes_the_store_and_invalidates_handles,
    approximate_len_counts_written_keys,
    private_stores_refuse_release,
);
