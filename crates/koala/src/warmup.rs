//! `koala warmup`: large state fast (docs/architecture.md §5). Writes N warm keys of a query's
//! stateful operators, each value padded to a given size (the paper's Q6* pads to 2 KB),
//! straight into a snapshot per operator (`<out>/<operator>`) — no records processed — so an
//! experiment starts from gigabytes in seconds, and every protocol's run restores the same state
//! (config `warm_state`: each worker loads the buckets its tasks own before the job starts).
//!
//! The state layouts are the operators' own (`koala_workloads::warm`, which lists the queries
//! it knows: [`koala_workloads::warm::WARM_QUERIES`]). Windowed and timer operators are not
//! among them: their state is bound to event time and pending timers.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use koala_state::StateKey;
use koala_state::snapshot::SnapshotWriter;
use koala_types::bucket_of;
use koala_workloads::warm::{WARM_QUERIES, WarmEntry, entries};

/// Part files of about this size.
const PART_BYTES: u64 = 64 << 20;

/// What one operator's snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// The operator.
    pub operator: &'static str,
    /// State entries.
    pub entries: u64,
    /// Bytes of keys and values.
    pub bytes: u64,
}

/// Writes `keys` warm keys (`0..keys`) of `query` under `params` (its `[params]` table as TOML
/// text) with values padded to `value_bytes` into `<out>/<operator>` for each of its stateful
/// operators; returns what each snapshot holds.
pub fn warmup(
    query: &str,
    params: &str,
    num_buckets: u16,
    keys: u64,
    value_bytes: usize,
    out: &Path,
) -> anyhow::Result<Vec<Written>> {
    let supported = || WARM_QUERIES.iter().map(|(q, _)| *q).collect::<Vec<_>>().join(", ");
    anyhow::ensure!(
        WARM_QUERIES.iter().any(|(q, _)| *q == query),
        "query = {query:?}: `koala warmup` knows the state layout of {} only (windowed and timer operators hold event-time state it cannot make up)",
        supported()
    );
    anyhow::ensure!(keys > 0, "--keys 0: give the number of warm keys, e.g. --keys 1000000");
    let parsed = crate::queries::find(query)
        .map_err(anyhow::Error::msg)?
        .warm_params(params)
        .map_err(anyhow::Error::msg)?;
    let warm = parsed.as_warm().with_context(|| format!("query {query:?} has no warm layout"))?;
    let generate = |k: u64, value_bytes: usize, buf: &mut Vec<WarmEntry>| -> anyhow::Result<()> {
        buf.clear();
        entries(query, &warm, k, value_bytes, buf)
            .with_context(|| format!("query {query:?} has no warm layout"))?
            .context("encoding warm state")
    };
    // Pass 1: every entry's place in stored order (operator, bucket, state id, key), from
    // unpadded values; pass 2 writes each padded value in that order.
    let mut order: Vec<(&'static str, u16, u8, Vec<u8>, u64)> = Vec::new();
    let mut buf = Vec::new();
    for k in 0..keys {
        generate(k, 0, &mut buf)?;
        for e in buf.drain(..) {
            order.push((e.operator, bucket_of(&e.key, num_buckets), e.state, e.key, k));
        }
    }
    order.sort_unstable();
    let mut writers: BTreeMap<&'static str, SnapshotWriter> = BTreeMap::new();
    for (operator, bucket, state, key, k) in order {
        generate(k, value_bytes, &mut buf)?;
        let entry = buf
            .iter()
            .find(|e| e.operator == operator && e.state == state)
            .context("warm entries changed between passes (a layout bug)")?;
        let writer = match writers.entry(operator) {
            std::collections::btree_map::Entry::Occupied(w) => w.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                let dir = out.join(operator);
                v.insert(
                    SnapshotWriter::create(&dir, num_buckets, PART_BYTES)
                        .with_context(|| format!("creating the snapshot in {}", dir.display()))?,
                )
            }
        };
        writer.put(&StateKey { bucket, state, key }, &entry.value)?;
    }
    let mut written = Vec::new();
    for (operator, writer) in writers {
        let stats = writer.finish()?;
        written.push(Written { operator, entries: stats.entries, bytes: stats.bytes });
    }
    Ok(written)
}

/// A note when the job's `state_padding_bytes` (its `[params]` as TOML text) is not the warm
/// values' `value_bytes`: the operators pad each key they touch to `state_padding_bytes`, so
/// those keys would change size before a reconfiguration moves them.
pub fn padding_note(params: &str, value_bytes: usize) -> Option<String> {
    let table: toml::Table = params.parse().ok()?;
    let padding = table.get("state_padding_bytes").and_then(toml::Value::as_integer).unwrap_or(0);
    (usize::try_from(padding).ok() != Some(value_bytes)).then(|| {
        format!(
            "note: the job's state_padding_bytes is {padding}, the warm values' padding {value_bytes} B: \
             each key the job touches will be re-padded to {padding} B; set `state_padding_bytes = \
             {value_bytes}` under [params] to keep warm keys their size"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_padding_other_than_the_warm_bytes_is_pointed_out() {
        assert_eq!(padding_note("state_padding_bytes = 2048\n", 2048), None);
        let note = padding_note("sink = \"discard\"\n", 2048).expect("0 ≠ 2048");
        assert!(note.contains("state_padding_bytes = 2048"), "{note}");
        assert!(padding_note("state_padding_bytes = 256\n", 2048).is_some_and(|n| n.contains("256")));
    }

    #[test]
    fn a_query_without_a_warm_layout_is_refused_with_the_list() {
        let dir = std::env::temp_dir().join(format!("koala-warmup-refused-{}", std::process::id()));
        let err = warmup("nexmark-q5", "", 128, 10, 8, &dir).expect_err("windowed: no layout").to_string();
        assert!(
            err.contains("nexmark-q5") && err.contains("twitch") && err.contains("nexmark-q6star"),
            "{err}"
        );
        assert!(!dir.exists(), "nothing written");
        let err = warmup("borg", "recnt = 3\n", 128, 10, 8, &dir).expect_err("typo").to_string();
        assert!(err.contains("recnt"), "{err}");
    }

    #[test]
    fn every_operator_gets_a_snapshot_in_stored_order() {
        let dir = std::env::temp_dir().join(format!("koala-warmup-twitch-{}", std::process::id()));
        let written = warmup("twitch", "[generator]\nkeys = 50\n", 16, 200, 8, &dir).expect("writes");
        let ops: Vec<(&str, u64)> = written.iter().map(|w| (w.operator, w.entries)).collect();
        assert_eq!(ops, vec![("engagement", 200), ("loyalty", 50)]);
        assert!(dir.join("engagement/manifest").exists() && dir.join("loyalty/manifest").exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}
