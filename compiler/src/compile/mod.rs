//! `asrc compile`: a manifest (or the raw shard tables) to one corpus file.
//!
//! The input is read in chunks of rows. Each chunk goes through three stages:
//!
//! 1. **Rows** (one thread, input order): null checks, row and segment-id deduplication, the
//!    duration and quality filters, text cleaning, language normalisation and retagging. Cheap,
//!    and deduplication needs the order.
//! 2. **Audio and tokens** (rayon, `--jobs` threads): read and decode the FLAC, downmix, resample
//!    to 16 kHz, convert to 16-bit, hash the PCM, tokenize. Results come back in input order.
//! 3. **Write** (one thread, input order): audio deduplication, duration check, append to the
//!    corpus writer, report entries.
//!
//! Memory is bounded by one chunk of decoded audio plus a few dozen bytes per row for the
//! deduplication tables; the corpus itself streams to disk. The output depends only on the input
//! and the options that change content (not on `--jobs` or the chunk size): same input, same
//! bytes.

pub mod report;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use asr_corpus::{CorpusWriter, UtteranceIn, WriteError, WriterOptions};
use rayon::prelude::*;
use serde::Serialize;

use crate::audio::decode::{decode_file, to_i16, Reject};
use crate::audio::resample::Resampler;
use crate::dedup::Deduper;
use crate::lang;
use crate::manifest::{ManifestError, ManifestReader, ManifestRow};
use crate::shards::ShardsReader;
use crate::text;
use crate::tokenize::{LangPrefix, TokenizeError, Tokenizer};
use report::{Entry, EntryWriter, Kind, Retag, StageSeconds, Summary};

/// What to compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A training-ready manifest (parquet).
    Manifest(PathBuf),
    /// A directory of raw shards (`metadata.parquet` + `audio_index.parquet` each).
    Shards(PathBuf),
}

impl Input {
    fn path(&self) -> &Path {
        match self {
            Input::Manifest(p) | Input::Shards(p) => p,
        }
    }
}

/// Everything `compile` needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The input.
    pub input: Input,
    /// The corpus to write.
    pub output: PathBuf,
    /// SentencePiece model.
    pub tokenizer: PathBuf,
    /// Base directory for relative audio paths (default: the manifest's directory).
    pub audio_root: Option<PathBuf>,
    /// When the `<|lang|>` prefix is tokenized.
    pub lang_prefix: LangPrefix,
    /// Token sequences are cut at this length.
    pub max_tokens: usize,
    /// Rows whose claimed duration is below this are dropped (`filtered_duration`).
    pub min_duration: Option<f64>,
    /// Rows whose claimed duration is above this are dropped (`filtered_duration`).
    pub max_duration: Option<f64>,
    /// Rows whose quality score is below this are dropped (`filtered_quality`; shards only).
    pub min_quality: Option<f64>,
    /// A claimed duration further than this from the decoded one is flagged.
    pub duration_tolerance: f64,
    /// Whether transcripts may change a row's language.
    pub retag: bool,
    /// Rows per chunk.
    pub chunk_rows: usize,
    /// Worker threads.
    pub jobs: usize,
    /// Where the JSON-lines report goes.
    pub entries_path: PathBuf,
    /// Source name given to every row of a shard input.
    pub shard_source: String,
}

impl Options {
    /// Defaults for everything but the paths.
    pub fn new(input: Input, output: PathBuf, tokenizer: PathBuf) -> Options {
        let entries_path = report_paths(&output).1;
        let shard_source = input
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "shards".into());
        Options {
            input,
            output,
            tokenizer,
            audio_root: None,
            lang_prefix: LangPrefix::Auto,
            max_tokens: 512,
            min_duration: None,
            max_duration: None,
            min_quality: None,
            duration_tolerance: 0.2,
            retag: true,
            chunk_rows: 256,
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            entries_path,
            shard_source,
        }
    }
}

/// The default report paths next to a corpus: `<corpus>.report.json` and
/// `<corpus>.report.jsonl`.
pub fn report_paths(output: &Path) -> (PathBuf, PathBuf) {
    let with = |suffix: &str| {
        let mut s = output.as_os_str().to_owned();
        s.push(suffix);
        PathBuf::from(s)
    };
    (with(".report.json"), with(".report.jsonl"))
}

/// Why a compile stopped (a bad row never stops it).
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The input cannot be read or has the wrong schema.
    #[error(transparent)]
    Input(#[from] ManifestError),
    /// The tokenizer cannot be loaded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizeError),
    /// The corpus cannot be written.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// A report file cannot be written.
    #[error("writing {path}: {source}")]
    Report {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// An option is invalid.
    #[error("{0}")]
    Options(String),
}

/// Progress after a chunk.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Rows done.
    pub rows_done: u64,
    /// Rows in the input.
    pub rows_total: u64,
    /// Hours of audio kept so far.
    pub hours_kept: f64,
}

enum Source {
    Manifest(ManifestReader),
    Shards(ShardsReader),
}

impl Source {
    fn next_chunk(&mut self) -> Option<Result<Vec<ManifestRow>, ManifestError>> {
        match self {
            Source::Manifest(r) => r.next_chunk(),
            Source::Shards(r) => r.next_chunk(),
        }
    }

    fn rows(&self) -> u64 {
        match self {
            Source::Manifest(r) => r.rows,
            Source::Shards(r) => r.rows,
        }
    }
}

/// A row that passed stage 1.
struct Ready {
    row: ManifestRow,
    segment_id: String,
    text: String,
    language: String,
    audio: PathBuf,
}

/// Stage 2's result for a row.
struct Audio {
    pcm: Vec<i16>,
    hash: u64,
    source_seconds: f64,
    tokens: Vec<u32>,
    truncated: bool,
}

/// A chunk after stage 2, waiting for stage 3.
struct Processed {
    ready: Vec<Ready>,
    results: Vec<(Result<Audio, Box<Entry>>, Timings)>,
    stage1_entries: Vec<Entry>,
    rows: u64,
}

/// Time one row spent in each stage-2 step.
#[derive(Default, Clone, Copy)]
struct Timings {
    decode: Duration,
    resample: Duration,
    tokenize: Duration,
    hash: Duration,
}

thread_local! {
    // One resampler per worker thread: it caches one FFT plan per input rate.
    static RESAMPLER: RefCell<Resampler> = RefCell::new(Resampler::new());
}

fn entry(row: &ManifestRow, kind: Kind, reason: &str, detail: String) -> Entry {
    Entry {
        row: row.row,
        segment_id: row.segment_id.clone(),
        shard_id: row.shard_id.clone(),
        kind,
        reason: reason.to_owned(),
        detail,
        file: None,
        retag: None,
    }
}

struct Compiler<'a> {
    opts: &'a Options,
    tokenizer: &'a Tokenizer,
    audio_base: PathBuf,
    dedup: Deduper,
    summary: Summary,
    entries: EntryWriter,
    /// This chunk's entries, written in row order when the chunk is done.
    chunk_entries: Vec<Entry>,
    /// Rows in the input (for progress).
    rows_total: u64,
    /// Where the time went (worker threads' seconds summed).
    stage: StageSeconds,
}

impl Compiler<'_> {
    fn record(&mut self, e: Entry) -> Result<(), CompileError> {
        self.summary.count(&e);
        self.chunk_entries.push(e);
        Ok(())
    }

    /// Writes the chunk's entries in row order (a row's own entries keep their order).
    fn flush_entries(&mut self) -> Result<(), CompileError> {
        self.chunk_entries.sort_by_key(|e| e.row);
        for e in self.chunk_entries.drain(..) {
            self.entries.write(&e).map_err(|source| CompileError::Report {
                path: self.opts.entries_path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Stage 1 for one row: `Ok(None)` when it was dropped (and recorded).
    fn prepare(&mut self, row: ManifestRow) -> Result<Option<Ready>, CompileError> {
        let drop = |row: &ManifestRow, reason: &str, detail: String| {
            Some(entry(row, Kind::Dropped, reason, detail))
        };
        let label = row.lang.as_deref().map(lang::normalize);
        if let (Some(d), Some(l)) = (row.duration, &label) {
            if d.is_finite() && d > 0.0 {
                *self.summary.hours_before.entry(l.code.clone()).or_default() += d / 3600.0;
            }
        }
        let Some(segment_id) = row.segment_id.clone().filter(|s| !s.is_empty()) else {
            let e = drop(&row, "null_segment_id", "segment_id is null or empty".into());
            return self.dropped(e);
        };
        let fields = row.fields();
        let field_refs: Vec<&str> = fields.iter().map(String::as_str).collect();
        if let Some(dup) = self.dedup.check_row(row.row, &segment_id, &field_refs) {
            let e = drop(&row, dup.reason(), dup.detail());
            return self.dropped(e);
        }
        if let Some(e) = self.filter(&row) {
            return self.dropped(Some(e));
        }
        let Some(raw_text) = row.text.as_deref() else {
            let e = drop(&row, "null_text", "text is null".into());
            return self.dropped(e);
        };
        let (tag, body) = text::strip_language_tag(raw_text);
        let cleaned = text::clean(body);
        if cleaned.is_empty() {
            let e = drop(&row, "empty_text", format!("nothing left after cleaning {raw_text:?}"));
            return self.dropped(e);
        }
        // The label: the lang column, else the text's tag.
        let label = label.or_else(|| tag.map(lang::normalize));
        let label_code = label.as_ref().map(|l| l.code.clone()).unwrap_or_default();
        let mut flags = Vec::new();
        if let Some(l) = &label {
            if !l.known {
                flags.push((
                    "unknown_language",
                    format!("label {:?} is not a known language", l.code),
                ));
            }
        }
        if let (Some(t), Some(l)) = (tag, &label) {
            let t = lang::normalize(t).code;
            if t != l.code {
                flags.push(("tag_mismatch", format!("text tag <|{t}|> but lang {:?}", l.code)));
            }
        }
        let decision = if self.opts.retag {
            lang::decide(&label_code, &cleaned)
        } else {
            lang::Decision {
                language: label_code.clone(),
                retagged: false,
                method: None,
                confidence: 1.0,
                script: None,
            }
        };
        if decision.language.is_empty() {
            let e = drop(
                &row,
                "no_language",
                "no language label and no script that decides one".into(),
            );
            return self.dropped(e);
        }
        let Some(audio) = row.audio_path(&self.audio_base) else {
            let e = if row.audio_dir.is_some() {
                drop(
                    &row,
                    "no_audio_index",
                    "the shard's audio_index.parquet has no row for this segment".into(),
                )
            } else {
                drop(&row, "missing_file", "tar_member_name is null or empty".into())
            };
            return self.dropped(e);
        };
        for (reason, detail) in flags {
            self.record(entry(&row, Kind::Flagged, reason, detail))?;
        }
        if decision.retagged {
            let method = decision.method.map_or("", lang::Method::name).to_owned();
            let mut e = entry(
                &row,
                Kind::Retagged,
                "retagged",
                format!(
                    "{:?} -> {:?} by {method} (confidence {:.3})",
                    label_code, decision.language, decision.confidence
                ),
            );
            e.retag = Some(Retag {
                from: label_code,
                to: decision.language.clone(),
                method,
                confidence: decision.confidence,
            });
            self.record(e)?;
        }
        Ok(Some(Ready { segment_id, text: cleaned, language: decision.language, audio, row }))
    }

    fn dropped(&mut self, e: Option<Entry>) -> Result<Option<Ready>, CompileError> {
        if let Some(e) = e {
            self.record(e)?;
        }
        Ok(None)
    }

    fn filter(&self, row: &ManifestRow) -> Option<Entry> {
        let o = self.opts;
        if o.min_duration.is_some() || o.max_duration.is_some() {
            let Some(d) = row.duration else {
                return Some(entry(
                    row,
                    Kind::Dropped,
                    "filtered_duration",
                    "duration is null".into(),
                ));
            };
            let (lo, hi) = (
                o.min_duration.unwrap_or(f64::NEG_INFINITY),
                o.max_duration.unwrap_or(f64::INFINITY),
            );
            // NaN fails both comparisons and is filtered too.
            if !(d >= lo && d <= hi) {
                return Some(entry(
                    row,
                    Kind::Dropped,
                    "filtered_duration",
                    format!("duration {d} s outside [{lo}, {hi}]"),
                ));
            }
        }
        if let Some(min) = o.min_quality {
            match row.quality {
                Some(q) if q >= min => {}
                q => {
                    return Some(entry(
                        row,
                        Kind::Dropped,
                        "filtered_quality",
                        format!("quality score {q:?} below {min}"),
                    ))
                }
            }
        }
        None
    }

    /// Stage 3 for a chunk: every row in order, then the chunk's entries.
    fn write_chunk(
        &mut self,
        writer: &mut CorpusWriter,
        chunk: Processed,
    ) -> Result<Progress, CompileError> {
        self.chunk_entries.extend(chunk.stage1_entries);
        let s = |d: Duration| d.as_secs_f64();
        for (r, (audio, t)) in chunk.ready.iter().zip(chunk.results) {
            self.stage.decode += s(t.decode);
            self.stage.resample += s(t.resample);
            self.stage.tokenize += s(t.tokenize);
            self.stage.hash += s(t.hash);
            self.write(writer, r, audio)?;
        }
        self.flush_entries()?;
        self.summary.rows += chunk.rows;
        Ok(Progress {
            rows_done: self.summary.rows,
            rows_total: self.rows_total,
            hours_kept: self.summary.hours_after.values().sum(),
        })
    }

    /// Stage 3 for one row.
    fn write(
        &mut self,
        writer: &mut CorpusWriter,
        ready: &Ready,
        audio: Result<Audio, Box<Entry>>,
    ) -> Result<(), CompileError> {
        let audio = match audio {
            Ok(a) => a,
            Err(e) => return self.record(*e),
        };
        self.summary.decoded_hours += audio.source_seconds / 3600.0;
        if let Some(dup) = self.dedup.check_audio(&ready.segment_id, audio.hash, audio.pcm.len()) {
            return self.record(entry(&ready.row, Kind::Dropped, dup.reason(), dup.detail()));
        }
        let source = ready.row.source.as_deref().unwrap_or("");
        let t = Instant::now();
        let pushed = writer.push(&UtteranceIn {
            segment_id: &ready.segment_id,
            text: &ready.text,
            language: &ready.language,
            source,
            pcm: &audio.pcm,
            tokens: &audio.tokens,
        });
        self.stage.write += t.elapsed().as_secs_f64();
        match pushed {
            Ok(()) => {}
            Err(WriteError::InvalidUtterance { message, .. }) => {
                let mut e = entry(&ready.row, Kind::Dropped, "unstorable", message);
                e.file = Some(ready.audio.clone());
                return self.record(e);
            }
            Err(e) => return Err(e.into()),
        }
        self.summary.kept += 1;
        let seconds = audio.pcm.len() as f64 / f64::from(asr_corpus::layout::SAMPLE_RATE);
        *self.summary.hours_after.entry(ready.language.clone()).or_default() += seconds / 3600.0;
        if audio.truncated {
            self.summary.truncated += 1;
            self.record(entry(
                &ready.row,
                Kind::Flagged,
                "truncated_tokens",
                format!("token sequence cut at {}", self.opts.max_tokens),
            ))?;
        }
        if let Some(claimed) = ready.row.duration {
            if (claimed - audio.source_seconds).abs() > self.opts.duration_tolerance {
                let mut e = entry(
                    &ready.row,
                    Kind::Flagged,
                    "duration_mismatch",
                    format!(
                        "manifest says {claimed:.3} s, the audio decodes to {:.3} s (stored)",
                        audio.source_seconds
                    ),
                );
                e.file = Some(ready.audio.clone());
                self.record(e)?;
            }
        }
        Ok(())
    }
}

/// Stage 2 for one row: decode, resample, hash, tokenize.
fn process(
    ready: &Ready,
    tokenizer: &Tokenizer,
    prefix: LangPrefix,
    max_tokens: usize,
    timings: &mut Timings,
) -> Result<Audio, Box<Entry>> {
    let reject = |reason: &str, detail: String| {
        let mut e = entry(&ready.row, Kind::Dropped, reason, detail);
        e.file = Some(ready.audio.clone());
        Box::new(e)
    };
    let t = Instant::now();
    let decoded =
        decode_file(&ready.audio).map_err(|r: Reject| reject(r.reason(), r.detail().to_owned()))?;
    timings.decode += t.elapsed();
    let t = Instant::now();
    let source_seconds = decoded.samples.len() as f64 / f64::from(decoded.rate.max(1));
    let resampled = RESAMPLER
        .with(|r| r.borrow_mut().to_target(&decoded.samples, decoded.rate))
        .map_err(|e| reject("unsupported_audio", e.to_string()))?;
    drop(decoded);
    let pcm = to_i16(&resampled);
    drop(resampled);
    timings.resample += t.elapsed();
    if pcm.is_empty() {
        return Err(reject("no_samples", "no samples left after resampling to 16 kHz".into()));
    }
    let t = Instant::now();
    let hash = asr_corpus::audio_hash(&pcm);
    timings.hash += t.elapsed();
    let t = Instant::now();
    let encoded = tokenizer
        .encode(&ready.language, &ready.text, prefix, max_tokens)
        .map_err(|e| reject("tokenize_error", e.to_string()))?;
    timings.tokenize += t.elapsed();
    Ok(Audio { pcm, hash, source_seconds, tokens: encoded.ids, truncated: encoded.truncated })
}

/// Compiles `opts.input` into `opts.output`; `progress` is called after every chunk. Returns
/// the report's summary (the caller writes it); the JSON-lines file is written here.
pub fn compile(
    opts: &Options,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Summary, CompileError> {
    let started = Instant::now();
    if opts.jobs == 0 {
        return Err(CompileError::Options("--jobs must be at least 1".into()));
    }
    if opts.max_tokens == 0 {
        return Err(CompileError::Options("--max-tokens must be at least 1".into()));
    }
    if matches!(opts.input, Input::Manifest(_)) && opts.min_quality.is_some() {
        return Err(CompileError::Options(
            "--min-quality needs --shards input: a training-ready manifest has no quality column"
                .into(),
        ));
    }
    let tokenizer = Tokenizer::open(&opts.tokenizer)?;
    let t = Instant::now();
    let (mut source, default_base) = match &opts.input {
        Input::Manifest(p) => (
            Source::Manifest(ManifestReader::open(p, opts.chunk_rows)?),
            p.parent().map(Path::to_path_buf).unwrap_or_default(),
        ),
        Input::Shards(p) => {
            (Source::Shards(ShardsReader::open(p, opts.chunk_rows, &opts.shard_source)?), p.clone())
        }
    };
    let opened = t.elapsed().as_secs_f64();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.jobs)
        .thread_name(|i| format!("asrc-worker-{i}"))
        .build()
        .map_err(|e| CompileError::Options(format!("cannot start {} threads: {e}", opts.jobs)))?;

    let mut wopts = WriterOptions::new(
        tokenizer.vocab_size(),
        "sentencepiece",
        tokenizer.model_bytes().to_vec(),
    );
    wopts.compile = compile_params(opts);
    let mut writer = CorpusWriter::create(&opts.output, wopts)?;
    let entries = EntryWriter::create(&opts.entries_path)
        .map_err(|source| CompileError::Report { path: opts.entries_path.clone(), source })?;
    let mut c = Compiler {
        opts,
        tokenizer: &tokenizer,
        audio_base: opts.audio_root.clone().unwrap_or(default_base),
        dedup: Deduper::new(),
        summary: Summary {
            input: opts.input.path().display().to_string(),
            output: opts.output.display().to_string(),
            jobs: opts.jobs,
            entries_file: opts.entries_path.display().to_string(),
            ..Default::default()
        },
        entries,
        chunk_entries: Vec::new(),
        rows_total: source.rows(),
        stage: StageSeconds { read_input: opened, ..StageSeconds::default() },
    };
    let mut previous: Option<Processed> = None;
    let mut pending: Vec<ManifestRow> = Vec::new();
    let mut exhausted = false;
    while !exhausted {
        // Gather a full chunk (shard inputs may return short ones).
        let t = Instant::now();
        while pending.len() < opts.chunk_rows {
            match source.next_chunk() {
                None => {
                    exhausted = true;
                    break;
                }
                Some(rows) => pending.extend(rows?),
            }
        }
        c.stage.read_input += t.elapsed().as_secs_f64();
        if pending.is_empty() {
            break;
        }
        let chunk = std::mem::take(&mut pending);
        let n = chunk.len() as u64;
        let t = Instant::now();
        let mut ready = Vec::with_capacity(chunk.len());
        for row in chunk {
            if let Some(r) = c.prepare(row)? {
                ready.push(r);
            }
        }
        let stage1_entries = std::mem::take(&mut c.chunk_entries);
        c.stage.text_and_language += t.elapsed().as_secs_f64();
        // Stage 2 of this chunk runs on the pool while this thread writes the previous chunk.
        let tok = c.tokenizer;
        let (prefix, max_tokens) = (opts.lang_prefix, opts.max_tokens);
        let pool = &pool;
        let (done, wrote) = std::thread::scope(|scope| {
            let worker = scope.spawn(move || {
                let results: Vec<(Result<Audio, Box<Entry>>, Timings)> = pool.install(|| {
                    ready
                        .par_iter()
                        .map(|r| {
                            let mut t = Timings::default();
                            let a = process(r, tok, prefix, max_tokens, &mut t);
                            (a, t)
                        })
                        .collect()
                });
                (ready, results)
            });
            let wrote = previous.take().map(|chunk| c.write_chunk(&mut writer, chunk)).transpose();
            (worker.join(), wrote)
        });
        if let Some(p) = wrote? {
            progress(&p);
        }
        let (ready, results) = done.map_err(|_| {
            CompileError::Options("a worker thread panicked while decoding audio".into())
        })?;
        previous = Some(Processed { ready, results, stage1_entries, rows: n });
    }
    if let Some(chunk) = previous.take() {
        progress(&c.write_chunk(&mut writer, chunk)?);
    }
    let t = Instant::now();
    let written = writer.finish()?;
    c.stage.write += t.elapsed().as_secs_f64();
    let entries_path = opts.entries_path.clone();
    let Compiler { mut summary, entries, stage, .. } = c;
    entries.finish().map_err(|source| CompileError::Report { path: entries_path, source })?;
    summary.stage_seconds = stage;
    summary.corpus_bytes = written.bytes;
    summary.wall_seconds = started.elapsed().as_secs_f64();
    let audio_seconds = summary.decoded_hours * 3600.0;
    summary.realtime_factor = audio_seconds / summary.wall_seconds.max(1e-9);
    summary.realtime_factor_per_job = summary.realtime_factor / opts.jobs as f64;
    Ok(summary)
}

/// The parameters stored in the corpus's metadata: only what changes its content, so that the
/// same input gives the same bytes whatever the thread count.
fn compile_params(opts: &Options) -> serde_json::Value {
    #[derive(Serialize)]
    struct Params<'a> {
        tool: &'a str,
        version: &'a str,
        input_kind: &'a str,
        input: String,
        tokenizer: String,
        lang_prefix: LangPrefix,
        max_tokens: usize,
        min_duration: Option<f64>,
        max_duration: Option<f64>,
        min_quality: Option<f64>,
        retag: bool,
        resampler: &'a str,
    }
    let name =
        |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let p = Params {
        tool: "asrc",
        version: env!("CARGO_PKG_VERSION"),
        input_kind: match opts.input {
            Input::Manifest(_) => "manifest",
            Input::Shards(_) => "shards",
        },
        input: name(opts.input.path()),
        tokenizer: name(&opts.tokenizer),
        lang_prefix: opts.lang_prefix,
        max_tokens: opts.max_tokens,
        min_duration: opts.min_duration,
        max_duration: opts.max_duration,
        min_quality: opts.min_quality,
        retag: opts.retag,
        resampler: "rubato FFT (band-limited), to 16 kHz",
    };
    serde_json::to_value(p).unwrap_or_else(|_| serde_json::Value::Object(Default::default()))
}
