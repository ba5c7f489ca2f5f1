//! The driver: reads the input in chunks, runs stage 1 on this thread, stage 2 on the worker
//! pool while this thread runs stage 3 (write) on the previous chunk, and keeps the report.
//!
//! Stage 3 (one thread, input order): audio deduplication, the duration check, appending to the
//! corpus writer, and the chunk's report entries in row order.

use std::path::Path;
use std::time::{Duration, Instant};

use asr_corpus::{CorpusWriter, UtteranceIn, WriteError, WriterOptions};

use crate::dedup::Deduper;
use crate::tokenize::Tokenizer;

use super::audio::{Audio, AudioStage, Outcome};
use super::report::{Entry, EntryWriter, Reason, StageSeconds, Summary};
use super::rows::{claimed_hours, Ready, Rows};
use super::source::Source;
use super::{CompileError, CompileOptions};
use crate::inputs::TarCache;

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

/// A chunk after stage 2, waiting for stage 3.
struct Processed {
    ready: Vec<Ready>,
    results: Vec<Outcome>,
    stage1_entries: Vec<Entry>,
    rows: u64,
}

/// Stage 3's state, and the report.
struct Writer<'a> {
    opts: &'a CompileOptions,
    corpus: CorpusWriter,
    /// Decoded audio of the rows kept so far (the row and id tables stay empty).
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

impl Writer<'_> {
    fn record(&mut self, e: Entry) {
        self.summary.count(&e);
        self.chunk_entries.push(e);
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

    /// Stage 3 for a chunk: every row in order, then the chunk's entries.
    fn write_chunk(&mut self, chunk: Processed) -> Result<Progress, CompileError> {
        self.chunk_entries.extend(chunk.stage1_entries);
        let s = |d: Duration| d.as_secs_f64();
        for (r, (audio, t)) in chunk.ready.iter().zip(chunk.results) {
            self.stage.decode += s(t.decode);
            self.stage.resample += s(t.resample);
            self.stage.tokenize += s(t.tokenize);
            self.stage.hash += s(t.hash);
            self.write(r, audio)?;
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
        ready: &Ready,
        audio: Result<Audio, Box<Entry>>,
    ) -> Result<(), CompileError> {
        let audio = match audio {
            Ok(a) => a,
            Err(e) => {
                self.record(*e);
                return Ok(());
            }
        };
        self.summary.decoded_hours += audio.source_seconds / 3600.0;
        if let Some(dup) = self.dedup.check_audio(&ready.segment_id, audio.hash, audio.pcm.len()) {
            self.record(Entry::new(&ready.row, dup.reason(), dup.detail()));
            return Ok(());
        }
        // A null source is stored as the empty source name.
        let source = ready.row.source.as_deref().unwrap_or("");
        let t = Instant::now();
        let pushed = self.corpus.push(&UtteranceIn {
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
                self.record(
                    Entry::new(&ready.row, Reason::Unstorable, message).with_audio(&ready.audio),
                );
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        self.summary.kept += 1;
        let seconds = audio.pcm.len() as f64 / f64::from(asr_corpus::layout::SAMPLE_RATE);
        *self.summary.hours_after.entry(ready.language.clone()).or_default() += seconds / 3600.0;
        if audio.truncated {
            self.summary.truncated += 1;
            self.record(Entry::new(
                &ready.row,
                Reason::TruncatedTokens,
                format!("token sequence cut at {}", self.opts.max_tokens),
            ));
        }
        if let Some(claimed) = ready.row.duration {
            if (claimed - audio.source_seconds).abs() > self.opts.duration_tolerance {
                let e = Entry::new(
                    &ready.row,
                    Reason::DurationMismatch,
                    format!(
                        "manifest says {claimed:.3} s, the audio decodes to {:.3} s (stored)",
                        audio.source_seconds
                    ),
                )
                .with_audio(&ready.audio);
                self.record(e);
            }
        }
        Ok(())
    }
}

/// Creates the missing directories above an output file.
fn create_parent(file: &Path) -> Result<(), CompileError> {
    crate::output::create_parent(file)
        .map_err(|(path, source)| CompileError::OutputDir { path, source })
}

/// Compiles `opts.input` into `opts.output` (creating missing directories above it and above
/// the report); `progress` is called after every chunk. Returns
/// the report's summary (the caller writes it); the JSON-lines file is written here.
pub fn compile(
    opts: &CompileOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Summary, CompileError> {
    let started = Instant::now();
    opts.check()?;
    let tokenizer = Tokenizer::open(&opts.tokenizer)?;
    let t = Instant::now();
    // Tar indexes, shared by the input readers and stage 2's threads.
    let tars = TarCache::default();
    let mut source = Source::open(opts, &tars)?;
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
    wopts.compile = opts.corpus_params();
    create_parent(&opts.output)?;
    create_parent(&opts.entries_path)?;
    let corpus = CorpusWriter::create(&opts.output, wopts)?;
    let entries = EntryWriter::create(&opts.entries_path)
        .map_err(|source| CompileError::Report { path: opts.entries_path.clone(), source })?;
    let audio_base = opts.audio_root.as_deref().unwrap_or(source.default_audio_base());
    let mut rows = Rows::new(opts, audio_base.to_path_buf());
    let stage2 = AudioStage {
        tokenizer: &tokenizer,
        prefix: opts.lang_prefix,
        max_tokens: opts.max_tokens,
        decoder: opts.decoder,
        verify_md5: opts.verify_md5,
        tars: &tars,
    };
    let mut w = Writer {
        opts,
        corpus,
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
    // With --part, the rows of this part; earlier rows only feed deduplication.
    let part_range = opts.part.map(|(i, n)| {
        let total = source.rows();
        let at = |k: u32| total * u64::from(k) / u64::from(n);
        at(i)..at(i + 1)
    });
    let mut previous: Option<Processed> = None;
    loop {
        let t = Instant::now();
        let chunk = source.next_chunk(opts.chunk_rows)?;
        w.stage.read_input += t.elapsed().as_secs_f64();
        if chunk.is_empty() {
            break;
        }
        let mut n = 0u64;
        // Whether the input has reached the rows after this part's: nothing later is read.
        let mut past_part = false;
        let t = Instant::now();
        let mut ready = Vec::with_capacity(chunk.len());
        let mut stage1_entries = Vec::new();
        for row in chunk {
            match part_range.as_ref().map(|r| (row.row < r.start, row.row >= r.end)) {
                Some((true, _)) => {
                    rows.remember(&row);
                    continue;
                }
                Some((_, true)) => {
                    past_part = true;
                    break;
                }
                _ => n += 1,
            }
            if let Some((label, hours)) = claimed_hours(&row) {
                *w.summary.hours_before.entry(label).or_default() += hours;
            }
            match rows.prepare(row) {
                Ok(kept) => {
                    stage1_entries.extend(kept.notes);
                    ready.push(kept.ready);
                }
                Err(e) => stage1_entries.push(*e),
            }
        }
        for e in &stage1_entries {
            w.summary.count(e);
        }
        w.stage.text_and_language += t.elapsed().as_secs_f64();
        // Stage 2 of this chunk runs on the pool while this thread writes the previous chunk.
        let pool = &pool;
        let (done, wrote) = std::thread::scope(|scope| {
            let worker = scope.spawn(move || {
                let results = stage2.chunk(pool, &ready);
                (ready, results)
            });
            let wrote = previous.take().map(|chunk| w.write_chunk(chunk)).transpose();
            (worker.join(), wrote)
        });
        if let Some(p) = wrote? {
            progress(&p);
        }
        let (ready, results) = done.map_err(|_| {
            CompileError::Options("a worker thread panicked while decoding audio".into())
        })?;
        previous = Some(Processed { ready, results, stage1_entries, rows: n });
        if past_part {
            break;
        }
    }
    if let Some(chunk) = previous.take() {
        progress(&w.write_chunk(chunk)?);
    }
    let t = Instant::now();
    let Writer { corpus, mut summary, entries, mut stage, .. } = w;
    let written = corpus.finish()?;
    stage.write += t.elapsed().as_secs_f64();
    entries
        .finish()
        .map_err(|source| CompileError::Report { path: opts.entries_path.clone(), source })?;
    summary.stage_seconds = stage;
    summary.corpus_bytes = written.bytes;
    summary.wall_seconds = started.elapsed().as_secs_f64();
    let audio_seconds = summary.decoded_hours * 3600.0;
    summary.realtime_factor = audio_seconds / summary.wall_seconds.max(1e-9);
    summary.realtime_factor_per_job = summary.realtime_factor / opts.jobs as f64;
    Ok(summary)
}
