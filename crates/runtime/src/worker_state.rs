//! A worker's state stores, opened as the job's `[state]` section says (docs/architecture.md §5).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use koala_protocol::{StateBackendKind, StateOptions};
use koala_state::{CachedEnv, DiscardEnv, FjallEnv, MemoryEnv, RemoteEnv, StateEnv};
use koala_types::WorkerId;
use koala_types::handshake::Token;

use crate::RuntimeError;
use crate::throttle::SharedLink;

/// In a worker's data dir, replaced by the number of the id the coordinator assigns it when it
/// registers: `koala-out/state/worker-{id}` is `worker-1` for the worker every message calls
/// worker1.
///
/// Worker ids follow registration order, not launch order (processes started together register
/// in any order), and a worker that restarts for a recovery registers again under a new id, so
/// a name fixed at launch (`worker-<launch index>`) would name another worker than the logs do.
/// A user reading a multi-process job's log goes from "worker1 disappeared" to its files by the
/// same number; the worker logs its id, pid, data address and data dir when it registers, and
/// the coordinator logs the pid and address of each id.
pub const WORKER_ID_PLACEHOLDER: &str = "{id}";

/// `template` with [`WORKER_ID_PLACEHOLDER`] replaced by `worker`'s number.
pub fn data_dir_of(template: &Path, worker: WorkerId) -> PathBuf {
    match template.to_str() {
        Some(text) if text.contains(WORKER_ID_PLACEHOLDER) => {
            PathBuf::from(text.replace(WORKER_ID_PLACEHOLDER, &worker.0.to_string()))
        }
        _ => template.to_path_buf(),
    }
}

/// Opens the worker's state stores as the job's `[state]` section says.
/// Remote state crosses the worker's emulated link (`link`), and its connections present the
/// job `token` to the state servers.
pub(crate) fn open_state(
    data_dir: &std::path::Path,
    state: &StateOptions,
    link: &Arc<SharedLink>,
    token: Option<&Token>,
    tls: Option<&koala_types::tls::Tls>,
) -> Result<Arc<dyn StateEnv>, RuntimeError> {
    let state = state.clone();
    Ok(match state.backend {
        StateBackendKind::Fjall => {
            std::fs::create_dir_all(data_dir)
                .map_err(|e| RuntimeError::io(format!("creating data dir {}", data_dir.display()), e))?;
            let fjall = FjallEnv::open(data_dir)?;
            match usize::try_from(state.cache_bytes) {
                // Every task's cache is sized from its share before it opens (crate::memory).
                _ if state.cache_from_budget => {
                    Arc::new(CachedEnv::new(fjall, koala_state::MIN_BUDGET_BYTES))
                }
                Ok(0) => Arc::new(fjall),
                Ok(bytes) => Arc::new(CachedEnv::new(fjall, bytes)),
                Err(_) => Arc::new(CachedEnv::new(fjall, usize::MAX)),
            }
        }
        StateBackendKind::Memory => Arc::new(MemoryEnv::new()),
        StateBackendKind::None => Arc::new(DiscardEnv),
        StateBackendKind::Remote => {
            if state.servers.is_empty() {
                return Err(RuntimeError::Control(
                    "the job's state backend is remote but names no state server".into(),
                ));
            }
            let link = link.clone();
            let remote = RemoteEnv::with_link(
                state.servers,
                token.cloned(),
                tls.cloned(),
                Arc::new(move |bytes| link.pace(bytes)),
            );
            match usize::try_from(state.cache_bytes) {
                _ if state.cache_from_budget => {
                    Arc::new(CachedEnv::new(remote, koala_state::MIN_BUDGET_BYTES))
                }
                Ok(0) => Arc::new(remote),
                Ok(bytes) => Arc::new(CachedEnv::new(remote, bytes)),
                Err(_) => Arc::new(CachedEnv::new(remote, usize::MAX)),
            }
        }
    })
}

/// Loads the warm state of this worker's stateful `tasks` — the buckets each owns in `d`, from
/// the snapshot `<dir>/<operator name>` — before the job starts, so every run of an experiment,
/// under any protocol, starts from the same state (docs/architecture.md §5).
pub(crate) fn restore_warm_state<'a>(
    d: &koala_protocol::Deployment,
    graph: &koala_dataflow::JobGraph,
    tasks: impl Iterator<Item = &'a koala_types::TaskId>,
    env: &dyn koala_state::StateEnv,
    dir: &Path,
) -> Result<(), String> {
    for task in tasks {
        let Some(op) = graph.operator(task.operator) else { continue };
        let snapshot = dir.join(&op.name);
        if !op.is_stateful() || !snapshot.join("manifest").exists() {
            continue;
        }
        let manifest = koala_state::snapshot::read_manifest(&snapshot).map_err(|e| e.to_string())?;
        if manifest.num_buckets != d.num_buckets {
            return Err(format!(
                "warm state {} was written for num_buckets = {}, the job has {}; write it again with the job's config",
                snapshot.display(),
                manifest.num_buckets,
                d.num_buckets
            ));
        }
        let owned = crate::checkpoint::owned_in(d, *task);
        let store = env.open_task(*task).map_err(|e| format!("{task}: opening its store: {e}"))?;
        let started = std::time::Instant::now();
        let loaded = koala_state::snapshot::restore(store.as_ref(), &snapshot, Some(&owned))
            .map_err(|e| format!("{task}: restoring warm state: {e}"))?;
        tracing::info!(%task, entries = loaded.entries, secs = started.elapsed().as_secs_f64(), from = %snapshot.display(), "warm state restored");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_dir_is_named_after_the_id_the_coordinator_assigned() {
        let template = Path::new("koala-out/state/worker-{id}");
        assert_eq!(data_dir_of(template, WorkerId(1)), Path::new("koala-out/state/worker-1"));
        assert_eq!(data_dir_of(Path::new("/var/lib/koala"), WorkerId(1)), Path::new("/var/lib/koala"));
    }
}
