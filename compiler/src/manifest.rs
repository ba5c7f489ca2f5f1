//! The training-ready manifest (parquet): one row per utterance, read in record batches so
//! memory stays bounded whatever the manifest's size.
//!
//! Columns (README.md "Manifest schema"): `segment_id`, `shard_id`, `text`, `duration`, `lang`,
//! `tar_member_name`, `tar_path`, `source`. Strings may be `Utf8`, `LargeUtf8` or `Utf8View`;
//! `duration` `Float64` or `Float32`. A schema problem (missing column, wrong type) is an error
//! naming the column; a bad value (a null) is not: the row comes back with `None` and the
//! compiler rejects it with a reason.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type, Float64Type, Schema};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use crate::audio::segment::Segment;
use crate::inputs::AudioRef;
use crate::reason::Reason;

/// The manifest's string columns, in the order [`ManifestRow::fields`] lists them.
pub const STRING_COLUMNS: [&str; 7] =
    ["segment_id", "shard_id", "text", "lang", "tar_member_name", "tar_path", "source"];
/// The duration column.
pub const DURATION_COLUMN: &str = "duration";

/// Why a manifest cannot be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file cannot be opened.
    #[error("cannot open manifest {path}: {source}")]
    Io {
        /// Manifest path.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is not readable parquet.
    #[error("manifest {path}: {message}")]
    Parquet {
        /// Manifest path.
        path: PathBuf,
        /// What the parquet reader said.
        message: String,
    },
    /// A required column is absent.
    #[error("manifest {path}: missing column `{column}` (columns present: {present})")]
    MissingColumn {
        /// Manifest path.
        path: PathBuf,
        /// The column.
        column: &'static str,
        /// The columns the file has.
        present: String,
    },
    /// A column has a type this reader does not take.
    #[error("manifest {path}: column `{column}` has type {found}, expected {expected}")]
    ColumnType {
        /// Manifest path.
        path: PathBuf,
        /// The column.
        column: &'static str,
        /// What is accepted.
        expected: &'static str,
        /// What the file has.
        found: String,
    },
}

/// One manifest row; `None` where the value is null.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ManifestRow {
    /// Row number in the manifest, from 0.
    pub row: u64,
    /// Segment id.
    pub segment_id: Option<String>,
    /// Shard id.
    pub shard_id: Option<String>,
    /// Transcript, with its `<|lang|>` prefix in a training-ready manifest.
    pub text: Option<String>,
    /// Language label.
    pub lang: Option<String>,
    /// FLAC file name.
    pub tar_member_name: Option<String>,
    /// Legacy tar path; the audio is in its directory.
    pub tar_path: Option<String>,
    /// Corpus of origin.
    pub source: Option<String>,
    /// Duration in seconds, as the manifest claims.
    pub duration: Option<f64>,
    /// Transcript quality score (raw shard layout only).
    pub quality: Option<f64>,
    /// Directory holding the audio file, when the source knows it directly (raw shard layout);
    /// otherwise the audio is in `dirname(tar_path)`.
    pub audio_dir: Option<PathBuf>,
    /// The audio, when the input names it directly (every layout but the seed's manifest and
    /// raw shards, whose audio is found from `tar_path`, `audio_dir` and `tar_member_name`).
    pub audio: Option<AudioRef>,
    /// The part of the recording this row is, when it is a cut of a longer one.
    pub segment: Option<Segment>,
    /// Where the row was read: `FILE:LINE`, `ARCHIVE:KEY` (for the report).
    pub origin: Option<String>,
    /// Why the row could not be read (a malformed line or entry): stage 1 drops it with this
    /// reason and detail.
    pub malformed: Option<(Reason, String)>,
}

impl ManifestRow {
    /// Every field as text (null as empty), for exact-duplicate detection.
    pub fn fields(&self) -> Vec<String> {
        let s = |v: &Option<String>| v.clone().unwrap_or_default();
        vec![
            s(&self.segment_id),
            s(&self.shard_id),
            s(&self.text),
            s(&self.lang),
            s(&self.tar_member_name),
            s(&self.tar_path),
            s(&self.source),
            self.duration.map(|d| d.to_string()).unwrap_or_default(),
            self.quality.map(|q| q.to_string()).unwrap_or_default(),
            self.audio_dir.as_ref().map(|d| d.display().to_string()).unwrap_or_default(),
            self.audio.as_ref().map(AudioRef::key).unwrap_or_default(),
            self.segment.map(|s| format!("{s:?}")).unwrap_or_default(),
        ]
    }

    /// Where the audio is: the row's own [`AudioRef`] when the input named one; else, for the
    /// seed's layouts, member `tar_member_name` of the archive `tar_path` when that archive
    /// exists, or the file `dirname(tar_path)/tar_member_name` (relative paths resolved
    /// against `base`, the manifest's directory or `--audio-root`).
    pub fn audio_ref(&self, base: &Path) -> Option<AudioRef> {
        if let Some(a) = &self.audio {
            return Some(a.clone());
        }
        let member = self.tar_member_name.as_deref().filter(|m| !m.is_empty())?;
        if self.audio_dir.is_none() {
            if let Some(tar) = self.tar_path.as_deref().filter(|t| !t.is_empty()) {
                let tar = base.join(tar);
                if tar.is_file() {
                    return Some(AudioRef::Member { tar, member: member.to_owned(), span: None });
                }
            }
        }
        self.audio_path(base).map(AudioRef::File)
    }

    /// The audio file: `dirname(tar_path)/tar_member_name`, a relative result resolved against
    /// `base` (the manifest's directory, or `--audio-root`).
    pub fn audio_path(&self, base: &Path) -> Option<PathBuf> {
        let member = self.tar_member_name.as_deref().filter(|m| !m.is_empty())?;
        if let Some(dir) = &self.audio_dir {
            let p = dir.join(member);
            return Some(if p.is_absolute() { p } else { base.join(p) });
        }
        let dir =
            self.tar_path.as_deref().and_then(|t| Path::new(t).parent()).unwrap_or(Path::new(""));
        let p = dir.join(member);
        Some(if p.is_absolute() { p } else { base.join(p) })
    }
}

/// Streams a manifest's rows in record batches.
pub struct ManifestReader {
    path: PathBuf,
    batches: ParquetRecordBatchReader,
    next_row: u64,
    /// Total rows, from the file's metadata.
    pub rows: u64,
}

impl std::fmt::Debug for ManifestReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManifestReader")
            .field("path", &self.path)
            .field("rows", &self.rows)
            .finish()
    }
}

/// Checks that `column` exists and holds strings.
pub(crate) fn require_string(
    path: &Path,
    schema: &Schema,
    column: &'static str,
) -> Result<(), ManifestError> {
    let f = find_column(path, schema, column)?;
    if !matches!(f.data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
        return Err(ManifestError::ColumnType {
            path: path.to_path_buf(),
            column,
            expected: "a string (Utf8, LargeUtf8 or Utf8View)",
            found: f.data_type().to_string(),
        });
    }
    Ok(())
}

/// Checks that `column` exists and holds floating-point numbers.
pub(crate) fn require_float(
    path: &Path,
    schema: &Schema,
    column: &'static str,
) -> Result<(), ManifestError> {
    let f = find_column(path, schema, column)?;
    if !matches!(f.data_type(), DataType::Float64 | DataType::Float32) {
        return Err(ManifestError::ColumnType {
            path: path.to_path_buf(),
            column,
            expected: "a float (Float64 or Float32)",
            found: f.data_type().to_string(),
        });
    }
    Ok(())
}

fn find_column<'s>(
    path: &Path,
    schema: &'s Schema,
    column: &'static str,
) -> Result<&'s arrow::datatypes::Field, ManifestError> {
    schema.field_with_name(column).map_err(|_| ManifestError::MissingColumn {
        path: path.to_path_buf(),
        column,
        present: schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", "),
    })
}

fn check_schema(path: &Path, schema: &Schema) -> Result<(), ManifestError> {
    for column in STRING_COLUMNS {
        require_string(path, schema, column)?;
    }
    require_float(path, schema, DURATION_COLUMN)
}

impl ManifestReader {
    /// Opens a manifest and checks its schema; reads no rows yet.
    pub fn open(path: &Path, batch_rows: usize) -> Result<ManifestReader, ManifestError> {
        let file = File::open(path)
            .map_err(|source| ManifestError::Io { path: path.to_path_buf(), source })?;
        let pq = |e: parquet::errors::ParquetError| ManifestError::Parquet {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(pq)?;
        check_schema(path, builder.schema())?;
        let rows = builder.metadata().file_metadata().num_rows().max(0) as u64;
        let batches = builder.with_batch_size(batch_rows.max(1)).build().map_err(pq)?;
        Ok(ManifestReader { path: path.to_path_buf(), batches, next_row: 0, rows })
    }

    /// The next chunk of rows, or `None` at the end.
    pub fn next_chunk(&mut self) -> Option<Result<Vec<ManifestRow>, ManifestError>> {
        let batch = match self.batches.next()? {
            Ok(b) => b,
            Err(e) => {
                return Some(Err(ManifestError::Parquet {
                    path: self.path.clone(),
                    message: e.to_string(),
                }))
            }
        };
        let rows = rows_of(&batch, self.next_row);
        self.next_row += batch.num_rows() as u64;
        Some(Ok(rows))
    }
}

/// Reads a string column's value at `i` whatever its string layout.
pub(crate) fn string_at(col: &dyn Array, i: usize) -> Option<String> {
    if col.is_null(i) {
        return None;
    }
    match col.data_type() {
        DataType::Utf8 => Some(col.as_string::<i32>().value(i).to_owned()),
        DataType::LargeUtf8 => Some(col.as_string::<i64>().value(i).to_owned()),
        DataType::Utf8View => Some(col.as_string_view().value(i).to_owned()),
        _ => None,
    }
}

/// Reads a float column's value at `i` (Float64 or Float32).
pub(crate) fn float_at(col: &dyn Array, i: usize) -> Option<f64> {
    if col.is_null(i) {
        return None;
    }
    match col.data_type() {
        DataType::Float64 => Some(col.as_primitive::<Float64Type>().value(i)),
        DataType::Float32 => Some(f64::from(col.as_primitive::<Float32Type>().value(i))),
        _ => None,
    }
}

fn rows_of(batch: &RecordBatch, first_row: u64) -> Vec<ManifestRow> {
    let col = |name: &str| batch.column_by_name(name);
    let strings: Vec<_> = STRING_COLUMNS.iter().map(|c| col(c)).collect();
    let duration = col(DURATION_COLUMN);
    (0..batch.num_rows())
        .map(|i| {
            let s = |k: usize| strings[k].and_then(|c| string_at(c.as_ref(), i));
            ManifestRow {
                row: first_row + i as u64,
                segment_id: s(0),
                shard_id: s(1),
                text: s(2),
                lang: s(3),
                tar_member_name: s(4),
                tar_path: s(5),
                source: s(6),
                duration: duration.and_then(|c| float_at(c.as_ref(), i)),
                ..Default::default()
            }
        })
        .collect()
}
