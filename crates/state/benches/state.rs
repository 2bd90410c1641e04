//! Batched state I/O of one task: on the fjall backend, 1000 keys × 100-byte values per batch,
//! the shape of a task's state access at a batch boundary; behind the state cache, a batch of
//! 4096 distinct keys of 1 M resident ones with 8-byte values (a running count, the shape of
//! `koala bench`: the cache's hash table is far bigger than the CPU caches), read and written
//! back. Print-only, not part of the tests.

#![expect(missing_docs, reason = "criterion_group! generates an undocumented pub fn")]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use koala_state::{CachedEnv, FjallEnv, StateEnv, StateKey, StateWrite};
use koala_types::{DEFAULT_NUM_BUCKETS, OperatorId, TaskId, bucket_of};

const KEYS: u64 = 1000;
const VALUE_BYTES: usize = 100;

fn state_key(i: u64) -> StateKey {
    // Spread the user keys like hashed record keys would be.
    let user = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes();
    StateKey::new(bucket_of(&user, DEFAULT_NUM_BUCKETS), 0, user.to_vec())
}

fn writes(offset: u64) -> Vec<StateWrite> {
    (offset..offset + KEYS)
        .map(|i| StateWrite::Put(state_key(i), vec![(i % 251) as u8; VALUE_BYTES]))
        .collect()
}

fn bench_fjall(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("creating a temporary state directory");
    let env = FjallEnv::open(dir.path()).expect("opening the fjall state directory");
    let store = env.open_task(TaskId::new(OperatorId(1), 0)).expect("opening the task store");
    // 100 000 resident keys; the measured batches hit the first 1000 of them.
    for batch in 0..100 {
        store.write_many(writes(batch * KEYS)).expect("populating the store");
    }
    let hits: Vec<StateKey> = (0..KEYS).map(state_key).collect();
    let misses: Vec<StateKey> = (1_000_000..1_000_000 + KEYS).map(state_key).collect();

    let mut group = c.benchmark_group("fjall_1000x100B");
    group.throughput(Throughput::Elements(KEYS));
    group.bench_function("write_many_overwrite", |b| {
        b.iter_batched(
            || writes(0),
            |batch| store.write_many(batch).expect("write_many"),
            BatchSize::SmallInput,
        );
    });
    group.bench_function("get_many_hits", |b| {
        b.iter(|| black_box(store.get_many(&hits).expect("get_many")));
    });
    group.bench_function("get_many_misses", |b| {
        b.iter(|| black_box(store.get_many(&misses).expect("get_many")));
    });
    group.finish();
}

fn bench_cache(c: &mut Criterion) {
    const RESIDENT: u64 = 1_000_000;
    const BATCH: u64 = 4096;
    let dir = tempfile::tempdir().expect("creating a temporary state directory");
    let env =
        CachedEnv::new(FjallEnv::open(dir.path()).expect("opening the fjall state directory"), 512 << 20);
    let store = env.open_task(TaskId::new(OperatorId(1), 0)).expect("opening the task store");
    let count = |i: u64| StateWrite::Put(state_key(i), (i % 1000).to_le_bytes().to_vec());
    for start in (0..RESIDENT).step_by(BATCH as usize) {
        store.write_many((start..(start + BATCH).min(RESIDENT)).map(count).collect()).expect("populating");
    }
    // Batches of keys spread over the whole key space, a different batch each iteration.
    let mut next = 0u64;
    let mut batch = move || {
        next += 1;
        (0..BATCH)
            .map(|i| state_key((next.wrapping_mul(7919) + i.wrapping_mul(1_000_003)) % RESIDENT))
            .collect::<Vec<_>>()
    };
    let mut group = c.benchmark_group("cache_1M_keys_batch_4096");
    group.throughput(Throughput::Elements(BATCH));
    group.bench_function("get_many_hits", |b| {
        b.iter_batched(
            &mut batch,
            |keys| black_box(store.get_many(&keys).expect("get_many")),
            BatchSize::SmallInput,
        );
    });
    group.bench_function("get_many_then_write_many", |b| {
        b.iter_batched(
            &mut batch,
            |keys| {
                let values = store.get_many(&keys).expect("get_many");
                let writes = keys
                    .into_iter()
                    .zip(values)
                    .map(|(key, value)| {
                        let n = value.map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap_or_default()));
                        StateWrite::Put(key, (n + 1).to_le_bytes().to_vec())
                    })
                    .collect();
                store.write_many(writes).expect("write_many");
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

criterion_group!(benches, bench_fjall, bench_cache);
criterion_main!(benches);
