//! `koala experiment klt` (Figure 14, §5.4): the key lookup table's lookup time per input batch
//! and its memory per key as the key count grows — a micro-benchmark inside the command, on the
//! protocol's own table (`koala_protocol::koala::KeyLookupTable`), no job run.
//!
//! A 4 → 8 scale-out of K keys over the default 128 buckets under the interleaved policy: old
//! task `i` owns buckets `b mod 4 = i`, new task `i + 4` receives those with `b mod 8 = i + 4` —
//! half of old task `i`'s buckets, K / 8 keys — with the sender's membership filters of them. The
//! four receivers are alike; one is built from real keys (`u64` 0..K in their canonical encoding,
//! bucket and hash as a record gets them). Its memory is [`KeyLookupTable::approx_bytes`]; the
//! average per task counts the four senders, which own their remaining buckets outright. The
//! lookup: batches of `batch_records` (256, the runtime's default) keys drawn from the handed-over
//! ones (drawn before the clock starts), looked up together as a batch does (`lookup_batch`), with 16 MB written between two
//! batches so the table is cold, as the other tasks of a worker leave it between two batches of
//! one task.

use std::hint::black_box;
use std::time::{Duration, Instant};

use koala_protocol::koala::{BatchLookup, KeyFilter, KeyLookupTable, bucket_and_key_hash};
use koala_types::{BucketId, DEFAULT_NUM_BUCKETS, OperatorId, TaskId, encode};

use super::engine::Table;
use super::{Info, Mode, Options, Runner};

/// Keys per batch: the runtime's default `batch_records`.
const BATCH: usize = 256;
/// Batches timed per key count.
const BATCHES: usize = 2_000;
/// Bytes written between two timed batches.
const EVICT_BYTES: usize = 16 << 20;

struct Row {
    keys: u64,
    handed: usize,
    receiver_bytes: usize,
    sender_bytes: usize,
    batch_us: f64,
    batch_median_us: f64,
    batch_p99_us: f64,
}

fn measure(keys: u64) -> anyhow::Result<Row> {
    let nb = DEFAULT_NUM_BUCKETS;
    let (a, b) = (TaskId::new(OperatorId(1), 0), TaskId::new(OperatorId(1), 4));
    let moved: Vec<BucketId> = (0..nb).filter(|x| x % 8 == 4).collect();
    let mut by_bucket: Vec<Vec<u64>> = vec![Vec::new(); usize::from(nb)];
    let mut handed: Vec<(BucketId, u64)> = Vec::new();
    for k in 0..keys {
        let (bucket, hash) = bucket_and_key_hash(&encode(&k)?, nb);
        if bucket % 8 == 4 {
            by_bucket[usize::from(bucket)].push(hash);
            handed.push((bucket, hash));
        }
    }
    let mut sender = KeyLookupTable::new(a, (0..nb).filter(|x| x % 4 == 0));
    let mut receiver = KeyLookupTable::new(b, []);
    let pending = receiver.install(sender.take(&moved, 1)).map_err(|e| anyhow::anyhow!("{e}"))?;
    for p in pending {
        let filter = KeyFilter::build(std::mem::take(&mut by_bucket[usize::from(p.bucket)]));
        receiver.filter_arrived(p.location, p.bucket, p.since, filter);
    }
    let mut evict = vec![0u8; EVICT_BYTES];
    let mut lookup = BatchLookup::default();
    let mut times = Vec::with_capacity(BATCHES);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut batch: Vec<(BucketId, u64)> = Vec::with_capacity(BATCH);
    for n in 0..BATCHES {
        // The batch's keys, drawn uniformly from the handed-over ones (xorshift) before the
        // clock starts: a task's batch arrives decoded, its keys hashed.
        batch.clear();
        for _ in 0..BATCH {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            batch.push(handed[(x % handed.len().max(1) as u64) as usize]);
        }
        for line in evict.chunks_mut(64) {
            line[0] = line[0].wrapping_add(n as u8);
        }
        black_box(&evict);
        let started = Instant::now();
        lookup.clear();
        for (bucket, hash) in &batch {
            lookup.push(*bucket, *hash);
        }
        receiver.lookup_batch(&mut lookup);
        black_box(lookup.named().count());
        times.push(started.elapsed());
    }
    times.sort_unstable();
    let mean = times.iter().sum::<Duration>().as_secs_f64() / times.len() as f64;
    let median = times[times.len() / 2].as_secs_f64();
    let p99 = times[times.len() * 99 / 100].as_secs_f64();
    Ok(Row {
        keys,
        handed: handed.len(),
        receiver_bytes: receiver.approx_bytes(),
        sender_bytes: sender.approx_bytes(),
        batch_us: mean * 1e6,
        batch_median_us: median * 1e6,
        batch_p99_us: p99 * 1e6,
    })
}

fn run(info: &Info, mode: Mode, opts: &Options) -> anyhow::Result<()> {
    if opts.protocols.as_ref().is_some_and(|p| p.iter().any(|p| p != "koala")) {
        anyhow::bail!("--protocols: experiment klt measures Koala's key lookup table only; drop --protocols");
    }
    let counts: Vec<u64> = mode.pick(
        vec![20_000, 160_000],
        vec![1_000_000, 2_000_000, 4_000_000, 8_000_000],
        vec![5_000_000, 10_000_000, 20_000_000, 40_000_000],
    );
    let out = &opts.out;
    std::fs::create_dir_all(out)?;
    let head = vec![
        format!("koala experiment klt ({}, {}): {}", mode.name(), info.figure, info.shows),
        format!(
            "a 4 → 8 scale-out over {DEFAULT_NUM_BUCKETS} buckets (interleaved): each new task receives K / 8 keys with its sender's filters; key counts {counts:?}"
        ),
        format!(
            "lookup: {BATCHES} batches of {BATCH} handed-over keys each (lookup_batch, as a batch does), {} MB written between two batches (cold table)",
            EVICT_BYTES >> 20
        ),
    ];
    for line in &head {
        println!("{line}");
    }
    let mut rows = Vec::new();
    for k in &counts {
        let started = Instant::now();
        let r = measure(*k)?;
        println!(
            "{k} keys: receiver KLT {} B for {} keys ({:.2} B per key), batch lookup {:.1} µs mean, {:.1} median (p99 {:.1}) [{:.1} s]",
            r.receiver_bytes,
            r.handed,
            r.receiver_bytes as f64 / r.handed.max(1) as f64,
            r.batch_us,
            r.batch_median_us,
            r.batch_p99_us,
            started.elapsed().as_secs_f64()
        );
        rows.push(r);
    }
    let table = Table {
        columns: vec![
            "keys (K)",
            "keys per receiver",
            "receiver KLT",
            "B per handed-over key",
            "mean KLT per task (8)",
            "lookup per batch (mean)",
            "median",
            "p99",
            "per key (median)",
        ],
        rows: rows
            .iter()
            .map(|r| {
                vec![
                    r.keys.to_string(),
                    r.handed.to_string(),
                    crate::human::human_bytes(r.receiver_bytes as u64),
                    format!("{:.2}", r.receiver_bytes as f64 / r.handed.max(1) as f64),
                    crate::human::human_bytes(((4 * r.receiver_bytes + 4 * r.sender_bytes) / 8) as u64),
                    format!("{:.1} µs", r.batch_us),
                    format!("{:.1} µs", r.batch_median_us),
                    format!("{:.1} µs", r.batch_p99_us),
                    format!("{:.0} ns", r.batch_median_us * 1e3 / BATCH as f64),
                ]
            })
            .collect(),
    };
    let mut conclusions = Vec::new();
    if let Some(last) = rows.last() {
        let per_key = last.receiver_bytes as f64 / last.handed.max(1) as f64;
        conclusions.push(format!(
            "at {} keys: {:.1} µs per batch of {BATCH} (median; mean {:.1}) — {} 40 µs, the paper's bound — and {per_key:.2} B per handed-over key ({} 2 B); times on a shared machine include preemptions, which the mean and p99 show",
            last.keys,
            last.batch_median_us,
            last.batch_us,
            if last.batch_median_us < 40.0 { "under" } else { "over" },
            if per_key <= 2.0 { "within" } else { "over" }
        ));
    }
    println!("{}", table.text());
    for line in &conclusions {
        println!("{line}");
    }
    let mut csv = table.columns.join(",");
    for r in &table.rows {
        csv.push('\n');
        csv.push_str(&r.join(","));
    }
    csv.push('\n');
    let csv_path = out.join("summary.csv");
    std::fs::write(&csv_path, csv)?;
    let page = super::page::Page {
        info,
        mode,
        head: &head,
        table: &table,
        conclusions: &conclusions,
        plots: &[],
        csvs: &[csv_path],
        runs: &[],
        failed: &[],
    };
    let index = page.write(out)?;
    println!("page: {}", index.display());
    Ok(())
}

/// `koala experiment klt`.
pub const KLT: Info = Info {
    name: "klt",
    figure: "Figure 14",
    shows: "the key lookup table's lookup time per batch and memory per key as the key count grows (a micro-benchmark of the protocol's table, no job)",
    quick: "1 M → 8 M keys: under a minute",
    full: "5 M → 40 M keys (the paper's sizes): a few minutes",
    protocols: &["koala"],
    runner: Runner::Own(run),
};
