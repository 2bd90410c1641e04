//! The exactly-once JSON-lines sink's files (docs/architecture.md §10): a sink task writes the
//! lines since its last barrier into a hidden open file; at a barrier the file becomes the
//! checkpoint's pending part; when the checkpoint completes, its pending parts are renamed to
//! visible part files; at the end of input everything left is committed. A restarted sink
//! commits the parts of the checkpoint it restores (their commit may have been lost in the
//! crash) and deletes the rest, so after a recovery no line is lost or written twice.
//!
//! Names, for sink `sink` task 0: `.sink-0.open`, `.sink-0.000000000007.pending`, and the
//! committed `sink-0.000000000007.jsonl` and `sink-0.end.jsonl` (the end of input).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use koala_types::CheckpointId;

use crate::RuntimeError;

/// One sink task's part files.
pub(super) struct PartFiles {
    dir: PathBuf,
    stem: String,
    open: Option<BufWriter<File>>,
    pending: BTreeSet<CheckpointId>,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> RuntimeError {
    move |e| RuntimeError::io(what, e)
}

impl PartFiles {
    /// The files of sink task `stem` (`<sink>-<index>`) in `dir`. Fresh (`restored` = None):
    /// every file of an earlier run of this task is removed. Restored from checkpoint `k`:
    /// pending parts up to `k` are committed, later ones and the open file removed.
    pub(super) fn open(dir: &Path, stem: &str, restored: Option<CheckpointId>) -> Result<Self, RuntimeError> {
        let parts =
            Self { dir: dir.to_path_buf(), stem: stem.to_string(), open: None, pending: BTreeSet::new() };
        std::fs::create_dir_all(dir).map_err(io(format!("creating sink dir {}", dir.display())))?;
        let entries = std::fs::read_dir(dir).map_err(io(format!("listing sink dir {}", dir.display())))?;
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let pending = name
                .strip_prefix(&format!(".{stem}."))
                .and_then(|r| r.strip_suffix(".pending"))
                .and_then(|id| id.parse::<CheckpointId>().ok());
            let committed = name == format!("{stem}.jsonl")
                || name.strip_prefix(&format!("{stem}.")).is_some_and(|r| r.ends_with(".jsonl"));
            let remove = match (pending, restored) {
                (Some(id), Some(k)) if id <= k => {
                    parts.commit_one(id)?;
                    false
                }
                (Some(_), _) => true,
                (None, _) if name == format!(".{stem}.open") => true,
                (None, None) => committed,
                (None, Some(_)) => false,
            };
            if remove {
                std::fs::remove_file(&path).map_err(io(format!("removing {}", path.display())))?;
            }
        }
        Ok(parts)
    }

    fn open_path(&self) -> PathBuf {
        self.dir.join(format!(".{}.open", self.stem))
    }

    fn pending_path(&self, id: CheckpointId) -> PathBuf {
        self.dir.join(format!(".{}.{id:012}.pending", self.stem))
    }

    fn committed_path(&self, id: CheckpointId) -> PathBuf {
        self.dir.join(format!("{}.{id:012}.jsonl", self.stem))
    }

    /// Appends one line to the open file.
    pub(super) fn write_line(&mut self, line: &[u8]) -> Result<(), RuntimeError> {
        if self.open.is_none() {
            let path = self.open_path();
            let file = File::create(&path).map_err(io(format!("creating {}", path.display())))?;
            self.open = Some(BufWriter::new(file));
        }
        if let Some(out) = self.open.as_mut() {
            out.write_all(line)
                .and_then(|()| out.write_all(b"\n"))
                .map_err(io("writing sink output".into()))?;
        }
        Ok(())
    }

    /// Flushes the open file (nothing becomes visible).
    pub(super) fn flush(&mut self) -> Result<(), RuntimeError> {
        match self.open.as_mut() {
            Some(out) => out.flush().map_err(io("flushing sink output".into())),
            None => Ok(()),
        }
    }

    /// Closes the open file into `to` (nothing if nothing was written since the last close).
    fn close_into(&mut self, to: &Path) -> Result<bool, RuntimeError> {
        let Some(mut out) = self.open.take() else { return Ok(false) };
        out.flush().map_err(io("flushing sink output".into()))?;
        out.get_ref().sync_all().map_err(io("syncing sink output".into()))?;
        drop(out);
        let from = self.open_path();
        std::fs::rename(&from, to).map_err(io(format!("renaming {} to {}", from.display(), to.display())))?;
        Ok(true)
    }

    /// The barrier of checkpoint `id`: what was written since the last one becomes its pending part.
    pub(super) fn barrier(&mut self, id: CheckpointId) -> Result<(), RuntimeError> {
        if self.close_into(&self.pending_path(id))? {
            self.pending.insert(id);
        }
        Ok(())
    }

    fn commit_one(&self, id: CheckpointId) -> Result<(), RuntimeError> {
        let (from, to) = (self.pending_path(id), self.committed_path(id));
        std::fs::rename(&from, &to).map_err(io(format!("committing {} as {}", from.display(), to.display())))
    }

    /// Checkpoint `id` completed: its pending parts and older ones become visible.
    pub(super) fn commit(&mut self, id: CheckpointId) -> Result<(), RuntimeError> {
        let done: Vec<CheckpointId> = self.pending.range(..=id).copied().collect();
        for p in done {
            self.commit_one(p)?;
            self.pending.remove(&p);
        }
        Ok(())
    }

    /// The end of input: everything written becomes visible.
    pub(super) fn finish(&mut self) -> Result<(), RuntimeError> {
        if let Some(last) = self.pending.last().copied() {
            self.commit(last)?;
        }
        let end = self.dir.join(format!("{}.end.jsonl", self.stem));
        self.close_into(&end)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn parts_become_visible_only_when_their_checkpoint_completes_and_a_restore_keeps_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut parts = PartFiles::open(dir.path(), "sink-0", None).expect("open");
        parts.write_line(b"1").expect("write");
        parts.barrier(1).expect("barrier 1");
        parts.write_line(b"2").expect("write");
        parts.barrier(2).expect("barrier 2");
        parts.write_line(b"3").expect("write");
        parts.flush().expect("flush");
        parts.commit(1).expect("commit 1");
        assert_eq!(
            listing(dir.path()),
            [".sink-0.000000000002.pending", ".sink-0.open", "sink-0.000000000001.jsonl"]
        );
        // A crash; the job restores checkpoint 2, whose commit never reached the sink.
        drop(parts);
        let mut parts = PartFiles::open(dir.path(), "sink-0", Some(2)).expect("reopen");
        assert_eq!(listing(dir.path()), ["sink-0.000000000001.jsonl", "sink-0.000000000002.jsonl"]);
        parts.write_line(b"3").expect("write");
        parts.finish().expect("finish");
        let text = |n: &str| std::fs::read_to_string(dir.path().join(n)).expect("read");
        assert_eq!(text("sink-0.end.jsonl"), "3\n");
        // A fresh run of the same task starts from nothing.
        PartFiles::open(dir.path(), "sink-0", None).expect("fresh");
        assert!(listing(dir.path()).is_empty());
    }
}
