//! Chunking of bucket scans, shared by all backends so chunk boundaries and byte counts agree.

use koala_types::BucketId;

use crate::{ScanSink, StateError, StateKey};

/// Collects scanned entries into chunks of at most `chunk_bytes` and hands full chunks to a sink.
///
/// An entry counts as `key.encoded_len() + value.len()` bytes. A chunk always holds at least one
/// entry, so an entry larger than `chunk_bytes` travels alone; empty chunks are never emitted.
pub(crate) struct Chunker<'s> {
    sink: ScanSink<'s>,
    chunk_bytes: usize,
    chunk: Vec<(StateKey, Vec<u8>)>,
    chunk_len: usize,
    total: u64,
}

impl<'s> Chunker<'s> {
    pub(crate) fn new(chunk_bytes: usize, sink: ScanSink<'s>) -> Self {
        Self { sink, chunk_bytes, chunk: Vec::new(), chunk_len: 0, total: 0 }
    }

    pub(crate) fn push(&mut self, key: StateKey, value: Vec<u8>) -> Result<(), StateError> {
        let size = key.encoded_len() + value.len();
        if !self.chunk.is_empty() && self.chunk_len.saturating_add(size) > self.chunk_bytes {
            self.flush()?;
        }
        self.chunk_len += size;
        self.total += size as u64;
        self.chunk.push((key, value));
        Ok(())
    }

    /// Emits the last partial chunk and returns the bytes scanned in total.
    pub(crate) fn finish(mut self) -> Result<u64, StateError> {
        self.flush()?;
        Ok(self.total)
    }

    fn flush(&mut self) -> Result<(), StateError> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        self.chunk_len = 0;
        (self.sink)(std::mem::take(&mut self.chunk))
    }
}

/// The buckets of a scan or delete in ascending order without repeats, so output is in key order.
pub(crate) fn sorted_buckets(buckets: &[BucketId]) -> Vec<BucketId> {
    let mut sorted = buckets.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sorted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &[u8], value_len: usize) -> (StateKey, Vec<u8>) {
        (StateKey::new(0, 0, key), vec![0; value_len])
    }

    #[test]
    fn chunks_respect_the_byte_limit_and_keep_oversized_entries_alone() -> Result<(), StateError> {
        let mut chunks = Vec::new();
        let mut sink = |chunk: Vec<(StateKey, Vec<u8>)>| {
            chunks.push(chunk.len());
            Ok(())
        };
        let mut chunker = Chunker::new(10, &mut sink);
        // Each entry is 3 (header) + 1 (key) + value bytes.
        for (key, value_len) in [(b"a", 1), (b"b", 1), (b"c", 1), (b"d", 20), (b"e", 0)] {
            let (key, value) = entry(key, value_len);
            chunker.push(key, value)?;
        }
        let total = chunker.finish()?;
        assert_eq!(total, 5 + 5 + 5 + 24 + 4);
        assert_eq!(chunks, vec![2, 1, 1, 1]);
        Ok(())
    }

    #[test]
    fn empty_scan_emits_nothing() -> Result<(), StateError> {
        let mut calls = 0;
        let mut sink = |_: Vec<(StateKey, Vec<u8>)>| {
            calls += 1;
            Ok(())
        };
        assert_eq!(Chunker::new(10, &mut sink).finish()?, 0);
        assert_eq!(calls, 0);
        Ok(())
    }

    #[test]
    fn buckets_are_sorted_and_deduplicated() {
        assert_eq!(sorted_buckets(&[5, 1, 5, 3]), vec![1, 3, 5]);
    }
}
