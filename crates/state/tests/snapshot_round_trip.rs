//! Snapshots round-trip a task's store exactly, on both backends: every entry back with its
//! value, nothing more; a restore can take only some buckets; a damaged part is refused.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use koala_state::snapshot::{SnapshotError, read_manifest, restore, snapshot};
use koala_state::{FjallEnv, MemoryEnv, StateBackend, StateEnv, StateKey, StateWrite};
use koala_types::{OperatorId, TaskId};

const BUCKETS: u16 = 16;

fn task(i: u32) -> TaskId {
    TaskId::new(OperatorId(3), i)
}

/// 2 000 entries over every bucket and two state ids, values of 0–300 bytes (some empty), and
/// some deleted again, so the store holds tombstones a snapshot must not carry.
fn fill(store: &dyn StateBackend) -> BTreeMap<StateKey, Vec<u8>> {
    let mut model = BTreeMap::new();
    let mut writes = Vec::new();
    for i in 0u32..2_000 {
        let key =
            StateKey::new((i % u32::from(BUCKETS)) as u16, (i % 2) as u8, format!("key-{i}").into_bytes());
        let value: Vec<u8> = (0..(i * 7 % 301)).map(|b| (b ^ i) as u8).collect();
        model.insert(key.clone(), value.clone());
        writes.push(StateWrite::Put(key, value));
    }
    for i in (0u32..2_000).step_by(9) {
        let key =
            StateKey::new((i % u32::from(BUCKETS)) as u16, (i % 2) as u8, format!("key-{i}").into_bytes());
        model.remove(&key);
        writes.push(StateWrite::Delete(key));
    }
    store.write_many(writes).unwrap();
    model
}

fn contents(store: &dyn StateBackend) -> BTreeMap<StateKey, Vec<u8>> {
    let mut out = BTreeMap::new();
    let all: Vec<u16> = (0..BUCKETS).collect();
    store
        .scan_buckets(&all, 4096, &mut |chunk| {
            out.extend(chunk);
            Ok(())
        })
        .unwrap();
    out
}

fn round_trip(env: &dyn StateEnv) {
    let original = env.open_task(task(0)).unwrap();
    let model = fill(original.as_ref());
    assert_eq!(contents(original.as_ref()), model);
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    // Small parts: the snapshot is cut into several, each a contiguous bucket range.
    let taken = snapshot(original.as_ref(), BUCKETS, &snap, 16 * 1024).unwrap();
    assert_eq!(taken.entries, model.len() as u64);
    let manifest = read_manifest(&snap).unwrap();
    assert!(manifest.parts.len() > 3, "expected several parts, got {}", manifest.parts.len());
    for pair in manifest.parts.windows(2) {
        assert!(pair[0].buckets.1 < pair[1].buckets.0, "parts overlap: {pair:?}");
    }

    let copy = env.open_task(task(1)).unwrap();
    let restored = restore(copy.as_ref(), &snap, None).unwrap();
    assert_eq!(restored, taken);
    assert_eq!(contents(copy.as_ref()), model, "the copy differs from the original");

    // Only some buckets: exactly their entries.
    let some: BTreeSet<u16> = [1, 5, 6, 15].into();
    let partial = env.open_task(task(2)).unwrap();
    restore(partial.as_ref(), &snap, Some(&some)).unwrap();
    let expected: BTreeMap<_, _> =
        model.iter().filter(|(k, _)| some.contains(&k.bucket)).map(|(k, v)| (k.clone(), v.clone())).collect();
    assert!(!expected.is_empty());
    assert_eq!(contents(partial.as_ref()), expected);

    // A snapshot never overwrites another.
    let again = snapshot(original.as_ref(), BUCKETS, &snap, 16 * 1024);
    assert!(matches!(again, Err(SnapshotError::Corrupt { .. })), "{again:?}");

    // One flipped byte in a part is refused, naming the part.
    let part = snap.join(&manifest.parts[1].file);
    let mut bytes = std::fs::read(&part).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&part, bytes).unwrap();
    let damaged = restore(env.open_task(task(3)).unwrap().as_ref(), &snap, None).unwrap_err();
    assert!(damaged.to_string().contains(&manifest.parts[1].file), "{damaged}");
}

#[test]
fn a_fjall_store_round_trips_exactly() {
    let dir = tempfile::tempdir().unwrap();
    round_trip(&FjallEnv::open(dir.path()).unwrap());
}

#[test]
fn a_memory_store_round_trips_exactly() {
    round_trip(&MemoryEnv::new());
}

#[test]
fn an_empty_store_makes_an_empty_snapshot() {
    let env = MemoryEnv::new();
    let store = env.open_task(task(0)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let taken = snapshot(store.as_ref(), BUCKETS, dir.path(), 1 << 20).unwrap();
    assert_eq!((taken.entries, read_manifest(dir.path()).unwrap().parts.len()), (0, 0));
    assert_eq!(restore(store.as_ref(), dir.path(), None).unwrap().entries, 0);
}

/// Measurement tool, not a test (docs/testing.md §7): fills a fjall store with
/// `KOALA_SNAPSHOT_MB` MB (default 256) of 2 KB values (the paper's Q6* padding; `KOALA_SNAPSHOT_VALUE`
/// changes it) over 128 buckets, snapshots it, restores it into a fresh store of a fresh
/// environment, and prints the time of each step. Checks only that the restore holds every entry.
#[test]
#[ignore = "measurement tool; run in release, see docs/testing.md §7"]
fn snapshot_restore_rate() {
    let env_or =
        |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (mb, value_bytes) = (env_or("KOALA_SNAPSHOT_MB", 256), env_or("KOALA_SNAPSHOT_VALUE", 2048));
    let keys = mb * 1_000_000 / value_bytes;
    let dir = tempfile::tempdir().unwrap();
    let source_env = FjallEnv::open(dir.path().join("source")).unwrap();
    let store = source_env.open_task(task(0)).unwrap();
    let started = std::time::Instant::now();
    for chunk in (0..keys).collect::<Vec<_>>().chunks(4096) {
        let writes = chunk
            .iter()
            .map(|&i| {
                let key = (i as u64).to_le_bytes().to_vec();
                let bucket = koala_types::bucket_of(&key, 128);
                let mut value = vec![(i % 251) as u8; value_bytes];
                value[..8].copy_from_slice(&(i as u64).to_le_bytes());
                StateWrite::Put(StateKey::new(bucket, 0, key), value)
            })
            .collect();
        store.write_many(writes).unwrap();
    }
    let filled = started.elapsed();
    let started = std::time::Instant::now();
    let snap = dir.path().join("snapshot");
    let taken = snapshot(store.as_ref(), 128, &snap, 64 << 20).unwrap();
    let snapshotted = started.elapsed();
    drop(store);
    drop(source_env);
    let target_env = FjallEnv::open(dir.path().join("target")).unwrap();
    let target = target_env.open_task(task(1)).unwrap();
    let started = std::time::Instant::now();
    let restored = restore(target.as_ref(), &snap, None).unwrap();
    let restore_time = started.elapsed();
    assert_eq!(restored.entries, keys as u64);
    let probe: Vec<StateKey> = [0usize, keys / 2, keys - 1]
        .iter()
        .map(|&i| {
            let key = (i as u64).to_le_bytes().to_vec();
            StateKey::new(koala_types::bucket_of(&key, 128), 0, key)
        })
        .collect();
    assert!(target.get_many(&probe).unwrap().iter().all(Option::is_some));
    let gb = taken.bytes as f64 / 1e9;
    println!(
        "{keys} keys × {value_bytes} B = {gb:.2} GB in {} parts: fill {:.1} s, snapshot {:.1} s, restore {:.1} s ({:.0} MB/s)",
        read_manifest(&snap).unwrap().parts.len(),
        filled.as_secs_f64(),
        snapshotted.as_secs_f64(),
        restore_time.as_secs_f64(),
        taken.bytes as f64 / 1e6 / restore_time.as_secs_f64()
    );
}
