//! The input switch: a manifest or the raw shard tables, read as chunks of rows.

use std::path::{Path, PathBuf};

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
    /// Where relative audio paths resolve when no `--audio-root` is given.
    default_audio_base: PathBuf,
}

impl Source {
    /// Opens the input (and checks its schema); reads no rows yet.
    pub(super) fn open(
        input: &Input,
        chunk_rows: usize,
        shard_source: &str,
    ) -> Result<Source, ManifestError> {
        let (reader, default_audio_base) = match input {
            Input::Manifest(p) => {
                let reader = Reader::Manifest(ManifestReader::open(p, chunk_rows)?);
                // Only `/` and the empty path have no parent, and neither opens as a parquet
                // file. A bare file name has the empty parent: the current directory.
                let dir = p.parent().expect("a path that opened as a manifest file has a parent");
                (reader, dir.to_path_buf())
            }
            Input::Shards(p) => {
                (Reader::Shards(ShardsReader::open(p, chunk_rows, shard_source)?), p.clone())
            }
        };
        Ok(Source { reader, exhausted: false, default_audio_base })
    }

    /// The directory relative audio paths resolve against when no `--audio-root` is given:
    /// the manifest's directory, or the shard root.
    pub(super) fn default_audio_base(&self) -> &Path {
        &self.default_audio_base
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
