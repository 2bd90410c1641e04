//! `koala warmup`: large state fast (docs/architecture.md §5). Writes N keys of the job's keyed
//! aggregate, each value padded to a given size (the paper's Q6* pads to 2 KB), straight into a
//! snapshot per stateful operator — no records processed — so an experiment starts from
//! gigabytes in minutes, and every protocol's run restores the same state (config `warm_state`:
//! each worker loads the buckets its tasks own before the job starts).
//!
//! Only `keyed-aggregate` is supported: its "aggregate" operator keeps one `ValueState<(u64,
//! i64)>` (state id 0) per `u64` key; a warm key holds count 1 and sum = key, followed by
//! padding the operator's decoder ignores, and its first update writes it back unpadded.

use std::path::Path;

use anyhow::Context;
use koala_state::StateKey;
use koala_state::snapshot::SnapshotWriter;
use koala_types::{bucket_of, encode};

/// The queries `koala warmup` knows the state layout of.
pub const SUPPORTED: &[&str] = &["keyed-aggregate"];
/// The operator whose state it writes.
pub const OPERATOR: &str = "aggregate";
/// Part files of about this size.
const PART_BYTES: u64 = 64 << 20;

/// Writes `keys` warm keys (`0..keys`) with values of `value_bytes` into
/// `<out>/aggregate`, a snapshot; returns its entries and bytes.
pub fn warmup(
    query: &str,
    num_buckets: u16,
    keys: u64,
    value_bytes: usize,
    out: &Path,
) -> anyhow::Result<(u64, u64)> {
    anyhow::ensure!(
        SUPPORTED.contains(&query),
        "query = {query:?}: `koala warmup` knows the state layout of {} only",
        SUPPORTED.join(", ")
    );
    anyhow::ensure!(keys > 0, "--keys 0: give the number of warm keys, e.g. --keys 1000000");
    // Keys in stored order: by bucket, then by the encoded key (one state id).
    let mut order: Vec<(u16, Vec<u8>, u64)> = (0..keys)
        .map(|k| {
            let key = encode(&k).context("encoding a key")?;
            Ok((bucket_of(&key, num_buckets), key, k))
        })
        .collect::<anyhow::Result<_>>()?;
    order.sort_unstable();
    let dir = out.join(OPERATOR);
    let mut writer = SnapshotWriter::create(&dir, num_buckets, PART_BYTES)
        .with_context(|| format!("creating the snapshot in {}", dir.display()))?;
    for (bucket, key, k) in order {
        let mut value = encode(&(1u64, k as i64)).context("encoding a value")?;
        value.resize(value.len().max(value_bytes), 0xA5);
        writer.put(&StateKey { bucket, state: 0, key }, &value)?;
    }
    let stats = writer.finish()?;
    Ok((stats.entries, stats.bytes))
}
