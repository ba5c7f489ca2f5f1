//! The input switch: a manifest or the raw shard tables, read as chunks of rows.

use crate::manifest::{ManifestError, ManifestReader, ManifestRow};
use crate::shards::ShardsReader;

use super::Input;

enum Reader {
    Manifest(ManifestReader),
    Shards(ShardsReader),
}

/// The rows of the input, in input order.
pub(super) struct Source {
    reader: Reader,
    exhausted: bool,
}

impl Source {
    /// Opens the input (and checks its schema); reads no rows yet.
    pub(super) fn open(
        input: &Input,
        chunk_rows: usize,
        shard_source: &str,
    ) -> Result<Source, ManifestError> {
        let reader = match input {
            Input::Manifest(p) => Reader::Manifest(ManifestReader::open(p, chunk_rows)?),
            Input::Shards(p) => Reader::Shards(ShardsReader::open(p, chunk_rows, shard_source)?),
        };
        Ok(Source { reader, exhausted: false })
    }

    /// Rows in the input (for progress).
    pub(super) fn rows(&self) -> u64 {
        match &self.reader {
            Reader::Manifest(r) => r.rows,
            Reader::Shards(r) => r.rows,
        }
    }

    /// The next chunk: at least `rows` rows (shard inputs return short batches, which are
    /// gathered), fewer at the end of the input, none once it is exhausted.
    pub(super) fn next_chunk(&mut self, rows: usize) -> Result<Vec<ManifestRow>, ManifestError> {
        let mut chunk = Vec::new();
        while !self.exhausted && chunk.len() < rows {
            let next = match &mut self.reader {
                Reader::Manifest(r) => r.next_chunk(),
                Reader::Shards(r) => r.next_chunk(),
            };
            match next {
                None => self.exhausted = true,
                Some(batch) => chunk.extend(batch?),
            }
        }
        Ok(chunk)
    }
}
