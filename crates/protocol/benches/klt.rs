//! Size and lookup cost of a receiver's key lookup table (KLT) after a hand-over
//! (docs/testing.md §7). Print-only, not part of the tests:
//!
//! ```text
//! cargo bench -p koala-protocol --bench klt                        # 1 M and 10 M keys
//! cargo bench -p koala-protocol --bench klt -- --keys 1M,10M,100M  # 100 M: synthetic hashes
//! ```
//!
//! A scale-out 1 → 2 of 128 buckets: task A owns them all; the buckets 64..128, holding K keys,
//! are handed over to the new task B while A stays live, and A's membership filters of those
//! buckets (built in the background after the hand-over) have arrived at B. For each K the table
//! shows B's KLT in these shapes:
//! - *untouched*: just after the filters arrived; no key accessed yet.
//! - *fetched*: every handed-over key accessed once (fetched from A and installed at B, where the
//!   store answers first: no entry).
//! - *new keys*: K keys that never existed anywhere arrive at B's buckets after the hand-over: a key
//!   outside A's filter is created at B without a round trip; a false positive asks A, which
//!   answers "not here", and costs an entry.
//! - *demo mix*: after the new keys, lookups as in the demo after its scale-out: 30 % of them
//!   100 hot keys that A held and B has fetched (A's filter names them, B's memo knows them),
//!   70 % new keys (its bytes and round trips are the *new keys* row's).
//!
//! Bytes are [`KeyLookupTable::approx_bytes`] (filters, entry maps and per-bucket layers), per
//! handed-over key (untouched, fetched) or per new key. A lookup is what a batch does for a key
//! (`koala/task/pipeline.rs`): the KLT first, and for a key it names B's own store (here a hash set
//! standing in for it), for a pre-hashed key drawn at random from the shape's keys (the
//! handed-over ones, and for *new keys* the new ones too). It is timed twice: warm, 1 M lookups
//! in a row, best of 5 rounds; and cold, in 2 000 batches of 32 keys with 16 MB written between
//! two batches — in a running job the other tasks of a worker evict the table between two
//! batches of one task, and the demo's lookups cost what this column shows, not the warm one.
//! Keys of K ≤ 10 M are record keys (a `u64`, in its canonical encoding) with the
//! real bucket and key hash; above, their hashes are synthetic.

use std::collections::{BTreeMap, HashSet};
use std::hint::black_box;
use std::time::{Duration, Instant};

use koala_protocol::koala::{BatchLookup, KeyFilter, KeyLookupTable, key_hash};
use koala_types::{BucketId, OperatorId, TaskId, bucket_of, encode};

const NUM_BUCKETS: u16 = 128;
/// The buckets handed over: the upper half, as a consistent scale-out 1 → 2 moves them.
const MOVED: std::ops::Range<BucketId> = NUM_BUCKETS / 2..NUM_BUCKETS;
const LOOKUPS: usize = 1_000_000;
/// Above this many keys, hashes are synthetic (no record key is encoded and hashed).
const REAL_KEYS_UP_TO: u64 = 10_000_000;

/// A key as the KLT sees it.
#[derive(Clone, Copy)]
struct Key {
    bucket: BucketId,
    hash: u64,
}

/// The `n` keys from `first` on that fall into the moved buckets (record keys or synthetic).
fn keys(first: u64, n: u64) -> Result<Vec<Key>, String> {
    let mut out = Vec::with_capacity(usize::try_from(n).map_err(|e| e.to_string())?);
    let mut i = first;
    while (out.len() as u64) < n {
        let key = if n <= REAL_KEYS_UP_TO {
            let bytes = encode(&i).map_err(|e| e.to_string())?;
            Key { bucket: bucket_of(&bytes, NUM_BUCKETS), hash: key_hash(&bytes) }
        } else {
            let hash = splitmix64(i);
            Key { bucket: (hash % u64::from(NUM_BUCKETS)) as BucketId, hash }
        };
        i += 1;
        if MOVED.contains(&key.bucket) {
            out.push(key);
        }
    }
    Ok(out)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// B's store, as the lookups see it: the hashes of the keys it holds.
type Local = HashSet<u64>;

/// Whether a key must be asked of another location, in the order a batch looks it up
/// (`koala/task/pipeline.rs`): a bucket with no layer is local; otherwise the keys the KLT names are
/// looked for in B's store, and a store miss is asked remotely.
fn remote(klt: &KeyLookupTable, local: &Local, key: Key, out: &mut Vec<TaskId>) -> bool {
    if klt.is_settled(key.bucket) {
        return false;
    }
    klt.lookup(key.bucket, key.hash, out);
    !out.is_empty() && !local.contains(&key.hash)
}

/// Lookups timed with warm caches, and batches timed with cold ones.
struct LookupNs {
    warm: f64,
    cold: f64,
}

/// Keys per batch in the cold timing (the demo's batches after its scale-out hold ~35).
const BATCH: usize = 32;
/// Batches in the cold timing.
const COLD_BATCHES: usize = 2_000;
/// Bytes written between two cold batches: more than this machine's L2 cache (2 MB) and than
/// its TLB reaches, as a running worker's other tasks touch between two batches of one task.
const EVICT_BYTES: usize = 16 << 20;

/// Mean ns per lookup of keys drawn from `keys`: `warm`, `LOOKUPS` in a row, best of 5 rounds;
/// `cold`, in `COLD_BATCHES` batches of `BATCH` with `EVICT_BYTES` written between two batches
/// (only the lookups timed, the clock read per batch, as the runtime does; a batch's keys are
/// looked up together, as `koala/task/pipeline.rs` does).
fn lookup_ns(klt: &KeyLookupTable, local: &Local, keys: &[&[Key]]) -> LookupNs {
    let total: usize = keys.iter().map(|k| k.len()).sum();
    let mut sample = Vec::with_capacity(LOOKUPS);
    for i in 0..LOOKUPS {
        let mut at = (splitmix64(i as u64) % total as u64) as usize;
        for part in keys {
            if at < part.len() {
                sample.push(part[at]);
                break;
            }
            at -= part.len();
        }
    }
    let mut best = Duration::MAX;
    let mut out = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        for k in &sample {
            black_box(remote(klt, local, black_box(*k), &mut out));
        }
        best = best.min(started.elapsed());
    }
    let mut evict = vec![0u8; EVICT_BYTES];
    let mut lookup = BatchLookup::default();
    let mut cold = Duration::ZERO;
    for (n, batch) in sample.chunks(BATCH).take(COLD_BATCHES).enumerate() {
        for line in evict.chunks_mut(64) {
            line[0] = line[0].wrapping_add(n as u8);
        }
        black_box(&evict);
        let started = Instant::now();
        // As a batch does (`koala/task/pipeline.rs`): the keys looked up together, then the store
        // asked about the keys the table names.
        lookup.clear();
        for k in batch {
            lookup.push(k.bucket, k.hash);
        }
        klt.lookup_batch(&mut lookup);
        for (i, _) in lookup.named() {
            black_box(batch.get(i).is_some_and(|k| !local.contains(&k.hash)));
        }
        cold += started.elapsed();
    }
    LookupNs {
        warm: best.as_secs_f64() * 1e9 / sample.len() as f64,
        cold: cold.as_secs_f64() * 1e9 / (COLD_BATCHES * BATCH).min(sample.len()) as f64,
    }
}

struct Row {
    keys: u64,
    shape: &'static str,
    entries: usize,
    round_trips: u64,
    bytes: usize,
    per_key_of: u64,
    lookup_ns: LookupNs,
}

fn print(row: &Row) {
    println!(
        "| {} | {} | {} | {} | {:.1} MB | {:.2} | {:.1} | {:.1} |",
        human(row.keys),
        row.shape,
        row.entries,
        row.round_trips,
        row.bytes as f64 / 1e6,
        row.bytes as f64 / row.per_key_of as f64,
        row.lookup_ns.warm,
        row.lookup_ns.cold
    );
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{} M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{} k", n / 1_000),
        n => n.to_string(),
    }
}

fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, scale) = match s.chars().last() {
        Some('M' | 'm') => (&s[..s.len() - 1], 1_000_000),
        Some('k' | 'K') => (&s[..s.len() - 1], 1_000),
        _ => (s, 1),
    };
    digits.parse::<u64>().map(|n| n * scale).map_err(|e| format!("bad key count {s:?}: {e}"))
}

/// One key count: the three shapes, each on a fresh hand-over.
fn measure(k: u64, a: TaskId, b: TaskId) -> Result<Vec<Row>, String> {
    let handed = keys(0, k)?;
    let mut by_bucket: BTreeMap<BucketId, Vec<u64>> = BTreeMap::new();
    for key in &handed {
        by_bucket.entry(key.bucket).or_default().push(key.hash);
    }
    let hand_over = |receiver: &mut KeyLookupTable| -> Result<(Duration, Duration), String> {
        let mut sender = KeyLookupTable::new(a, 0..NUM_BUCKETS);
        let started = Instant::now();
        let moved: Vec<BucketId> = MOVED.collect();
        let pending = receiver.install(sender.take(&moved, 1)).map_err(|e| e.to_string())?;
        let handed_over = started.elapsed();
        // A's background work: one filter per bucket, from the keys it holds.
        let started = Instant::now();
        for p in pending {
            let filter = KeyFilter::build(by_bucket.get(&p.bucket).cloned().unwrap_or_default());
            receiver.filter_arrived(p.location, p.bucket, p.since, filter);
        }
        Ok((handed_over, started.elapsed()))
    };
    let mut rows = Vec::new();

    let mut klt = KeyLookupTable::new(b, []);
    let (took, filters) = hand_over(&mut klt)?;
    eprintln!(
        "{} keys: hand-over (take + install of {} buckets) {took:?}; filters built in the background {filters:?}",
        human(k),
        MOVED.len()
    );
    let row = |shape, klt: &KeyLookupTable, round_trips, per_key_of, lookup_ns| Row {
        keys: k,
        shape,
        entries: klt.entries(),
        round_trips,
        bytes: klt.approx_bytes(),
        per_key_of,
        lookup_ns,
    };
    let mut local = Local::new();
    rows.push(row("untouched", &klt, 0, k, lookup_ns(&klt, &local, &[&handed])));

    // Every handed-over key fetched once: its state is in B's store now, which answers first.
    local.extend(handed.iter().map(|key| key.hash));
    rows.push(row("fetched", &klt, 0, k, lookup_ns(&klt, &local, &[&handed])));
    drop(klt);

    // K keys A never had: outside A's filter they are created at B; a false positive asks A
    // ("not here") and is recorded as local.
    let mut klt = KeyLookupTable::new(b, []);
    hand_over(&mut klt)?;
    let mut local = Local::new();
    let fresh = keys(1 << 40, k)?;
    let mut round_trips = 0;
    let mut out = Vec::new();
    for key in &fresh {
        if remote(&klt, &local, *key, &mut out) {
            round_trips += 1;
            klt.mark_local(key.bucket, key.hash);
        }
        local.insert(key.hash);
    }
    rows.push(row("new keys", &klt, round_trips, k, lookup_ns(&klt, &local, &[&handed, &fresh])));

    // The demo's mix after its scale-out: 30 % of lookups are 100 hot keys B holds since it
    // fetched them (its filters name them, its memo knows them), 70 % new keys. The hot keys'
    // share comes from repeating them: the draw is uniform over the slices.
    let hot: Vec<Key> = handed.iter().take(100).copied().collect();
    for key in &hot {
        klt.note_local(key.bucket, key.hash);
        local.insert(key.hash);
    }
    let new_part = &fresh[..fresh.len().min(1_000_000)];
    let hot_part: Vec<Key> = hot.iter().copied().cycle().take(new_part.len() * 3 / 7).collect();
    rows.push(row("demo mix", &klt, round_trips, k, lookup_ns(&klt, &local, &[&hot_part, new_part])));
    Ok(rows)
}

fn main() -> Result<(), String> {
    let mut counts = vec![1_000_000, 10_000_000];
    let mut args = std::env::args().skip(1);
    // cargo bench passes `--bench`; other flags and libtest filters mean nothing here.
    while let Some(arg) = args.next() {
        if arg == "--keys" {
            let list = args.next().ok_or("--keys needs a list, e.g. 1M,10M,100M")?;
            counts = list.split(',').map(parse_count).collect::<Result<_, _>>()?;
        }
    }
    let (a, b) = (TaskId::new(OperatorId(1), 0), TaskId::new(OperatorId(1), 1));
    println!(
        "| keys (K) | shape | explicit entries | \"not here\" round trips | KLT bytes | bytes per key (handed-over or new) | lookup ns per key | cold, per key of a batch |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for k in counts {
        for row in measure(k, a, b)? {
            print(&row);
        }
    }
    Ok(())
}
