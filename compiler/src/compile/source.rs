//! The input switch: a manifest, the raw shard tables, or another dataset layout (`inputs`),
//! read as chunks of rows.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use crate::inputs::{hf, kaldi, lhotse, nemo, shar, wds, Format, TarCache};
use crate::manifest::{ManifestReader, ManifestRow};
use crate::shards::ShardsReader;

use super::{CompileError, CompileOptions, Input};

enum Reader {
    Manifest(ManifestReader),
    Shards(ShardsReader),
    /// Hugging Face parquet, streamed in record batches (the audio is inside).
    Hf(hf::HfReader),
    /// A layout read whole when it opens (text and tar headers; the audio is read later).
    Rows(VecDeque<ManifestRow>),
}

/// The rows of the input, in input order.
pub(super) struct Source {
    reader: Reader,
    exhausted: bool,
    rows: u64,
    /// Where relative audio paths resolve when no `--audio-root` is given.
    default_audio_base: PathBuf,
}

impl Source {
    /// Opens the input (and checks its schema); reads no rows yet from a parquet input, every
    /// row of another layout.
    pub(super) fn open(opts: &CompileOptions, tars: &TarCache) -> Result<Source, CompileError> {
        let chunk_rows = opts.chunk_rows;
        let (reader, default_audio_base) = match &opts.input {
            Input::Manifest(p) => {
                let reader = Reader::Manifest(ManifestReader::open(p, chunk_rows)?);
                // Only `/` and the empty path have no parent, and neither opens as a parquet
                // file. A bare file name has the empty parent: the current directory.
                let dir = p.parent().expect("a path that opened as a manifest file has a parent");
                (reader, dir.to_path_buf())
            }
            Input::Shards(p) => {
                (Reader::Shards(ShardsReader::open(p, chunk_rows, &opts.shard_source)?), p.clone())
            }
            Input::Dataset { format: Format::Hf, paths } => {
                let o = hf::HfOptions {
                    columns: opts.columns.clone(),
                    audio_root: opts.audio_root.clone(),
                    source: opts.source.clone(),
                };
                (Reader::Hf(hf::HfReader::open(paths, &o, chunk_rows)?), PathBuf::new())
            }
            Input::Dataset { format, paths } => {
                let rows = match format {
                    Format::Seed | Format::Hf => {
                        return Err(CompileError::Options(
                            "the seed manifest is Input::Manifest, and Hugging Face parquet is \
                             streamed: neither is read whole"
                                .into(),
                        ))
                    }
                    Format::Lhotse => {
                        let o = lhotse::LhotseOptions {
                            audio_root: opts.audio_root.clone(),
                            source: opts.source.clone(),
                            allow_pipes: opts.allow_pipes,
                        };
                        lhotse::read(paths, &o)?
                    }
                    Format::LhotseShar => {
                        shar::read(paths, &shar::SharOptions { source: opts.source.clone() }, tars)?
                    }
                    Format::Nemo | Format::NemoTarred => {
                        let o = nemo::NemoOptions {
                            audio_root: opts.audio_root.clone(),
                            source: opts.source.clone(),
                            tarred_audio_filepaths: opts.tarred_audio_filepaths.clone(),
                        };
                        nemo::read(paths, &o, tars)?
                    }
                    Format::Wds => {
                        wds::read(paths, &wds::WdsOptions { source: opts.source.clone() }, tars)?
                    }
                    Format::Kaldi => {
                        let [dir] = paths.as_slice() else {
                            return Err(CompileError::Options(format!(
                                "a Kaldi input is one data directory, {} paths were given",
                                paths.len()
                            )));
                        };
                        let o = kaldi::KaldiOptions {
                            audio_root: opts.audio_root.clone(),
                            source: opts.source.clone(),
                            allow_pipes: opts.allow_pipes,
                        };
                        kaldi::read(dir, &o)?
                    }
                };
                // Rows carry their audio resolved already; the base is not used.
                (Reader::Rows(rows.into()), PathBuf::new())
            }
        };
        let rows = match &reader {
            Reader::Manifest(r) => r.rows,
            Reader::Shards(r) => r.rows,
            Reader::Hf(r) => r.rows,
            Reader::Rows(r) => r.len() as u64,
        };
        Ok(Source { reader, exhausted: false, rows, default_audio_base })
    }

    /// The directory relative audio paths resolve against when no `--audio-root` is given:
    /// the manifest's directory, or the shard root.
    pub(super) fn default_audio_base(&self) -> &Path {
        &self.default_audio_base
    }

    /// Rows in the input (for progress).
    pub(super) fn rows(&self) -> u64 {
        self.rows
    }

    /// The next chunk: at least `rows` rows (shard inputs return short batches, which are
    /// gathered; rows cut from one recording are never split between chunks, so that it is
    /// decoded once), fewer at the end of the input, none once it is exhausted.
    pub(super) fn next_chunk(&mut self, rows: usize) -> Result<Vec<ManifestRow>, CompileError> {
        let mut chunk: Vec<ManifestRow> = Vec::new();
        if let Reader::Rows(queue) = &mut self.reader {
            while let Some(next) = queue.front() {
                let same_recording = next.segment.is_some()
                    && chunk.last().is_some_and(|l| l.segment.is_some() && l.audio == next.audio);
                if chunk.len() >= rows && !same_recording {
                    break;
                }
                chunk.extend(queue.pop_front());
            }
            return Ok(chunk);
        }
        while !self.exhausted && chunk.len() < rows {
            let next = match &mut self.reader {
                Reader::Manifest(r) => r.next_chunk(),
                Reader::Shards(r) => r.next_chunk(),
                Reader::Hf(r) => match r.next_chunk() {
                    None => None,
                    Some(batch) => Some(Ok(batch?)),
                },
                Reader::Rows(_) => None,
            };
            match next {
                None => self.exhausted = true,
                Some(batch) => chunk.extend(batch?),
            }
        }
        Ok(chunk)
    }
}
