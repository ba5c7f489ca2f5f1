//! The raw shard layout: the per-shard tables a training-ready manifest is built from.
//!
//! ```text
//! ROOT/…/<shard>/metadata.parquet     segment_id, transcription_native, duration_s,
//!                                     tx_quality_score, segment_language
//! ROOT/…/<shard>/audio_index.parquet  segment_id, tar_member_name
//! ROOT/…/<shard>/<tar_member_name>    the FLAC files
//! ```
//!
//! A shard is any directory below ROOT holding `metadata.parquet`; shards are visited in byte
//! order of their paths and rows in file order, so the output is deterministic. The two tables
//! are joined on `segment_id` (inner join, as the pipeline's `build_manifest.py` does): a metadata
//! row with no audio index row comes back without a file name and the compiler rejects it as
//! `no_audio_index`. A null `segment_language` falls back to the language named by the shard's
//! path (the nearest directory, from the shard up, whose name is a known language code or name).
//!
//! Memory: one shard's audio index (segment id and file name per row) plus one record batch.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use crate::lang;
use crate::manifest::{
    float_at, require_float, require_string, string_at, ManifestError, ManifestRow,
};

/// Metadata table file name.
pub const METADATA_FILE: &str = "metadata.parquet";
/// Audio index table file name.
pub const AUDIO_INDEX_FILE: &str = "audio_index.parquet";

/// One shard directory.
#[derive(Debug, Clone)]
struct Shard {
    dir: PathBuf,
    id: String,
    path_language: Option<String>,
}

/// Streams the rows of every shard below a root, joined and in a fixed order.
pub struct ShardsReader {
    shards: Vec<Shard>,
    next_shard: usize,
    current: Option<(Shard, ParquetRecordBatchReader, HashMap<String, String>)>,
    batch_rows: usize,
    next_row: u64,
    source: String,
    /// Total metadata rows over all shards, from the files' footers.
    pub rows: u64,
}

impl std::fmt::Debug for ShardsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardsReader")
            .field("shards", &self.shards.len())
            .field("rows", &self.rows)
            .finish()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ManifestError + '_ {
    move |source| ManifestError::Io { path: path.to_path_buf(), source }
}

fn pq_err(path: &Path) -> impl Fn(parquet::errors::ParquetError) -> ManifestError + '_ {
    move |e| ManifestError::Parquet { path: path.to_path_buf(), message: e.to_string() }
}

/// Every directory below `root` (root included) that holds a metadata table, in path order.
fn find_shards(root: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut children = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            let path = entry.path();
            if path.is_dir() {
                children.push(path);
            }
        }
        if dir.join(METADATA_FILE).is_file() {
            found.push(dir);
        }
        stack.extend(children);
    }
    found.sort();
    Ok(found)
}

fn open_table(
    path: &Path,
    strings: &[&'static str],
    floats: &[&'static str],
) -> Result<ParquetRecordBatchReaderBuilder<File>, ManifestError> {
    let file = File::open(path).map_err(io_err(path))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(pq_err(path))?;
    for &c in strings {
        require_string(path, builder.schema(), c)?;
    }
    for &c in floats {
        require_float(path, builder.schema(), c)?;
    }
    Ok(builder)
}

const META_STRINGS: [&str; 3] = ["segment_id", "transcription_native", "segment_language"];
const META_FLOATS: [&str; 2] = ["duration_s", "tx_quality_score"];
const INDEX_STRINGS: [&str; 2] = ["segment_id", "tar_member_name"];

impl ShardsReader {
    /// Finds the shards below `root` and checks every table's schema (so a bad shard fails before
    /// any work is done); reads no rows yet. `source` names the corpus of origin of every row.
    pub fn open(
        root: &Path,
        batch_rows: usize,
        source: &str,
    ) -> Result<ShardsReader, ManifestError> {
        let dirs = find_shards(root)?;
        let mut shards = Vec::with_capacity(dirs.len());
        let mut rows = 0u64;
        for dir in dirs {
            let meta = open_table(&dir.join(METADATA_FILE), &META_STRINGS, &META_FLOATS)?;
            rows += meta.metadata().file_metadata().num_rows().max(0) as u64;
            let index_path = dir.join(AUDIO_INDEX_FILE);
            if !index_path.is_file() {
                return Err(ManifestError::Io {
                    path: index_path,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "a shard with metadata.parquet needs audio_index.parquet beside it",
                    ),
                });
            }
            open_table(&index_path, &INDEX_STRINGS, &[])?;
            let rel = dir.strip_prefix(root).unwrap_or(&dir);
            let mut id = rel.to_string_lossy().replace('\\', "/");
            if id.is_empty() {
                // The root is itself a shard: its name, or no shard id for a root without one
                // (`--shards .`).
                id = root.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
            }
            // The nearest directory, from the shard up to the root, named after a language.
            let path_language = dir
                .ancestors()
                .take(rel.components().count() + 1)
                .filter_map(|a| a.file_name())
                .map(|n| lang::normalize(&n.to_string_lossy()))
                .find(|c| c.known)
                .map(|c| c.code);
            shards.push(Shard { dir, id, path_language });
        }
        Ok(ShardsReader {
            shards,
            next_shard: 0,
            current: None,
            batch_rows: batch_rows.max(1),
            next_row: 0,
            source: source.to_owned(),
            rows,
        })
    }

    fn open_next_shard(&mut self) -> Result<bool, ManifestError> {
        let Some(shard) = self.shards.get(self.next_shard).cloned() else {
            return Ok(false);
        };
        self.next_shard += 1;
        let index_path = shard.dir.join(AUDIO_INDEX_FILE);
        let reader =
            open_table(&index_path, &INDEX_STRINGS, &[])?.build().map_err(pq_err(&index_path))?;
        let mut index = HashMap::new();
        for batch in reader {
            let batch = batch.map_err(|e| ManifestError::Parquet {
                path: index_path.clone(),
                message: e.to_string(),
            })?;
            let (Some(ids), Some(names)) =
                (batch.column_by_name("segment_id"), batch.column_by_name("tar_member_name"))
            else {
                continue;
            };
            for i in 0..batch.num_rows() {
                if let (Some(id), Some(name)) =
                    (string_at(ids.as_ref(), i), string_at(names.as_ref(), i))
                {
                    // First entry wins, as with every duplicate in this compiler.
                    index.entry(id).or_insert(name);
                }
            }
        }
        let meta_path = shard.dir.join(METADATA_FILE);
        let meta = open_table(&meta_path, &META_STRINGS, &META_FLOATS)?
            .with_batch_size(self.batch_rows)
            .build()
            .map_err(pq_err(&meta_path))?;
        self.current = Some((shard, meta, index));
        Ok(true)
    }

    /// The next chunk of rows (never spanning two shards), or `None` at the end.
    pub fn next_chunk(&mut self) -> Option<Result<Vec<ManifestRow>, ManifestError>> {
        loop {
            if self.current.is_none() {
                match self.open_next_shard() {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => return Some(Err(e)),
                }
            }
            let (shard, reader, index) = self.current.as_mut()?;
            match reader.next() {
                None => self.current = None,
                Some(Err(e)) => {
                    return Some(Err(ManifestError::Parquet {
                        path: shard.dir.join(METADATA_FILE),
                        message: e.to_string(),
                    }))
                }
                Some(Ok(batch)) => {
                    let rows = join(&batch, shard, index, self.next_row, &self.source);
                    self.next_row += batch.num_rows() as u64;
                    return Some(Ok(rows));
                }
            }
        }
    }
}

fn join(
    batch: &RecordBatch,
    shard: &Shard,
    index: &HashMap<String, String>,
    first_row: u64,
    source: &str,
) -> Vec<ManifestRow> {
    let col = |name: &str| batch.column_by_name(name);
    let (ids, texts, langs) =
        (col("segment_id"), col("transcription_native"), col("segment_language"));
    let (durations, qualities) = (col("duration_s"), col("tx_quality_score"));
    (0..batch.num_rows())
        .map(|i| {
            let s = |c: Option<&arrow::array::ArrayRef>| c.and_then(|c| string_at(c.as_ref(), i));
            let f = |c: Option<&arrow::array::ArrayRef>| c.and_then(|c| float_at(c.as_ref(), i));
            let segment_id = s(ids);
            let member = segment_id.as_ref().and_then(|id| index.get(id)).cloned();
            ManifestRow {
                row: first_row + i as u64,
                tar_member_name: member,
                segment_id,
                shard_id: Some(shard.id.clone()),
                text: s(texts),
                lang: s(langs).filter(|l| !l.trim().is_empty()).or(shard.path_language.clone()),
                tar_path: None,
                source: Some(source.to_owned()),
                duration: f(durations),
                quality: f(qualities),
                audio_dir: Some(shard.dir.clone()),
                ..Default::default()
            }
        })
        .collect()
}
