//! Batched state I/O of one task on the fjall backend: 1000 keys × 100-byte values per batch,
//! the shape of a task's state access at a batch boundary. Print-only, not part of the tests.

#![expect(missing_docs, reason = "criterion_group! generates an undocumented pub fn")]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use koala_state::{FjallEnv, StateEnv, StateKey, StateWrite};
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

criterion_group!(benches, bench_fjall);
criterion_main!(benches);
