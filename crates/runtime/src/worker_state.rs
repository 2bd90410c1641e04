//! A worker's state stores, opened as the job's `[state]` section says (docs/architecture.md §5).

use std::sync::Arc;

use koala_protocol::{StateBackendKind, StateOptions};
use koala_state::{CachedEnv, DiscardEnv, FjallEnv, MemoryEnv, RemoteEnv, StateEnv};

use crate::RuntimeError;
use crate::throttle::SharedLink;

/// Opens the worker's state stores as the job's `[state]` section says.
/// Remote state crosses the worker's emulated link (`link`).
pub(crate) fn open_state(
    data_dir: &std::path::Path,
    state: &StateOptions,
    link: &Arc<SharedLink>,
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
            let remote = RemoteEnv::with_link(state.servers, Arc::new(move |bytes| link.pace(bytes)));
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
