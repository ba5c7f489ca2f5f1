//! Hugging Face datasets parquet (what `Dataset.to_parquet` and the Hub's parquet export write):
//! the audio inside the file, as an `Audio` feature (a struct of `bytes` and `path`) or plain
//! binary, read in record batches so memory stays one batch of audio.
//!
//! Columns, when not named by `--id-column`, `--text-column`, `--lang-column`,
//! `--duration-column`, `--audio-column`: the first present of
//! - id: `id`, `segment_id`, `utt_id`, `path` (Common Voice), `audio_id`; none: `FILE:ROW`;
//! - text: `text`, `sentence` (Common Voice), `transcription` (FLEURS), `normalized_text`,
//!   `raw_transcription`, `transcript`;
//! - language: `lang`, `language` (FLEURS: an English name), `locale` (Common Voice); optional;
//! - duration: `duration` (seconds); optional;
//! - audio: `audio`.
//!
//! An `Audio` struct whose `bytes` is null but whose `path` is set reads that file (relative to
//! the parquet file's directory or `--audio-root`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int32Type, Int64Type, Schema};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use super::{malformed, resolve, stem, AudioRef, InputError};
use crate::manifest::{float_at, string_at, ManifestRow};
use crate::reason::Reason;

/// Default column names, in the order they are looked for.
const ID_COLUMNS: [&str; 5] = ["id", "segment_id", "utt_id", "path", "audio_id"];
const TEXT_COLUMNS: [&str; 6] =
    ["text", "sentence", "transcription", "normalized_text", "raw_transcription", "transcript"];
const LANG_COLUMNS: [&str; 3] = ["lang", "language", "locale"];

/// The column choices (`None`: the defaults above).
#[derive(Debug, Clone, Default)]
pub struct HfColumns {
    /// The id column.
    pub id: Option<String>,
    /// The transcript column.
    pub text: Option<String>,
    /// The language column.
    pub lang: Option<String>,
    /// The duration column (seconds).
    pub duration: Option<String>,
    /// The audio column (default `audio`).
    pub audio: Option<String>,
}

/// How Hugging Face parquet files are read.
#[derive(Debug, Clone, Default)]
pub struct HfOptions {
    /// Column choices.
    pub columns: HfColumns,
    /// Base directory of audio given by path instead of the parquet file's directory.
    pub audio_root: Option<PathBuf>,
    /// Source name of every row (default: the first file's stem).
    pub source: Option<String>,
}

/// The columns found in one file.
struct Columns {
    id: Option<String>,
    text: String,
    lang: Option<String>,
    duration: Option<String>,
    audio: String,
}

/// Whether `schema` looks like a Hugging Face audio dataset (an `audio` column of bytes), for
/// `--format` detection.
pub fn looks_like_hf(schema: &Schema) -> bool {
    schema.field_with_name("audio").is_ok_and(|f| audio_type_ok(f.data_type()))
}

fn audio_type_ok(t: &DataType) -> bool {
    match t {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => true,
        DataType::Struct(fields) => fields.iter().any(|f| f.name() == "bytes"),
        _ => false,
    }
}

fn pick(schema: &Schema, chosen: Option<&String>, defaults: &[&str]) -> Option<String> {
    match chosen {
        Some(c) => Some(c.clone()),
        None => defaults.iter().find(|d| schema.field_with_name(d).is_ok()).map(|d| d.to_string()),
    }
}

impl Columns {
    fn resolve(path: &Path, schema: &Schema, c: &HfColumns) -> Result<Columns, InputError> {
        let present =
            || schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ");
        let invalid = |message: String| InputError::Invalid { path: path.to_path_buf(), message };
        let audio = c.audio.clone().unwrap_or_else(|| "audio".into());
        let Ok(field) = schema.field_with_name(&audio) else {
            return Err(invalid(format!(
                "no audio column `{audio}` (--audio-column); columns: {}",
                present()
            )));
        };
        if !audio_type_ok(field.data_type()) {
            return Err(invalid(format!(
                "column `{audio}` has type {}, expected binary or a struct with `bytes` (a \
                 datasets Audio feature)",
                field.data_type()
            )));
        }
        let text = pick(schema, c.text.as_ref(), &TEXT_COLUMNS).ok_or_else(|| {
            invalid(format!(
                "no transcript column (looked for {}; name it with --text-column); columns: {}",
                TEXT_COLUMNS.join(", "),
                present()
            ))
        })?;
        let cols = Columns {
            id: pick(schema, c.id.as_ref(), &ID_COLUMNS),
            text,
            lang: pick(schema, c.lang.as_ref(), &LANG_COLUMNS),
            duration: pick(schema, c.duration.as_ref(), &["duration"]),
            audio,
        };
        for named in
            [&cols.id, &Some(cols.text.clone()), &cols.lang, &cols.duration].into_iter().flatten()
        {
            if schema.field_with_name(named).is_err() {
                return Err(invalid(format!("no column `{named}`; columns: {}", present())));
            }
        }
        Ok(cols)
    }
}

/// A value as text: strings as they are, integers written out.
fn text_at(col: &dyn Array, i: usize) -> Option<String> {
    if col.is_null(i) {
        return None;
    }
    match col.data_type() {
        DataType::Int64 => Some(col.as_primitive::<Int64Type>().value(i).to_string()),
        DataType::Int32 => Some(col.as_primitive::<Int32Type>().value(i).to_string()),
        _ => string_at(col, i),
    }
}

/// Bytes of a binary column at `i`.
fn bytes_at(col: &dyn Array, i: usize) -> Option<&[u8]> {
    if col.is_null(i) {
        return None;
    }
    match col.data_type() {
        DataType::Binary => Some(col.as_binary::<i32>().value(i)),
        DataType::LargeBinary => Some(col.as_binary::<i64>().value(i)),
        DataType::BinaryView => Some(col.as_binary_view().value(i)),
        _ => None,
    }
}

/// Streams the rows of one or more parquet files.
pub struct HfReader {
    files: Vec<PathBuf>,
    next_file: usize,
    current: Option<(PathBuf, ParquetRecordBatchReader, Columns)>,
    opts: HfOptions,
    source: String,
    batch_rows: usize,
    next_row: u64,
    /// Row of the current file the next batch starts at (for ids and origins).
    file_row: u64,
    /// Rows in all files, from their metadata.
    pub rows: u64,
}

fn open(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>, InputError> {
    let file = File::open(path).map_err(InputError::io(path))?;
    ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| InputError::Invalid { path: path.to_path_buf(), message: e.to_string() })
}

/// The schema of the parquet file at `path`.
pub fn schema_of(path: &Path) -> Result<Arc<Schema>, InputError> {
    Ok(open(path)?.schema().clone())
}

impl HfReader {
    /// Opens every file (checking its columns); reads no rows yet.
    pub fn open(
        files: &[PathBuf],
        opts: &HfOptions,
        batch_rows: usize,
    ) -> Result<HfReader, InputError> {
        let mut rows = 0;
        for f in files {
            let b = open(f)?;
            Columns::resolve(f, b.schema(), &opts.columns)?;
            rows += b.metadata().file_metadata().num_rows().max(0) as u64;
        }
        let source = opts
            .source
            .clone()
            .unwrap_or_else(|| files.first().map(|f| stem(f)).unwrap_or_default());
        Ok(HfReader {
            files: files.to_vec(),
            next_file: 0,
            current: None,
            opts: opts.clone(),
            source,
            batch_rows: batch_rows.max(1),
            next_row: 0,
            file_row: 0,
            rows,
        })
    }

    /// The next batch of rows, or `None` at the end.
    pub fn next_chunk(&mut self) -> Option<Result<Vec<ManifestRow>, InputError>> {
        loop {
            if self.current.is_none() {
                let path = self.files.get(self.next_file)?.clone();
                self.next_file += 1;
                let opened = open(&path).and_then(|b| {
                    let cols = Columns::resolve(&path, b.schema(), &self.opts.columns)?;
                    let r = b.with_batch_size(self.batch_rows).build().map_err(|e| {
                        InputError::Invalid { path: path.clone(), message: e.to_string() }
                    })?;
                    Ok((r, cols))
                });
                match opened {
                    Ok((r, cols)) => {
                        self.current = Some((path, r, cols));
                        self.file_row = 0;
                    }
                    Err(e) => return Some(Err(e)),
                }
            }
            let (path, reader, cols) = self.current.as_mut()?;
            match reader.next() {
                None => self.current = None,
                Some(Err(e)) => {
                    return Some(Err(InputError::Invalid {
                        path: path.clone(),
                        message: e.to_string(),
                    }))
                }
                Some(Ok(batch)) => {
                    let base = match &self.opts.audio_root {
                        Some(r) => r.clone(),
                        None => path.parent().map(Path::to_path_buf).unwrap_or_default(),
                    };
                    let first = (self.next_row, self.file_row);
                    let rows = rows_of(&batch, path, cols, &base, &self.source, first);
                    self.next_row += batch.num_rows() as u64;
                    self.file_row += batch.num_rows() as u64;
                    return Some(Ok(rows));
                }
            }
        }
    }
}

fn rows_of(
    batch: &RecordBatch,
    path: &Path,
    cols: &Columns,
    base: &Path,
    source: &str,
    (first_row, first_in_file): (u64, u64),
) -> Vec<ManifestRow> {
    let col = |name: &Option<String>| name.as_ref().and_then(|n| batch.column_by_name(n));
    let (ids, langs, durations) = (col(&cols.id), col(&cols.lang), col(&cols.duration));
    let texts = batch.column_by_name(&cols.text);
    let audio = batch.column_by_name(&cols.audio);
    (0..batch.num_rows())
        .map(|i| {
            let row = first_row + i as u64;
            // The row within its file: ids without an id column and origins are per file.
            let local = first_in_file + i as u64;
            let origin = format!("{}:row {local}", path.display());
            let Some(audio) = audio.map(|a| audio_at(a.as_ref(), i, base)) else {
                return malformed(row, origin, Reason::MalformedLine, "no audio column".into());
            };
            let audio = match audio {
                Ok(a) => a,
                Err(detail) => return malformed(row, origin, Reason::MissingFile, detail),
            };
            let duration = durations.and_then(|c| match c.data_type() {
                DataType::Int64 | DataType::Int32 => {
                    text_at(c.as_ref(), i).and_then(|t| t.parse().ok())
                }
                _ => float_at(c.as_ref(), i),
            });
            ManifestRow {
                row,
                segment_id: Some(
                    ids.and_then(|c| text_at(c.as_ref(), i))
                        .unwrap_or_else(|| format!("{}:{local}", stem(path))),
                ),
                text: texts.and_then(|c| string_at(c.as_ref(), i)),
                lang: langs.and_then(|c| string_at(c.as_ref(), i)),
                source: Some(source.to_owned()),
                duration,
                audio: Some(audio),
                origin: Some(origin),
                ..Default::default()
            }
        })
        .collect()
}

/// Row `i`'s audio: the struct's bytes, else its path; or plain binary.
fn audio_at(col: &dyn Array, i: usize, base: &Path) -> Result<AudioRef, String> {
    if let Some(s) = col.as_struct_opt() {
        if s.is_null(i) {
            return Err("the audio value is null".into());
        }
        if let Some(b) = s.column_by_name("bytes").and_then(|b| bytes_at(b.as_ref(), i)) {
            return Ok(AudioRef::Bytes(Arc::from(b)));
        }
        return match s.column_by_name("path").and_then(|p| string_at(p.as_ref(), i)) {
            Some(p) if !p.is_empty() => Ok(AudioRef::File(resolve(base, &p))),
            _ => Err("the audio struct has neither bytes nor a path".into()),
        };
    }
    bytes_at(col, i)
        .map(|b| AudioRef::Bytes(Arc::from(b)))
        .ok_or_else(|| "the audio value is null".into())
}
