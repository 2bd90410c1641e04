//! What a completed checkpoint records for `koala run --resume DIR` (docs/architecture.md §10):
//! besides the tasks' parts, the coordinator writes `<checkpoints>/<id>/_metadata` — the
//! deployment the checkpoint covers, the sources' positions, the requests queued but not started
//! at its start, the job's elapsed time then, and the job's config — before it tells the sinks to
//! commit, so a sink's committed part always belongs to a checkpoint a resume can find. A job
//! stopped any way (its coordinator killed, or every process) restarts from the highest
//! checkpoint with a readable `_metadata`. The file starts with [`FORMAT`], the version of its
//! layout, so one written by a koala that lays it out otherwise is refused by name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use koala_protocol::{Deployment, ReconfigRequest, RestorePoint};
use koala_types::{CheckpointId, WorkerId};
use serde::{Deserialize, Serialize};

/// The file name of a completed checkpoint's metadata.
pub const METADATA: &str = "_metadata";

/// The first line of a metadata file: its layout's version (2: sources' positions are
/// [`koala_types::SourcePosition`]s — counts, Kafka offsets or finished; version 1 files had no
/// such line and counted records only).
pub const FORMAT: &[u8] = b"koala checkpoint metadata v2\n";

/// A completed checkpoint as a resumed job needs it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// The checkpoint and the sources' positions in it.
    pub point: RestorePoint,
    /// The deployment it covers (its placement names the workers of the run that took it).
    pub deployment: Deployment,
    /// Requests queued at its start that had not started (started ones are in `deployment`).
    pub pending: Vec<ReconfigRequest>,
    /// Milliseconds since the job's start when it started (a resumed job's `duration_s` and
    /// reconfiguration schedule count from there).
    pub elapsed_ms: u64,
    /// The job's config, TOML.
    pub config: String,
}

/// Why a job cannot resume from a directory.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// No checkpoints directory, or none of its checkpoints completed.
    #[error(
        "{}: no completed checkpoint to resume from (a job writes them under <output_dir>/checkpoints/ \
         when its config sets checkpoint_interval_ms; give --resume that output_dir)",
        dir.display()
    )]
    NoCheckpoint {
        /// The checkpoints directory looked in.
        dir: PathBuf,
    },
    /// The latest checkpoints' metadata cannot be read by this koala (and no older one can).
    #[error(
        "{}: unreadable checkpoint metadata: {message}; this koala cannot resume it: start the job \
         afresh with koala run <config>",
        path.display()
    )]
    Unreadable {
        /// The newest metadata file that did not decode.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// Reading or writing a metadata file failed.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// Writes `meta` as `<dir>/<METADATA>` durably (a temporary file, synced, then renamed).
pub fn write(dir: &Path, meta: &CheckpointMetadata) -> Result<(), ResumeError> {
    use std::io::Write;
    let path = dir.join(METADATA);
    let fail = |e: &dyn std::fmt::Display| ResumeError::Io { path: path.clone(), message: e.to_string() };
    let mut bytes = FORMAT.to_vec();
    koala_types::encode_into(meta, &mut bytes).map_err(|e| fail(&e))?;
    std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
    let tmp = dir.join(format!("{METADATA}.tmp"));
    let mut file = std::fs::File::create(&tmp).map_err(|e| fail(&e))?;
    file.write_all(&bytes).and_then(|()| file.sync_all()).map_err(|e| fail(&e))?;
    std::fs::rename(&tmp, &path).map_err(|e| fail(&e))?;
    Ok(())
}

/// The latest completed checkpoint under `checkpoints` (the highest id whose metadata reads).
pub fn latest(checkpoints: &Path) -> Result<CheckpointMetadata, ResumeError> {
    let none = || ResumeError::NoCheckpoint { dir: checkpoints.to_path_buf() };
    let listing = std::fs::read_dir(checkpoints).map_err(|_| none())?;
    let mut ids: Vec<CheckpointId> =
        listing.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<CheckpointId>().ok()).collect();
    ids.sort_unstable();
    // The newest metadata that exists but does not decode: named if none does.
    let mut unreadable = None;
    for id in ids.into_iter().rev() {
        let path = checkpoints.join(id.to_string()).join(METADATA);
        let Ok(bytes) = std::fs::read(&path) else { continue };
        match decode(&bytes) {
            Ok(meta) if meta.point.id == id => return Ok(meta),
            Ok(_) => tracing::warn!(path = %path.display(), "checkpoint metadata names another id; skipped"),
            Err(message) => {
                tracing::warn!(path = %path.display(), "unreadable checkpoint metadata, skipped: {message}");
                unreadable.get_or_insert(ResumeError::Unreadable { path, message });
            }
        }
    }
    Err(unreadable.unwrap_or_else(none))
}

/// A metadata file's bytes: [`FORMAT`], then the metadata.
fn decode(bytes: &[u8]) -> Result<CheckpointMetadata, String> {
    let Some(body) = bytes.strip_prefix(FORMAT) else {
        let first = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
        let named = first.starts_with(b"koala checkpoint metadata ");
        let current = String::from_utf8_lossy(FORMAT.strip_suffix(b"\n").unwrap_or(FORMAT)).into_owned();
        return Err(if named {
            format!("it is \"{}\", this koala reads \"{current}\"", String::from_utf8_lossy(first))
        } else {
            format!(
                "it does not start with \"{current}\" (a koala from before source positions carried Kafka \
                 offsets wrote it, or it is damaged)"
            )
        });
    };
    koala_types::decode(body)
        .map_err(|e| format!("its header is this koala's but its contents do not decode: {e}"))
}

/// Logs where each source of `point` resumes.
pub fn log_positions(point: &RestorePoint) {
    for (task, position) in &point.positions {
        tracing::info!(
            checkpoint = point.id,
            "source {task} resumes at {position} (checkpoint {})",
            point.id
        );
    }
}

/// `d`'s tasks placed over the workers there are now: the old workers in order, round-robin
/// onto `workers` (a task that shared a worker still shares one).
pub fn place(d: &mut Deployment, workers: &std::collections::BTreeMap<WorkerId, String>) {
    let new: Vec<WorkerId> = workers.keys().copied().collect();
    let olds: Vec<WorkerId> = d.placement.values().copied().collect::<BTreeSet<_>>().into_iter().collect();
    for w in d.placement.values_mut() {
        let i = olds.iter().position(|o| o == w).unwrap_or(0);
        *w = new[i % new.len()];
    }
    d.workers = workers.clone();
    d.finished.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_readable_metadata_wins_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = latest(dir.path()).expect_err("empty").to_string();
        assert!(err.contains("no completed checkpoint") && err.contains("checkpoint_interval_ms"), "{err}");
        let d = sample_deployment();
        let meta = |id| CheckpointMetadata {
            point: RestorePoint { id, ..Default::default() },
            deployment: d.clone(),
            pending: Vec::new(),
            elapsed_ms: id * 1000,
            config: String::new(),
        };
        write(&dir.path().join("2"), &meta(2)).expect("write");
        write(&dir.path().join("3"), &meta(3)).expect("write");
        // Checkpoint 4 started but never completed: a task's part, no metadata.
        std::fs::create_dir_all(dir.path().join("4").join("1-0")).expect("mkdir");
        assert_eq!(latest(dir.path()).expect("latest"), meta(3));
        std::fs::write(dir.path().join("3").join(METADATA), b"\xff").expect("corrupt");
        assert_eq!(latest(dir.path()).expect("latest").point.id, 2);
        // None readable: the newest unreadable one is named, with why and the fix.
        std::fs::write(dir.path().join("2").join(METADATA), b"koala checkpoint metadata v1\n").expect("v1");
        let err = latest(dir.path()).expect_err("unreadable").to_string();
        assert!(err.contains("3/_metadata") && err.contains("does not start with"), "{err}");
        assert!(err.contains("koala run <config>"), "{err}");
        std::fs::remove_dir_all(dir.path().join("3")).expect("rm");
        let err = latest(dir.path()).expect_err("unreadable").to_string();
        assert!(
            err.contains(
                "it is \"koala checkpoint metadata v1\", this koala reads \"koala checkpoint metadata v2\""
            ),
            "{err}"
        );
    }

    fn sample_deployment() -> Deployment {
        use koala_types::{OperatorId, TaskId};
        let w = |i| (WorkerId(i), format!("127.0.0.1:{i}"));
        let t = |i| TaskId::new(OperatorId(0), i);
        Deployment {
            run: "r".into(),
            query: "q".into(),
            query_params: String::new(),
            workers: [w(0), w(1), w(2)].into(),
            placement: [(t(0), WorkerId(0)), (t(1), WorkerId(2)), (t(2), WorkerId(0))].into(),
            tasks: Default::default(),
            epoch: 3,
            routing: Default::default(),
            num_buckets: 8,
            protocol: koala_protocol::Protocol::StopAndRestart,
            extra_keys: Default::default(),
            drain_keys_per_sec: Default::default(),
            finished: [t(1)].into(),
            options: koala_protocol::RuntimeOptions {
                batch_records: 1,
                linger_ms: 1,
                channel_capacity: 1,
                sink_dir: String::new(),
                capacity: Default::default(),
                max_queued_records: 1,
                checkpoint: Default::default(),
            },
        }
    }

    #[test]
    fn placement_maps_old_workers_in_order_onto_the_new_ones() {
        let mut d = sample_deployment();
        let now: std::collections::BTreeMap<WorkerId, String> =
            [(WorkerId(5), "a".to_string()), (WorkerId(6), "b".to_string())].into();
        place(&mut d, &now);
        let placed: Vec<WorkerId> = d.placement.values().copied().collect();
        assert_eq!(placed, vec![WorkerId(5), WorkerId(6), WorkerId(5)]);
        assert!(d.finished.is_empty());
        assert_eq!(d.workers, now);
    }
}
