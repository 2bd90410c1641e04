//! Snapshots of a task's store: stream its keyspace to files and load it back
//! (docs/architecture.md §5). Built on [`StateBackend`] only, so it works for every backend (fjall
//! and memory), and shaped for checkpoints to reuse:
//!
//! - a snapshot is a directory: `manifest` (text) plus `part-NNNNN.kv` files of about
//!   `part_bytes` each, cut at bucket boundaries, so each part covers a contiguous bucket range
//!   and a restore can take only some buckets (a checkpoint restored at another parallelism,
//!   or a task's share of a warm-up snapshot);
//! - a part is a sequence of `u32 LE key length | encoded key | u32 LE value length | value`
//!   records in key order (the stored layout, `encode_state_key`), and the manifest lists for each
//!   part its buckets, entries, bytes and xxh3 checksum, checked on restore;
//! - each bucket is read from one consistent view ([`StateBackend::scan_buckets`]); the whole
//!   keyspace is consistent when nothing writes meanwhile (a warm-up, or a checkpoint taken at a
//!   barrier while the task is paused).
//!
//! ```
//! use koala_state::snapshot::{restore, snapshot};
//! use koala_state::{MemoryEnv, StateEnv, StateKey, StateWrite};
//! use koala_types::{OperatorId, TaskId};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let env = MemoryEnv::new();
//! let store = env.open_task(TaskId::new(OperatorId(1), 0))?;
//! store.write_many(vec![StateWrite::Put(StateKey::new(7, 0, b"k".to_vec()), b"v".to_vec())])?;
//! let dir = tempfile::tempdir()?;
//! let taken = snapshot(store.as_ref(), 128, dir.path(), 1 << 20)?;
//! let copy = env.open_task(TaskId::new(OperatorId(1), 1))?;
//! let restored = restore(copy.as_ref(), dir.path(), None)?;
//! assert_eq!((taken.entries, restored.entries), (1, 1));
//! assert_eq!(copy.get_many(&[StateKey::new(7, 0, b"k".to_vec())])?, vec![Some(b"v".to_vec())]);
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use koala_types::BucketId;
use xxhash_rust::xxh3::Xxh3;

use crate::{StateBackend, StateError, StateKey, StateWrite, decode_state_key, encode_state_key};

mod incremental;

pub use incremental::{IncrementalStats, MAX_DELTAS, snapshot_frozen};

const MAGIC: &str = "koala-snapshot 1";
/// Bytes of entries a restore writes per batch.
const RESTORE_BATCH_BYTES: usize = 4 << 20;

/// Why a snapshot could not be written or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Reading or writing a snapshot file failed.
    #[error("snapshot {}: {op} failed", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot file is not what its manifest says (truncated, corrupted, foreign).
    #[error("snapshot {}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The store failed while being read or written.
    #[error(transparent)]
    State(#[from] StateError),
}

/// What a part file holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PartKind {
    /// Every entry of its buckets.
    #[default]
    Full,
    /// Changes to apply over the parts listed before it: puts, and deletes (a value length of
    /// [`DELETED`]).
    Delta,
}

/// The value length a delta part gives a deleted key.
pub const DELETED: u32 = u32::MAX;

/// One part file of a snapshot, as its manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Full or delta.
    pub kind: PartKind,
    /// File name inside the snapshot directory.
    pub file: String,
    /// First and last bucket it holds entries of.
    pub buckets: (BucketId, BucketId),
    /// Entries in it.
    pub entries: u64,
    /// Bytes of the file.
    pub bytes: u64,
    /// xxh3-64 of the file's bytes.
    pub checksum: u64,
}

/// What a snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// Buckets of the operator the store belongs to.
    pub num_buckets: u16,
    /// The part files, in key order.
    pub parts: Vec<Part>,
}

/// What a snapshot or a restore moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotStats {
    /// Entries written or loaded.
    pub entries: u64,
    /// Bytes of the part files written or read.
    pub bytes: u64,
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io { path: path.to_path_buf(), op, source }
}

/// A part file being written.
struct PartWriter {
    path: PathBuf,
    out: BufWriter<File>,
    hash: Xxh3,
    part: Part,
}

impl PartWriter {
    fn create(dir: &Path, index: usize, bucket: BucketId) -> Result<Self, SnapshotError> {
        let file = format!("part-{index:05}.kv");
        let path = dir.join(&file);
        let out =
            BufWriter::with_capacity(1 << 20, File::create(&path).map_err(io(&path, "creating a part"))?);
        let part =
            Part { kind: PartKind::Full, file, buckets: (bucket, bucket), entries: 0, bytes: 0, checksum: 0 };
        Ok(Self { path, out, hash: Xxh3::new(), part })
    }

    fn write(&mut self, bucket: BucketId, key: &[u8], value: &[u8]) -> Result<(), SnapshotError> {
        self.write_entry(bucket, key, Some(value))
    }

    /// Writes one entry; `None` (a delta part's delete) is written as the length [`DELETED`].
    fn write_entry(
        &mut self,
        bucket: BucketId,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), SnapshotError> {
        let len = value.map_or(DELETED, |v| v.len() as u32).to_le_bytes();
        for bytes in [&(key.len() as u32).to_le_bytes()[..], key, &len, value.unwrap_or_default()] {
            self.out.write_all(bytes).map_err(io(&self.path, "writing a part"))?;
            self.hash.update(bytes);
            self.part.bytes += bytes.len() as u64;
        }
        self.part.entries += 1;
        self.part.buckets.1 = bucket;
        Ok(())
    }

    fn finish(self) -> Result<Part, SnapshotError> {
        let (part, file, path) = self.finish_unsynced()?;
        file.sync_all().map_err(io(&path, "syncing a part"))?;
        Ok(part)
    }

    /// Closes the part without syncing it: its manifest entry, its file and path.
    fn finish_unsynced(mut self) -> Result<(Part, File, PathBuf), SnapshotError> {
        self.out.flush().map_err(io(&self.path, "writing a part"))?;
        self.part.checksum = self.hash.digest();
        let file = self.out.into_inner().map_err(|e| io(&self.path, "writing a part")(e.into_error()))?;
        Ok((self.part, file, self.path))
    }
}

/// Writes a snapshot from entries given in stored key order (`encode_state_key` order:
/// bucket, state id, user key) — what [`snapshot`] does with a store's scan, and what a warm-up
/// does with generated state, without a store in between.
pub struct SnapshotWriter {
    dir: PathBuf,
    num_buckets: u16,
    part_bytes: u64,
    parts: Vec<Part>,
    current: Option<PartWriter>,
    last_key: Option<Vec<u8>>,
}

impl SnapshotWriter {
    /// Starts a snapshot in `dir` (created; it must not hold one already), cut into parts of
    /// about `part_bytes` at bucket boundaries.
    pub fn create(dir: &Path, num_buckets: u16, part_bytes: u64) -> Result<Self, SnapshotError> {
        std::fs::create_dir_all(dir).map_err(io(dir, "creating the directory"))?;
        let manifest = dir.join("manifest");
        if manifest.exists() {
            return Err(SnapshotError::Corrupt {
                path: manifest,
                reason: "already holds a snapshot; give an empty directory".into(),
            });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            num_buckets,
            part_bytes,
            parts: Vec::new(),
            current: None,
            last_key: None,
        })
    }

    /// Adds one entry; entries must come in strictly ascending stored key order.
    pub fn put(&mut self, key: &StateKey, value: &[u8]) -> Result<(), SnapshotError> {
        let corrupt = |reason: String| SnapshotError::Corrupt { path: self.dir.clone(), reason };
        if key.bucket >= self.num_buckets {
            return Err(corrupt(format!(
                "bucket {} is not below num_buckets {}",
                key.bucket, self.num_buckets
            )));
        }
        let encoded = encode_state_key(key).map_err(|e| corrupt(e.to_string()))?;
        if self.last_key.as_ref().is_some_and(|last| *last >= encoded) {
            return Err(corrupt("entries are not in ascending key order".into()));
        }
        if let Some(w) = self.current.as_ref()
            && w.part.bytes >= self.part_bytes
            && key.bucket != w.part.buckets.1
            && let Some(full) = self.current.take()
        {
            self.parts.push(full.finish()?);
        }
        let writer = match self.current.as_mut() {
            Some(w) => w,
            None => self.current.insert(PartWriter::create(&self.dir, self.parts.len(), key.bucket)?),
        };
        writer.write(key.bucket, &encoded, value)?;
        self.last_key = Some(encoded);
        Ok(())
    }

    /// Closes the last part and writes the manifest (last: a directory with a manifest holds a
    /// whole snapshot).
    pub fn finish(mut self) -> Result<SnapshotStats, SnapshotError> {
        if let Some(last) = self.current.take() {
            self.parts.push(last.finish()?);
        }
        let manifest = Manifest { num_buckets: self.num_buckets, parts: self.parts };
        write_manifest(&self.dir.join("manifest"), &manifest)?;
        Ok(SnapshotStats {
            entries: manifest.parts.iter().map(|p| p.entries).sum(),
            bytes: manifest.parts.iter().map(|p| p.bytes).sum(),
        })
    }
}

/// Writes every entry of `store` (buckets `0..num_buckets`) into `dir` (created; it must not hold
/// an older snapshot), in parts of about `part_bytes`, cut at bucket boundaries.
pub fn snapshot(
    store: &dyn StateBackend,
    num_buckets: u16,
    dir: &Path,
    part_bytes: u64,
) -> Result<SnapshotStats, SnapshotError> {
    let mut writer = SnapshotWriter::create(dir, num_buckets, part_bytes)?;
    for bucket in 0..num_buckets {
        let mut failed = None;
        let scanned = store.scan_buckets(&[bucket], 1 << 20, &mut |chunk| {
            for (key, value) in chunk {
                if let Err(e) = writer.put(&key, &value) {
                    let reason = e.to_string();
                    failed = Some(e);
                    return Err(StateError::sink(reason));
                }
            }
            Ok(())
        });
        if let Some(e) = failed {
            return Err(e);
        }
        scanned?;
    }
    writer.finish()
}

fn write_manifest(path: &Path, m: &Manifest) -> Result<(), SnapshotError> {
    let mut text = format!("{MAGIC}\nnum_buckets {}\n", m.num_buckets);
    for p in &m.parts {
        text.push_str(&format!(
            "{} {} {} {} {} {} {:016x}\n",
            match p.kind {
                PartKind::Full => "part",
                PartKind::Delta => "delta",
            },
            p.file,
            p.buckets.0,
            p.buckets.1,
            p.entries,
            p.bytes,
            p.checksum
        ));
    }
    // Written last and renamed into place: a directory with a manifest holds a whole snapshot.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(io(&tmp, "writing the manifest"))?;
    std::fs::rename(&tmp, path).map_err(io(path, "writing the manifest"))
}

/// Reads the manifest of the snapshot in `dir`.
pub fn read_manifest(dir: &Path) -> Result<Manifest, SnapshotError> {
    let path = dir.join("manifest");
    let text = std::fs::read_to_string(&path).map_err(io(&path, "reading the manifest"))?;
    let corrupt = |reason: String| SnapshotError::Corrupt { path: path.clone(), reason };
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err(corrupt(format!("not a koala snapshot (first line is not {MAGIC:?})")));
    }
    let num_buckets = lines
        .next()
        .and_then(|l| l.strip_prefix("num_buckets "))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| corrupt("second line is not `num_buckets N`".into()))?;
    let mut parts = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split(' ').collect();
        let part = match f.as_slice() {
            [kind @ ("part" | "delta"), file, first, last, entries, bytes, checksum] => (|| {
                Some(Part {
                    kind: if *kind == "delta" { PartKind::Delta } else { PartKind::Full },
                    file: (*file).to_string(),
                    buckets: (first.parse().ok()?, last.parse().ok()?),
                    entries: entries.parse().ok()?,
                    bytes: bytes.parse().ok()?,
                    checksum: u64::from_str_radix(checksum, 16).ok()?,
                })
            })(),
            _ => None,
        };
        parts.push(part.ok_or_else(|| corrupt(format!("bad part line {line:?}")))?);
    }
    Ok(Manifest { num_buckets, parts })
}

/// Loads the snapshot in `dir` into `store` — every entry, or only those of `buckets` — in
/// batches, overwriting keys the store holds; a delta part's deletes delete (parts apply in the
/// manifest's order). Checks each part against its manifest entry
/// (length, entries, checksum); a part that does not match fails the restore naming the part,
/// with what came before it already written (restore into a fresh store).
pub fn restore(
    store: &dyn StateBackend,
    dir: &Path,
    buckets: Option<&BTreeSet<BucketId>>,
) -> Result<SnapshotStats, SnapshotError> {
    let manifest = read_manifest(dir)?;
    let mut stats = SnapshotStats::default();
    for part in &manifest.parts {
        if let Some(wanted) = buckets
            && wanted.range(part.buckets.0..=part.buckets.1).next().is_none()
        {
            continue;
        }
        let path = dir.join(&part.file);
        let corrupt = |reason: String| SnapshotError::Corrupt { path: path.clone(), reason };
        let mut input =
            BufReader::with_capacity(1 << 20, File::open(&path).map_err(io(&path, "opening a part"))?);
        let mut hash = Xxh3::new();
        let (mut read, mut entries) = (0u64, 0u64);
        let mut batch: Vec<StateWrite> = Vec::new();
        let mut batch_bytes = 0;
        // A field: `None` at the end of the file, `Some(None)` for a delta's deleted value.
        let mut field =
            |input: &mut BufReader<File>, value: bool| -> Result<Option<Option<Vec<u8>>>, SnapshotError> {
                let mut len = [0u8; 4];
                match input.read_exact(&mut len) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                    Err(e) => return Err(io(&path, "reading a part")(e)),
                }
                let n = u32::from_le_bytes(len);
                if value && n == DELETED && part.kind == PartKind::Delta {
                    hash.update(&len);
                    read += 4;
                    return Ok(Some(None));
                }
                let n = u64::from(n);
                if read + 4 + n > part.bytes {
                    return Err(corrupt(format!(
                        "a field of {n} bytes runs past the {} bytes listed",
                        part.bytes
                    )));
                }
                let mut bytes = vec![0u8; n as usize];
                input.read_exact(&mut bytes).map_err(|_| corrupt("truncated".into()))?;
                hash.update(&len);
                hash.update(&bytes);
                read += 4 + n;
                Ok(Some(Some(bytes)))
            };
        while let Some(key) = field(&mut input, false)? {
            let key = key.ok_or_else(|| corrupt("a key field marked deleted".into()))?;
            let value = field(&mut input, true)?.ok_or_else(|| corrupt("a key without its value".into()))?;
            let key = decode_state_key(&key).map_err(|e| corrupt(format!("undecodable key: {e}")))?;
            entries += 1;
            if buckets.is_some_and(|b| !b.contains(&key.bucket)) {
                continue;
            }
            batch_bytes += key.encoded_len() + value.as_ref().map_or(0, Vec::len);
            batch.push(match value {
                Some(value) => StateWrite::Put(key, value),
                None => StateWrite::Delete(key),
            });
            if batch_bytes >= RESTORE_BATCH_BYTES {
                stats.entries += batch.len() as u64;
                store.write_many(std::mem::take(&mut batch))?;
                batch_bytes = 0;
            }
        }
        if read != part.bytes || entries != part.entries || hash.digest() != part.checksum {
            return Err(corrupt(format!(
                "holds {read} bytes and {entries} entries with checksum {:016x}; the manifest lists {} bytes, {} entries, {:016x}",
                hash.digest(),
                part.bytes,
                part.entries,
                part.checksum
            )));
        }
        stats.entries += batch.len() as u64;
        if !batch.is_empty() {
            store.write_many(batch)?;
        }
        stats.bytes += read;
    }
    Ok(stats)
}
