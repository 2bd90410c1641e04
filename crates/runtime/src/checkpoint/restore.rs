//! A task's restore from a checkpoint (docs/architecture.md §10, "Recovery"): its watermarks and
//! timers at once, and its state — the buckets it owns, from the parts of every task of its
//! operator, in the order of Koala's cut rule (`koala_protocol::koala::restore_steps`,
//! docs/protocols.md §12): the other parts, then the owner's tombstones, then its own part.
//!
//! A private store (fjall, memory) is restored lazily: the task starts as soon as its timers
//! and watermarks are read, behind a [`LazyBackend`] whose bucket groups — `num_buckets /
//! 16` buckets each, the groups the checkpoint's part files are cut by — are loaded
//! by [`CheckpointGroups`] on first access, while a background thread loads the rest. Loading a
//! group replaces whatever the store held of it before the failure with every restore step of
//! that group, in the rule's order, so the task sees the state an eager restore gives it.
//! A shared store (the Remote backend's state servers) is restored at once, only the buckets the
//! task owns: the other tasks restore theirs, perhaps concurrently.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

use koala_protocol::koala::{RestoreStep, restore_steps};
use koala_state::lazy::{GroupLoader, LazyBackend};
use koala_state::{StateBackend, StateError, StateKey, StateWrite};
use koala_types::{BucketId, TaskId, bucket_of};

use super::writer::group_buckets;
use super::{TaskMeta, owned_in, shared_store};
use crate::RuntimeError;
use crate::task::setup::TaskSetup;

/// Set (not empty) in a worker's environment, its restored tasks load every bucket group before
/// they start — the restore before lazy recovery — for `koala experiment recovery` to compare.
pub const RESTORE_EAGERLY: &str = "KOALA_RESTORE_EAGERLY";

/// A restarted job (`checkpoint.restore`): restores this task's state and timers from the
/// checkpoint — the buckets it owns, from every task of its operator, in the cut rule's order;
/// a private store lazily (see the module docs: `setup.store` becomes the lazy store) — and
/// returns its own record's watermarks with those timers. `state_ids`: the operator's state ids
/// (a tombstone deletes a key under each). `None` when the job does not restore.
pub(crate) fn restore_task(
    setup: &mut TaskSetup,
    state_ids: &[u8],
) -> Result<Option<TaskMeta>, RuntimeError> {
    let task = setup.task;
    let fail = |what: String| RuntimeError::Checkpoint { task, what };
    let (Some(root), Some(point)) =
        (setup.options.checkpoint.dir.as_deref(), &setup.options.checkpoint.restore)
    else {
        return Ok(None);
    };
    if setup.created_by_reconfiguration {
        // A task a reconfiguration created is not in the checkpoint: it owns nothing yet, and a
        // copy of its future buckets' state would shadow what their old owners hand over.
        return Ok(None);
    }
    let owned = setup.spec.is_stateful().then(|| owned_in(&setup.deployment, task));
    let checkpoint = Path::new(root).join(point.id.to_string());
    let checkpoint_id = point.id;
    let parts = parts_of(&checkpoint, task).map_err(fail)?;
    let mut metas = BTreeMap::new();
    for (index, dir) in &parts {
        if let Some(meta) = read_meta(dir).map_err(fail)? {
            metas.insert(*index, meta);
        }
    }
    let mut meta = metas.remove(&task.index).unwrap_or_default();
    let nb = setup.num_buckets;
    // Timers: a stateless task's are its own; a stateful task's are those of its buckets.
    let mut timers = std::mem::take(&mut meta.timers);
    if let Some(owned) = &owned {
        timers.retain(|(_, k)| owned.contains(&bucket_of(k, nb)));
        for other in metas.values() {
            timers.extend(other.timers.iter().filter(|(_, k)| owned.contains(&bucket_of(k, nb))).cloned());
        }
    }
    let cut = std::mem::take(&mut meta.cut);
    meta.timers = timers;
    if let (Some(store), Some(owned)) = (setup.store.take(), owned) {
        let groups = CheckpointGroups {
            task,
            num_buckets: nb,
            owned,
            steps: restore_steps(task.index, parts.keys().copied()),
            retained: metas.into_iter().map(|(index, m)| (index, m.cut.retained)).collect(),
            installed: cut.installed,
            state_ids: state_ids.to_vec(),
            parts,
        };
        if shared_store(setup) {
            // Its own buckets only: the other tasks' are theirs to restore, perhaps right now.
            let owned: Vec<BucketId> = groups.owned.iter().copied().collect();
            store.delete_buckets(&owned)?;
            if let Some(dir) = groups.parts.get(&task.index) {
                restore_state(store.as_ref(), dir, &groups.owned).map_err(|e| fail(e.to_string()))?;
            }
            setup.store = Some(store);
        } else {
            let group_buckets = group_buckets(nb);
            let lazy = LazyBackend::new(store, nb, group_buckets, Box::new(groups));
            if std::env::var_os(RESTORE_EAGERLY).is_some_and(|v| !v.is_empty()) {
                lazy.load_all()?;
            } else {
                lazy.start_background()?;
            }
            setup.store = Some(Box::new(lazy));
        }
    }
    tracing::info!(%task, checkpoint = checkpoint_id, timers = meta.timers.len(), "restored from a checkpoint");
    Ok(Some(meta))
}

/// The parts of the tasks of `task`'s operator in `checkpoint`, by task index (none if the
/// directory is missing: no transform task had a part, every one had finished).
fn parts_of(checkpoint: &Path, task: TaskId) -> Result<BTreeMap<u32, PathBuf>, String> {
    let prefix = format!("{}-", task.operator.0);
    let listing = match std::fs::read_dir(checkpoint) {
        Ok(listing) => Some(listing),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("reading {}: {e}", checkpoint.display())),
    };
    let mut parts = BTreeMap::new();
    for entry in listing.into_iter().flatten().filter_map(Result::ok) {
        let name = entry.file_name();
        let index = name.to_str().and_then(|n| n.strip_prefix(&prefix)).and_then(|i| i.parse::<u32>().ok());
        if let Some(index) = index {
            parts.insert(index, entry.path());
        }
    }
    Ok(parts)
}

/// A part's meta (`None`: the part has none).
fn read_meta(dir: &Path) -> Result<Option<TaskMeta>, String> {
    let path = dir.join("meta");
    if !path.exists() {
        return Ok(None);
    }
    let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    koala_types::decode(&bytes).map(Some).map_err(|e| format!("{}: {e}", path.display()))
}

/// Loads `wanted` of the state of the part in `dir` (if it has state) into `store`.
fn restore_state(
    store: &dyn StateBackend,
    dir: &Path,
    wanted: &BTreeSet<BucketId>,
) -> Result<(), koala_state::snapshot::SnapshotError> {
    let state = dir.join("state");
    if !wanted.is_empty() && state.join("manifest").exists() {
        koala_state::snapshot::restore(store, &state, Some(wanted))?;
    }
    Ok(())
}

/// A key and its value as a cut part records them.
type Entry = (Vec<u8>, Vec<u8>);

/// What a task restores from a checkpoint, bucket group by bucket group ([`GroupLoader`]).
struct CheckpointGroups {
    task: TaskId,
    num_buckets: u16,
    /// The buckets the task owns.
    owned: BTreeSet<BucketId>,
    /// The cut rule's order over the parts.
    steps: Vec<RestoreStep<u32>>,
    /// The parts of the operator's tasks, by task index.
    parts: BTreeMap<u32, PathBuf>,
    /// Each other part's entries served to owners past the checkpoint (Koala's cut).
    retained: BTreeMap<u32, Vec<Entry>>,
    /// Keys the task installed from fetches since its previous checkpoint (its tombstones).
    installed: Vec<Vec<u8>>,
    state_ids: Vec<u8>,
}

impl CheckpointGroups {
    fn fail(&self, what: impl std::fmt::Display) -> StateError {
        StateError::Store {
            task: self.task,
            op: "restore from a checkpoint",
            source: what.to_string().into(),
        }
    }
}

impl GroupLoader for CheckpointGroups {
    fn load(&self, store: &dyn StateBackend, buckets: Range<BucketId>) -> Result<(), StateError> {
        // Whatever the store held of the group before the failure is not the checkpoint's.
        store.delete_buckets(&buckets.clone().collect::<Vec<_>>())?;
        let wanted: BTreeSet<BucketId> = self.owned.range(buckets).copied().collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let nb = self.num_buckets;
        let mine = |key: &[u8]| wanted.contains(&bucket_of(key, nb));
        for step in &self.steps {
            match step {
                RestoreStep::Other(index) => {
                    if let Some(dir) = self.parts.get(index) {
                        restore_state(store, dir, &wanted).map_err(|e| self.fail(e))?;
                    }
                    let retained = self.retained.get(index).map(Vec::as_slice).unwrap_or_default();
                    let entries = retained.iter().filter(|(k, _)| mine(k)).cloned();
                    let writes =
                        crate::task::location::bundle_writes(entries, nb).map_err(|e| self.fail(e))?;
                    if !writes.is_empty() {
                        store.write_many(writes)?;
                    }
                }
                RestoreStep::Tombstones => {
                    let writes: Vec<StateWrite> = self
                        .installed
                        .iter()
                        .filter(|k| mine(k))
                        .flat_map(|key| {
                            let bucket = bucket_of(key, nb);
                            self.state_ids.iter().map(move |state| {
                                StateWrite::Delete(StateKey { bucket, state: *state, key: key.clone() })
                            })
                        })
                        .collect();
                    if !writes.is_empty() {
                        store.write_many(writes)?;
                    }
                }
                RestoreStep::Own => {
                    if let Some(dir) = self.parts.get(&self.task.index) {
                        restore_state(store, dir, &wanted).map_err(|e| self.fail(e))?;
                    }
                }
            }
        }
        Ok(())
    }
}
