//! Incremental snapshots, the form a task's checkpoint part takes (docs/architecture.md §10):
//! one full part per group of consecutive buckets, then, per group, the delta parts written since
//! that full part. A checkpoint links the files of its task's previous part that still hold and
//! writes only what changed:
//!
//! - a group the store's change log ([`crate::changes`]) says is unchanged: its files are
//!   hard-linked, nothing is read;
//! - a group with a few logged changes: its files are linked and a delta part with the logged
//!   entries (puts and deletes) is appended — until the group's deltas pass half of its full
//!   part (or [`MAX_DELTAS`] files), when it is *compacted*: rewritten whole from the frozen view,
//!   at most a quarter of the groups per checkpoint so compaction spreads over checkpoints. Which
//!   groups compact is decided after each snapshot, from its parts, and told to the change log
//!   ([`crate::changes::GroupBudgets::set_compact`]) so the next freeze covers them;
//! - a group that changed a lot, or any group of a view without a change log: scanned from the
//!   frozen view and written whole — hard-linked from the previous part instead when it comes
//!   out identical (same buckets, entries, bytes and xxh3).
//!
//! A view over a change log covers only the groups scanned ([`crate::changes::Changes::frozen`]):
//! a base file of another group that cannot be linked fails the snapshot (the state of that group
//! was not frozen), where a view without a log falls back to scanning it.
//!
//! Deleting an old checkpoint's directory deletes only the files no later one links.

use std::fs::File;
use std::path::{Path, PathBuf};

use koala_types::BucketId;

use super::{
    Manifest, Part, PartKind, PartWriter, SnapshotError, SnapshotWriter, io, read_manifest, write_manifest,
};
use crate::StateError;
use crate::changes::GroupChanges;
use crate::frozen::FrozenView;

/// Most delta parts a group keeps before it is compacted.
pub const MAX_DELTAS: usize = 8;

/// Delta bytes a group may always accumulate before it is compacted (more when its full part
/// is large: half of it).
const MIN_DELTA_BYTES: u64 = 64 << 10;

/// What [`snapshot_frozen`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IncrementalStats {
    /// Entries in the snapshot's full and delta parts (a key changed in a delta counts again).
    pub entries: u64,
    /// Bytes of its part files (written or shared).
    pub bytes: u64,
    /// Bytes of the part files written anew (the rest is shared with the base).
    pub written_bytes: u64,
    /// Part files shared with the base (hard links), of `parts` in all.
    pub shared_parts: u64,
    /// Part files in the snapshot.
    pub parts: u64,
    /// Delta parts written anew.
    pub delta_parts: u64,
    /// Groups read from the frozen view (written whole).
    pub scanned_groups: u64,
}

/// What a group gets in this snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Its previous files, linked.
    Link,
    /// Its previous files, linked, and a delta part of the logged changes.
    Delta,
    /// Read from the view and written whole.
    Scan,
}

/// The snapshot being assembled.
struct Assembly<'a> {
    dir: &'a Path,
    parts: Vec<Part>,
    unsynced: Vec<(File, PathBuf)>,
    stats: IncrementalStats,
}

impl Assembly<'_> {
    /// Hard-links `from` as the next part (its manifest entry `part`); false if it cannot.
    fn link(&mut self, from: &Path, part: &Part) -> bool {
        let file = format!("part-{:05}.kv", self.parts.len());
        let path = self.dir.join(&file);
        let link = path.with_extension("link");
        let linked = std::fs::hard_link(from, &link).and_then(|()| std::fs::rename(&link, &path)).is_ok();
        if linked {
            self.stats.shared_parts += 1;
            self.add(Part { file, ..part.clone() });
        }
        linked
    }

    /// Closes `writer` as the next part: linked from `same` (the base's identical part) when
    /// there is one, else kept and synced at the end.
    fn close(
        &mut self,
        writer: PartWriter,
        base: Option<&(PathBuf, Vec<Part>)>,
    ) -> Result<(), SnapshotError> {
        let (part, file, path) = writer.finish_unsynced()?;
        let same = base.and_then(|(dir, parts)| {
            parts
                .iter()
                .find(|p| {
                    (p.kind, p.buckets, p.entries, p.bytes, p.checksum)
                        == (part.kind, part.buckets, part.entries, part.bytes, part.checksum)
                })
                .map(|p| dir.join(&p.file))
        });
        let linked = same.is_some_and(|from| {
            let link = path.with_extension("link");
            std::fs::hard_link(from, &link).and_then(|()| std::fs::rename(&link, &path)).is_ok()
        });
        if linked {
            self.stats.shared_parts += 1;
        } else {
            self.unsynced.push((file, path));
            self.stats.written_bytes += part.bytes;
        }
        self.add(part);
        Ok(())
    }

    fn add(&mut self, part: Part) {
        self.stats.entries += part.entries;
        self.stats.bytes += part.bytes;
        self.parts.push(part);
    }

    /// Writes buckets `range` whole from `view`.
    fn scan(
        &mut self,
        view: &dyn FrozenView,
        range: std::ops::Range<BucketId>,
        base: Option<&(PathBuf, Vec<Part>)>,
    ) -> Result<(), SnapshotError> {
        self.stats.scanned_groups += 1;
        let (dir, index) = (self.dir, self.parts.len());
        let mut part: Option<PartWriter> = None;
        let mut failed = None;
        for bucket in range {
            let scanned = view.scan_bucket(bucket, &mut |key, value| {
                let writer = match part.as_mut() {
                    Some(w) => w,
                    None => match PartWriter::create(dir, index, bucket) {
                        Ok(w) => part.insert(w),
                        Err(e) => return Err(StateError::sink(failed.insert(e).to_string())),
                    },
                };
                writer.write(bucket, key, value).map_err(|e| StateError::sink(failed.insert(e).to_string()))
            });
            if let Err(e) = scanned {
                return Err(failed.take().unwrap_or(SnapshotError::State(e)));
            }
        }
        match part {
            Some(part) => self.close(part, base),
            None => Ok(()),
        }
    }

    /// Writes the logged `entries` of a group as a delta part.
    fn delta(
        &mut self,
        entries: &std::collections::HashMap<Vec<u8>, Option<Vec<u8>>>,
    ) -> Result<(), SnapshotError> {
        let mut sorted: Vec<_> = entries.iter().collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let bucket_of = |key: &[u8]| if key.len() >= 2 { u16::from_be_bytes([key[0], key[1]]) } else { 0 };
        let Some(first) = sorted.first().map(|(k, _)| bucket_of(k)) else { return Ok(()) };
        let mut writer = PartWriter::create(self.dir, self.parts.len(), first)?;
        writer.part.kind = PartKind::Delta;
        for (key, value) in sorted {
            writer.write_entry(bucket_of(key), key, value.as_deref())?;
        }
        self.stats.delta_parts += 1;
        self.close(writer, None)
    }
}

/// Writes a snapshot of `view` (buckets `0..num_buckets`) into `dir` (created; it must not hold
/// one), one full part per group of `group_buckets` consecutive buckets (empty groups have none)
/// followed by the group's delta parts: the layout [`super::restore`] reads. `base`: the task's
/// previous snapshot, whose files are shared (see the module docs); a base that cannot be read
/// or linked from (deleted meanwhile) only costs the sharing — the group is then written whole.
pub fn snapshot_frozen(
    view: &dyn FrozenView,
    num_buckets: u16,
    dir: &Path,
    group_buckets: u16,
    base: Option<&Path>,
) -> Result<IncrementalStats, SnapshotError> {
    let writer = SnapshotWriter::create(dir, num_buckets, u64::MAX)?;
    let group = group_buckets.max(1);
    let groups = usize::from(num_buckets.div_ceil(group));
    let base: Option<(PathBuf, Manifest)> = base
        .and_then(|b| read_manifest(b).ok().map(|m| (b.to_path_buf(), m)))
        .filter(|(_, m)| m.num_buckets == num_buckets);
    // The base's parts of each group, in the order they apply.
    let mut by_group: Vec<Vec<Part>> = vec![Vec::new(); groups];
    for part in base.iter().flat_map(|(_, m)| &m.parts) {
        if let Some(parts) = by_group.get_mut(usize::from(part.buckets.0 / group)) {
            parts.push(part.clone());
        }
    }
    let base_dir = base.as_ref().map(|(d, _)| d.clone());
    let changes = view.changes();
    let log = changes.filter(|c| base.is_some() && c.group_buckets == group && c.groups.len() == groups);
    let plans = plan(log.map(|c| (c.groups.as_slice(), c.frozen.as_slice())), &by_group);

    let mut out =
        Assembly { dir, parts: Vec::new(), unsynced: Vec::new(), stats: IncrementalStats::default() };
    for (g, plan) in plans.into_iter().enumerate() {
        let first = g as u16 * group;
        let range = first..first.saturating_add(group).min(num_buckets);
        let previous = base_dir.as_ref().map(|d| (d.clone(), by_group[g].clone()));
        let start = out.parts.len();
        let linked = plan != Plan::Scan
            && by_group[g].iter().all(|p| base_dir.as_ref().is_some_and(|d| out.link(&d.join(&p.file), p)));
        match (plan, linked) {
            (Plan::Link, true) => {}
            (Plan::Delta, true) => {
                if let Some(GroupChanges::Entries { entries, .. }) = log.and_then(|c| c.groups.get(g)) {
                    out.delta(entries)?;
                }
            }
            _ => {
                // Whole: from the view (also when a base file could not be linked).
                // Only linked parts can be here (nothing was written for the group yet).
                for dropped in out.parts.drain(start..) {
                    let _ = std::fs::remove_file(dir.join(&dropped.file));
                    out.stats.entries -= dropped.entries;
                    out.stats.bytes -= dropped.bytes;
                    out.stats.shared_parts -= 1;
                }
                out.scan(view, range, previous.as_ref())?;
            }
        }
        if let Some(changes) = changes {
            let full = out.parts[start..].iter().filter(|p| p.kind == PartKind::Full).map(|p| p.bytes).sum();
            changes.budgets.set_from_part(g, full);
        }
    }
    if let Some(changes) = changes {
        let mut by_group: Vec<Vec<Part>> = vec![Vec::new(); groups];
        for part in &out.parts {
            if let Some(parts) = by_group.get_mut(usize::from(part.buckets.0 / group)) {
                parts.push(part.clone());
            }
        }
        for (g, compact) in compaction_due(&by_group).into_iter().enumerate() {
            changes.budgets.set_compact(g, compact);
        }
    }
    // Synced together, each on its own thread: the file system commits concurrent syncs in one
    // journal transaction, where one after another each waits for its own (on a loaded machine
    // a sync takes tens of milliseconds).
    std::thread::scope(|scope| {
        let syncs: Vec<_> = out
            .unsynced
            .iter()
            .map(|(file, path)| scope.spawn(move || file.sync_data().map_err(io(path, "syncing a part"))))
            .collect();
        syncs
            .into_iter()
            .try_for_each(|sync| sync.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    })?;
    out.stats.parts = out.parts.len() as u64;
    let manifest = Manifest { num_buckets, parts: out.parts };
    write_manifest(&writer.dir.join("manifest"), &manifest)?;
    Ok(out.stats)
}

/// Each group's plan: from its logged changes and whether the view froze it (`None`: no log,
/// or no base to build on — every group whole) and the base's parts of it. A group with logged
/// changes that was frozen is compacted ([`compaction_due`] marked it).
fn plan(log: Option<(&[GroupChanges], &[bool])>, by_group: &[Vec<Part>]) -> Vec<Plan> {
    let Some((log, frozen)) = log else { return vec![Plan::Scan; by_group.len()] };
    log.iter()
        .enumerate()
        .map(|(g, changes)| match changes {
            GroupChanges::Unchanged => Plan::Link,
            GroupChanges::Entries { .. } if frozen.get(g).copied().unwrap_or(false) => Plan::Scan,
            GroupChanges::Entries { .. } => Plan::Delta,
            GroupChanges::Whole => Plan::Scan,
        })
        .collect()
}

/// The groups of a snapshot (its parts per group) that the next one compacts if they change: a
/// group whose deltas, with one more, would reach [`MAX_DELTAS`] files or have grown past half
/// of its full part (at least [`MIN_DELTA_BYTES`]), the most overdue first, at most a quarter of
/// the groups (at least one).
fn compaction_due(by_group: &[Vec<Part>]) -> Vec<bool> {
    // (overdue ratio, group) of the groups due for compaction.
    let mut due: Vec<(f64, usize)> = Vec::new();
    for (g, parts) in by_group.iter().enumerate() {
        let full: u64 = parts.iter().filter(|p| p.kind == PartKind::Full).map(|p| p.bytes).sum();
        let deltas = parts.iter().filter(|p| p.kind == PartKind::Delta);
        let (count, bytes) = deltas.fold((0usize, 0u64), |(n, b), p| (n + 1, b + p.bytes));
        let allowed = (full / 2).max(MIN_DELTA_BYTES);
        if count + 1 >= MAX_DELTAS || bytes > allowed {
            due.push(((bytes as f64 / allowed as f64).max((count + 1) as f64 / MAX_DELTAS as f64), g));
        }
    }
    due.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut marked = vec![false; by_group.len()];
    for (_, g) in due.into_iter().take((by_group.len() / 4).max(1)) {
        marked[g] = true;
    }
    marked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(kind: PartKind, bucket: BucketId, bytes: u64) -> Part {
        Part { kind, file: String::new(), buckets: (bucket, bucket), entries: 1, bytes, checksum: 0 }
    }

    fn entries() -> GroupChanges {
        GroupChanges::Entries { entries: std::collections::HashMap::new(), bytes: 1 }
    }

    #[test]
    fn unchanged_groups_link_logged_ones_append_deltas_and_frozen_ones_compact() {
        let mut log: Vec<GroupChanges> = (0..4).map(|_| entries()).collect();
        log[0] = GroupChanges::Unchanged;
        log[1] = GroupChanges::Whole;
        let frozen = [false, true, true, false];
        let by_group = vec![vec![part(PartKind::Full, 0, 1 << 20)]; 4];
        assert_eq!(plan(Some((&log, &frozen)), &by_group), [Plan::Link, Plan::Scan, Plan::Scan, Plan::Delta]);
        assert_eq!(plan(None, &by_group), vec![Plan::Scan; 4]);
    }

    #[test]
    fn overdue_groups_are_marked_for_compaction_a_few_at_a_time() {
        let full = 64 << 20;
        let mut by_group = vec![vec![part(PartKind::Full, 0, full)]; 8];
        // Groups 2 and 3 carry deltas past half their full part; 3 is the more overdue.
        by_group[2].push(part(PartKind::Delta, 4, full / 2 + 1));
        by_group[3].push(part(PartKind::Delta, 6, full));
        let due = compaction_due(&by_group);
        assert_eq!(due, [false, false, true, true, false, false, false, false]);
        // Only two of eight may compact: a third overdue group waits for the next snapshot.
        by_group[5].push(part(PartKind::Delta, 10, 2 * full));
        let due = compaction_due(&by_group);
        assert_eq!(due, [false, false, false, true, false, true, false, false], "the two most overdue");
    }

    #[test]
    fn a_long_chain_of_small_deltas_compacts_too() {
        let mut chain = vec![part(PartKind::Full, 0, 64 << 20)];
        chain.extend((0..MAX_DELTAS - 1).map(|_| part(PartKind::Delta, 0, 10)));
        assert_eq!(compaction_due(&[chain]), [true]);
    }
}
