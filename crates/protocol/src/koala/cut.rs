//! Koala's checkpoint cut (docs/protocols.md §12): which task's snapshot holds a key's state when
//! state moves on demand while a checkpoint is taken, so that a restore finds every key exactly
//! once and at the version the cut says.
//!
//! Checkpoints and reconfigurations never overlap (the coordinator starts neither while the
//! other runs, nor a checkpoint while a cancelled task still holds state), so during a checkpoint
//! ownership is fixed and a key moves at most one hop: from the location that holds it to its
//! owner, on a fetch (or a pull) that the location answers by deleting it (one live copy). Tasks
//! snapshot at different moments (each at its own barrier), so without a rule a key served by
//! its location *before* the location's snapshot and installed by its owner *after* the owner's
//! would be in neither snapshot (lost), and a key served *after* the location's snapshot but
//! installed *before* the owner's would be in both (and if the owner deleted it since, a restore
//! would bring it back). The rule, with `s(T)` the last checkpoint task `T` snapshotted:
//!
//! 1. A task snapshots only when it holds no record taken before its barrier and has no fetch or
//!    pull outstanding: whatever it asked for before its snapshot is installed before it.
//! 2. A request carries its sender's `s` (the *tag*). A location that serves a request tagged
//!    past its own `s` (the owner already snapshotted the checkpoint the location has not)
//!    still deletes what it sends, but keeps a copy of it for its next snapshot, where it is
//!    recorded as *retained*, and drops the copy then.
//! 3. An owner records the keys it installed since its last snapshot; its next snapshot lists
//!    them as *installed* (for the keys it has since deleted, a tombstone).
//! 4. A restore of an owner's buckets applies, in this order ([`restore_steps`]): every other
//!    task's part (its stored state and its retained entries), then the owner's installed keys
//!    as deletions, then the owner's own stored state.
//!
//! Why it holds, for a key `k` that owner `N` fetches from location `O` during checkpoint `c`:
//! served before `O`'s snapshot to a request sent before `N`'s (tags equal): `N` installed it
//! before its snapshot (1), `O`'s snapshot lacks it, `N`'s has it or its tombstone. Served before
//! `O`'s snapshot to a request sent after `N`'s (tag past `s(O)`): `O` retains it into its
//! snapshot (2), `N`'s lacks it and lists no tombstone for it. Served after `O`'s snapshot: `O`'s
//! snapshot has it; if the request came before `N`'s snapshot, `N`'s has it or its tombstone and
//! is applied last (4); if after, `N`'s lacks it and `O`'s is the one. A key nobody fetched is in
//! its location's snapshot only. The simulator (`crate::sim::cut`) checks the rule by crashing
//! at every step of runs with fetches in flight and comparing with the oracle, and checks that
//! dropping rule 2 or 3 loses or resurrects state.
//!
//! ```
//! use koala_protocol::koala::CheckpointCut;
//! let mut location = CheckpointCut::new(0);
//! // The owner snapshotted checkpoint 1 already; the location has not.
//! location.on_served(1, [(b"k".to_vec(), b"v".to_vec())]);
//! let part = location.snapshot(1);
//! assert_eq!(part.retained, vec![(b"k".to_vec(), b"v".to_vec())]);
//! assert_eq!(location.tag(), 1);
//! ```

use std::collections::BTreeSet;

use koala_types::CheckpointId;
use serde::{Deserialize, Serialize};

/// A key and its state, as a fetch answer carries them.
pub type Entry = (Vec<u8>, Vec<u8>);

/// What a task's part of a checkpoint records besides its stored state (rules 2 and 3).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CutPart {
    /// Entries this task served to owners already past this checkpoint, as they were served.
    pub retained: Vec<Entry>,
    /// Keys this task installed from fetches since its previous snapshot.
    pub installed: Vec<Vec<u8>>,
}

/// One task's side of the cut rule (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct CheckpointCut {
    snapshotted: CheckpointId,
    installed: BTreeSet<Vec<u8>>,
    /// Served entries kept for a snapshot, with the checkpoint they belong to.
    retained: Vec<(CheckpointId, Entry)>,
}

impl CheckpointCut {
    /// A task that last snapshotted (or was restored from) checkpoint `snapshotted` (0: none).
    pub fn new(snapshotted: CheckpointId) -> Self {
        Self { snapshotted, ..Self::default() }
    }

    /// The tag this task's requests carry: the last checkpoint it snapshotted.
    pub fn tag(&self) -> CheckpointId {
        self.snapshotted
    }

    /// This task served `entries` (deleting them from its store) to a request tagged `tag`.
    pub fn on_served(&mut self, tag: CheckpointId, entries: impl IntoIterator<Item = Entry>) {
        if tag > self.snapshotted {
            // Checkpoints do not overlap: the requester snapshotted the checkpoint this task
            // snapshots next (ids may skip one a recovery abandoned).
            self.retained.extend(entries.into_iter().map(|e| (tag, e)));
        }
    }

    /// This task installed the state of `keys` from a fetch answer.
    pub fn on_installed<'a>(&mut self, keys: impl IntoIterator<Item = &'a [u8]>) {
        self.installed.extend(keys.into_iter().map(<[u8]>::to_vec));
    }

    /// Entries retained now (memory held for the next snapshot).
    pub fn retained_entries(&self) -> usize {
        self.retained.len()
    }

    /// Takes this task's snapshot of checkpoint `id`: what its part records besides its store.
    pub fn snapshot(&mut self, id: CheckpointId) -> CutPart {
        let (now, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.retained).into_iter().partition(|(t, _)| *t <= id);
        self.retained = later;
        self.snapshotted = self.snapshotted.max(id);
        CutPart {
            retained: now.into_iter().map(|(_, e)| e).collect(),
            installed: std::mem::take(&mut self.installed).into_iter().collect(),
        }
    }
}

/// One step of restoring an owner's buckets from a checkpoint (rule 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreStep<T> {
    /// Another task's part: its stored state and its retained entries of the owner's buckets.
    Other(T),
    /// The owner's installed keys, deleted.
    Tombstones,
    /// The owner's own stored state.
    Own,
}

/// The order in which task `me` restores its buckets from the parts of `tasks` (its operator's
/// tasks that have a part; `me` may be among them).
pub fn restore_steps<T: Ord + Copy>(me: T, tasks: impl IntoIterator<Item = T>) -> Vec<RestoreStep<T>> {
    let others: BTreeSet<T> = tasks.into_iter().filter(|t| *t != me).collect();
    let mut steps: Vec<RestoreStep<T>> = others.into_iter().map(RestoreStep::Other).collect();
    steps.push(RestoreStep::Tombstones);
    steps.push(RestoreStep::Own);
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(k: &str) -> Entry {
        (k.as_bytes().to_vec(), b"v".to_vec())
    }

    #[test]
    fn a_serve_to_a_requester_behind_or_level_keeps_nothing() {
        let mut cut = CheckpointCut::new(3);
        cut.on_served(3, [e("a")]);
        cut.on_served(2, [e("b")]);
        assert_eq!(cut.retained_entries(), 0);
        assert!(cut.snapshot(4).retained.is_empty());
    }

    #[test]
    fn a_serve_to_a_requester_ahead_is_kept_for_the_next_snapshot_only() {
        let mut cut = CheckpointCut::new(1);
        cut.on_served(2, [e("a")]);
        assert_eq!(cut.snapshot(2).retained, vec![e("a")]);
        assert_eq!(cut.retained_entries(), 0);
        assert!(cut.snapshot(3).retained.is_empty());
    }

    #[test]
    fn installed_keys_are_listed_once_at_the_next_snapshot() {
        let mut cut = CheckpointCut::new(0);
        cut.on_installed([&b"a"[..], &b"b"[..], &b"a"[..]]);
        assert_eq!(cut.snapshot(1).installed, vec![b"a".to_vec(), b"b".to_vec()]);
        assert!(cut.snapshot(2).installed.is_empty());
        assert_eq!(cut.tag(), 2);
    }

    #[test]
    fn the_owner_restores_last_after_its_tombstones() {
        let steps = restore_steps(2, [3, 1, 2]);
        assert_eq!(
            steps,
            vec![RestoreStep::Other(1), RestoreStep::Other(3), RestoreStep::Tombstones, RestoreStep::Own]
        );
    }
}
