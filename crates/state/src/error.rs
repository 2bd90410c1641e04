//! Errors of state stores: each names the store (directory or task) and the failed operation.

use std::path::PathBuf;

use koala_types::TaskId;

use crate::LayoutError;

/// An error of the storage engine behind a store, boxed so the trait does not depend on fjall.
pub type BackendError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a state store operation failed.
///
/// Engine failures ([`StateError::Open`], [`StateError::Env`], [`StateError::Store`]) are not
/// retryable: like fjall's `Poisoned`, they mean "stop this worker and recover from the last
/// checkpoint".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The state directory of a worker could not be opened or configured.
    #[error("opening state directory {}", path.display())]
    Open {
        /// The directory given to the env.
        path: PathBuf,
        /// What the engine reported.
        #[source]
        source: BackendError,
    },
    /// An env-wide operation (persist, drop of a task's store) failed.
    #[error("state directory {}: {op} failed", path.display())]
    Env {
        /// The env's directory.
        path: PathBuf,
        /// The failed operation.
        op: &'static str,
        /// What the engine reported.
        #[source]
        source: BackendError,
    },
    /// An operation on one task's store failed in the storage engine.
    #[error("state store of task {task}: {op} failed")]
    Store {
        /// The task owning the store.
        task: TaskId,
        /// The failed operation.
        op: &'static str,
        /// What the engine reported.
        #[source]
        source: BackendError,
    },
    /// A key or value does not fit the stored layout; nothing of the batch was written.
    #[error("state store of task {task}: {op} rejected an entry")]
    Layout {
        /// The task owning the store.
        task: TaskId,
        /// The failed operation.
        op: &'static str,
        /// Which limit was violated.
        #[source]
        source: LayoutError,
    },
    /// The task's store was deleted by `StateEnv::drop_task` while this handle was still open.
    #[error("state store of task {task}: {op} on a store that was dropped")]
    Dropped {
        /// The task whose store was dropped.
        task: TaskId,
        /// The refused operation.
        op: &'static str,
    },
    /// A lock of a store was poisoned by a thread that panicked while holding it.
    #[error("{store}: {op} found a lock poisoned by a panicking thread")]
    Poisoned {
        /// Which store or registry the lock protects.
        store: String,
        /// The refused operation.
        op: &'static str,
    },
    /// The store does not support this operation (e.g. releasing buckets to a shared store on a
    /// store that belongs to one task); nothing was changed.
    #[error("state store of task {task}: {op} is not supported by this backend")]
    Unsupported {
        /// The task owning the store.
        task: TaskId,
        /// The refused operation.
        op: &'static str,
    },
    /// A state server could not be reached or answered with an error.
    #[error("state server {server}: {op} failed: {message}")]
    Remote {
        /// The server's address.
        server: String,
        /// The failed operation.
        op: &'static str,
        /// What went wrong (I/O error or the server's own error message).
        message: String,
    },
    /// A frozen view was asked for a bucket it was not frozen with (a checkpoint's freeze copies
    /// only the buckets its writer will read); nothing was read.
    #[error("state store of task {task}: bucket {bucket} is not in the frozen view")]
    NotFrozen {
        /// The task owning the store.
        task: TaskId,
        /// The bucket asked for.
        bucket: koala_types::BucketId,
    },
    /// The sink of a bucket scan refused a chunk; the scan stopped there.
    #[error("bucket scan sink failed")]
    Sink(#[source] BackendError),
}

impl StateError {
    /// Wraps an error of a scan sink (e.g. a closed migration channel).
    pub fn sink(error: impl Into<BackendError>) -> Self {
        Self::Sink(error.into())
    }
}
