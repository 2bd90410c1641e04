//! Asynchronous, incremental checkpoints of a task's store (docs/architecture.md §10): a frozen
//! view holds the state as of the freeze while the task goes on writing, on every backend (the
//! cache over fjall with entries in both layers, fjall alone, memory); and a chain of incremental
//! snapshots, each sharing the unchanged part files of the one before, restores the same state
//! as a full snapshot, also once the older snapshots of the chain are deleted.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use koala_state::snapshot::{IncrementalStats, restore, snapshot, snapshot_frozen};
use koala_state::{
    CachedEnv, ChangeTracking, FjallEnv, KEY_HEADER_LEN, MIN_BUDGET_BYTES, MemoryEnv, StateBackend, StateEnv,
    StateError, StateKey, StateWrite,
};
use koala_types::{OperatorId, TaskId};

const BUCKETS: u16 = 16;

fn task() -> TaskId {
    TaskId::new(OperatorId(4), 0)
}

fn key(i: u32) -> StateKey {
    StateKey::new((i % u32::from(BUCKETS)) as u16, (i % 2) as u8, format!("key-{i}").into_bytes())
}

/// Applies `writes` to the store and to the model.
fn apply(store: &dyn StateBackend, model: &mut BTreeMap<StateKey, Vec<u8>>, writes: Vec<StateWrite>) {
    for w in &writes {
        match w {
            StateWrite::Put(k, v) => model.insert(k.clone(), v.clone()),
            StateWrite::Delete(k) => model.remove(k),
        };
    }
    store.write_many(writes).unwrap();
}

/// 20 000 entries of 0–120 bytes (more than the 1 MiB cache holds: some are written back to
/// fjall, some only dirty in the cache), and every seventh deleted again.
fn fill(store: &dyn StateBackend) -> BTreeMap<StateKey, Vec<u8>> {
    let mut model = BTreeMap::new();
    for chunk in (0u32..20_000).collect::<Vec<_>>().chunks(1000) {
        let writes = chunk.iter().map(|&i| StateWrite::Put(key(i), vec![i as u8; (i * 13 % 121) as usize]));
        apply(store, &mut model, writes.collect());
    }
    apply(store, &mut model, (0u32..20_000).step_by(7).map(|i| StateWrite::Delete(key(i))).collect());
    model
}

fn contents(store: &dyn StateBackend) -> BTreeMap<StateKey, Vec<u8>> {
    let mut out = BTreeMap::new();
    let all: Vec<u16> = (0..BUCKETS).collect();
    store
        .scan_buckets(&all, 1 << 16, &mut |chunk| {
            out.extend(chunk);
            Ok(())
        })
        .unwrap();
    out
}

/// What the snapshot in `dir` restores into an empty store.
fn restored(dir: &Path) -> BTreeMap<StateKey, Vec<u8>> {
    let store = MemoryEnv::new().open_task(task()).unwrap();
    restore(store.as_ref(), dir, None).unwrap();
    contents(store.as_ref())
}

/// Freezes `store`, then overwrites, deletes and adds keys in every bucket, then writes the view
/// out: the snapshot holds the state of the freeze, the store the state after. `check` looks at
/// the store right after the freeze.
fn freeze_while_writing(store: &dyn StateBackend, check: &dyn Fn(usize)) {
    let mut model = fill(store);
    let at_freeze = model.clone();
    let view = store.freeze(&(0..BUCKETS).collect::<Vec<u16>>()).unwrap();
    check(at_freeze.len());
    let mut after: Vec<StateWrite> =
        (0u32..20_000).step_by(3).map(|i| StateWrite::Put(key(i), b"after the barrier".to_vec())).collect();
    after.extend((1u32..20_000).step_by(5).map(|i| StateWrite::Delete(key(i))));
    after.extend((20_000u32..25_000).map(|i| StateWrite::Put(key(i), b"new".to_vec())));
    apply(store, &mut model, after);
    let dir = tempfile::tempdir().unwrap();
    let stats = snapshot_frozen(view.as_ref(), BUCKETS, &dir.path().join("snap"), 2, None).unwrap();
    assert_eq!((stats.entries, stats.shared_parts, stats.parts), (at_freeze.len() as u64, 0, 8));
    assert_ne!(at_freeze, model, "the writes after the freeze changed the store");
    assert_eq!(restored(&dir.path().join("snap")), at_freeze, "the snapshot holds the freeze's state");
    assert_eq!(contents(store), model, "the store holds every write");
}

#[test]
fn a_frozen_cache_over_fjall_holds_the_state_at_the_freeze_while_writes_continue() {
    let dir = tempfile::tempdir().unwrap();
    let env = CachedEnv::new(FjallEnv::open(dir.path()).unwrap(), MIN_BUDGET_BYTES);
    let store = env.open_task(task()).unwrap();
    // Both layers hold part of the state at the freeze: fjall the written-back entries, the
    // cache the dirty rest.
    let below = env.inner().open_fjall_task(task()).unwrap();
    freeze_while_writing(store.as_ref(), &|entries| {
        let stored = below.approximate_len().unwrap();
        assert!(stored > 0 && stored < entries as u64, "fjall held {stored} of {entries} entries");
    });
}

#[test]
fn a_frozen_fjall_store_holds_the_state_at_the_freeze_while_writes_continue() {
    let dir = tempfile::tempdir().unwrap();
    let env = FjallEnv::open(dir.path()).unwrap();
    freeze_while_writing(env.open_task(task()).unwrap().as_ref(), &|_| {});
}

#[test]
fn a_frozen_memory_store_holds_the_state_at_the_freeze_while_writes_continue() {
    freeze_while_writing(MemoryEnv::new().open_task(task()).unwrap().as_ref(), &|_| {});
}

/// Writes an incremental snapshot of `store` into `root/name` on top of `base`.
fn take(store: &dyn StateBackend, root: &Path, name: &str, base: Option<&str>) -> IncrementalStats {
    let view = store.freeze(&(0..BUCKETS).collect::<Vec<u16>>()).unwrap();
    let base = base.map(|b| root.join(b));
    snapshot_frozen(view.as_ref(), BUCKETS, &root.join(name), 2, base.as_deref()).unwrap()
}

#[test]
fn an_incremental_chain_restores_what_a_full_snapshot_does() {
    let dir = tempfile::tempdir().unwrap();
    let env = CachedEnv::new(FjallEnv::open(dir.path().join("db")).unwrap(), MIN_BUDGET_BYTES);
    let store = env.open_task(task()).unwrap();
    let mut model = fill(store.as_ref());
    let root = dir.path().join("checkpoints");
    let first = take(store.as_ref(), &root, "1", None);
    assert_eq!((first.parts, first.shared_parts, first.written_bytes), (8, 0, first.bytes));
    // Nothing changed: every part is shared, nothing written.
    let same = take(store.as_ref(), &root, "2", Some("1"));
    assert_eq!((same.parts, same.shared_parts, same.written_bytes), (8, 8, 0));
    // Bucket 3 (part 1 of buckets 2–3) changes: one part is written, seven are shared.
    let bucket3 = (3u32..20_000).step_by(16);
    let mut writes: Vec<StateWrite> =
        bucket3.clone().step_by(2).map(|i| StateWrite::Delete(key(i))).collect();
    writes.extend(bucket3.skip(1).step_by(2).map(|i| StateWrite::Put(key(i), b"changed".to_vec())));
    apply(store.as_ref(), &mut model, writes);
    let third = take(store.as_ref(), &root, "3", Some("2"));
    assert_eq!((third.parts, third.shared_parts), (8, 7));
    assert!(third.written_bytes > 0 && third.written_bytes < third.bytes / 4, "{third:?}");
    // Bucket 10 changes on top.
    apply(store.as_ref(), &mut model, vec![StateWrite::Put(key(10), b"ten".to_vec())]);
    let fourth = take(store.as_ref(), &root, "4", Some("3"));
    assert_eq!((fourth.parts, fourth.shared_parts), (8, 7));
    // Retention deletes the older snapshots; the newest still restores whole.
    for old in ["1", "2", "3"] {
        std::fs::remove_dir_all(root.join(old)).unwrap();
    }
    let full = root.join("full");
    snapshot(store.as_ref(), BUCKETS, &full, 1 << 20).unwrap();
    assert_eq!(contents(store.as_ref()), model);
    assert_eq!(restored(&root.join("4")), model, "the chain's last snapshot restores the state");
    assert_eq!(restored(&full), model, "as a full snapshot does");
}

/// The chain of [`an_incremental_chain_restores_what_a_full_snapshot_does`] over a store that
/// logs its changes ([`ChangeTracking`]): unchanged groups are linked without being read, a few
/// changes become a delta part (deletes included), many changes rewrite their group, and the
/// deltas of a group compact once they pass its part; every snapshot of the chain restores the
/// state at its freeze, also once the older ones are deleted.
#[test]
fn a_chain_over_a_change_log_writes_deltas_and_restores_every_freeze() {
    let dir = tempfile::tempdir().unwrap();
    let env = CachedEnv::new(FjallEnv::open(dir.path().join("db")).unwrap(), MIN_BUDGET_BYTES);
    let store = ChangeTracking::new(env.open_task(task()).unwrap(), BUCKETS, 2);
    let mut model = fill(&store);
    let root = dir.path().join("checkpoints");
    let first = take(&store, &root, "1", None);
    assert_eq!((first.parts, first.delta_parts, first.scanned_groups), (8, 0, 8));
    let same = take(&store, &root, "2", Some("1"));
    assert_eq!((same.shared_parts, same.written_bytes, same.scanned_groups), (8, 0, 0));
    // A few puts and deletes in buckets 3 and 12: two delta parts, nothing scanned.
    let few = vec![
        StateWrite::Delete(key(3)),
        StateWrite::Put(key(19), b"changed".to_vec()),
        StateWrite::Put(key(30_012), b"new key".to_vec()),
    ];
    apply(&store, &mut model, few);
    let third = take(&store, &root, "3", Some("2"));
    assert_eq!((third.parts, third.shared_parts, third.delta_parts, third.scanned_groups), (10, 8, 2, 0));
    assert!(third.written_bytes < 200, "{third:?}");
    assert_eq!(restored(&root.join("3")), model, "full parts then deltas restore the freeze");
    // Every key of bucket 5 rewritten: past its group's budget, the group is scanned whole.
    let many: Vec<StateWrite> =
        (5u32..20_000).step_by(16).map(|i| StateWrite::Put(key(i), vec![7; 200])).collect();
    apply(&store, &mut model, many);
    let fourth = take(&store, &root, "4", Some("3"));
    assert_eq!((fourth.delta_parts, fourth.scanned_groups), (0, 1), "{fourth:?}");
    assert_eq!(restored(&root.join("4")), model);
    // Small changes to bucket 12 checkpoint after checkpoint: its deltas compact within
    // MAX_DELTAS snapshots, and the chain still restores each freeze.
    let mut previous = "4".to_string();
    let mut compacted = false;
    for round in 0..koala_state::snapshot::MAX_DELTAS as u32 {
        apply(
            &store,
            &mut model,
            vec![StateWrite::Put(key(12 + 16 * round), format!("r{round}").into_bytes())],
        );
        let name = format!("r{round}");
        let stats = take(&store, &root, &name, Some(&previous));
        compacted |= stats.scanned_groups == 1 && stats.delta_parts == 0;
        assert_eq!(restored(&root.join(&name)), model, "round {round}");
        previous = name;
    }
    assert!(compacted, "the group's deltas were compacted");
    for old in ["1", "2", "3", "4"] {
        std::fs::remove_dir_all(root.join(old)).unwrap();
    }
    assert_eq!(restored(&root.join(&previous)), model, "the newest restores after retention");
}

/// Over a change log a freeze copies only the groups its writer will scan: of a cached store
/// whose whole state is dirty in the cache, only the group past its budget is copied, a bucket
/// of another group cannot be read from the view (an error, not an empty bucket), and the
/// snapshot on the previous one restores the store.
#[test]
fn a_freeze_over_a_change_log_copies_only_the_groups_the_writer_scans() {
    let env = CachedEnv::new(MemoryEnv::new(), 256 << 20);
    let store = ChangeTracking::new(env.open_task(task()).unwrap(), BUCKETS, 2);
    let mut model = BTreeMap::new();
    apply(&store, &mut model, (0u32..4_000).map(|i| StateWrite::Put(key(i), vec![i as u8; 40])).collect());
    // What a copy of the entries of `buckets` holds: stored keys and values.
    let bytes_of = |model: &BTreeMap<StateKey, Vec<u8>>, buckets: &[u16]| -> u64 {
        let entries = model.iter().filter(|(k, _)| buckets.contains(&k.bucket));
        entries.map(|(k, v)| (KEY_HEADER_LEN + k.key.len() + v.len()) as u64).sum()
    };
    let dir = tempfile::tempdir().unwrap();
    let all: Vec<u16> = (0..BUCKETS).collect();
    // The first freeze has no base to build on: every group, every dirty entry.
    let first = store.freeze(&all).unwrap();
    assert_eq!(first.copied_bytes(), bytes_of(&model, &all));
    snapshot_frozen(first.as_ref(), BUCKETS, &dir.path().join("1"), 2, None).unwrap();
    // One key of bucket 2 (group 1) changes; every key of buckets 10 and 11 (group 5) is
    // rewritten, past the group's budget.
    apply(&store, &mut model, vec![StateWrite::Put(key(2), b"few".to_vec())]);
    let group5 = (0u32..4_000).filter(|i| matches!(i % 16, 10 | 11));
    apply(&store, &mut model, group5.map(|i| StateWrite::Put(key(i), vec![9; 60])).collect());
    let view = store.freeze(&all).unwrap();
    assert_eq!(view.copied_bytes(), bytes_of(&model, &[10, 11]), "only the whole group's dirty entries");
    for bucket in [2, 9, 12] {
        let err = view.scan_bucket(bucket, &mut |_, _| Ok(())).unwrap_err();
        assert!(matches!(err, StateError::NotFrozen { bucket: b, .. } if b == bucket), "{err}");
    }
    let stats =
        snapshot_frozen(view.as_ref(), BUCKETS, &dir.path().join("2"), 2, Some(&dir.path().join("1")));
    let stats = stats.unwrap();
    assert_eq!((stats.scanned_groups, stats.delta_parts, stats.shared_parts), (1, 1, 7), "{stats:?}");
    assert_eq!(restored(&dir.path().join("2")), model, "the checkpoint restores the store");
    assert_eq!(contents(&store), model);
}
