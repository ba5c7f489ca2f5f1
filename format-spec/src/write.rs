//! [`CorpusWriter`]: streaming, deterministic, atomic corpus writer.
//!
//! - Streaming: PCM goes straight into the output file as utterances arrive; the per-utterance
//!   arrays, tokens and compressed text go to anonymous spool files in the target directory and
//!   are appended at `finish`. Memory use is one text block plus I/O buffers, whatever the corpus
//!   size.
//! - Deterministic: the bytes depend only on the options and the utterances pushed, in order
//!   (no timestamps, tables in first-use order, JSON members in a fixed order).
//! - Atomic: the file is built under a temporary name in the target directory, synced, and
//!   renamed over the destination; a crash leaves either the old file or none, never a partial
//!   corpus under the final name. The temporary file is removed if the writer is dropped.
//!
//! The writer does not check that segment ids are unique (that needs memory linear in the
//! corpus); callers deduplicate, and `Corpus::verify` rejects a corpus that repeats one.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufWriter, Cursor, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use crate::layout::{self, Header, SectionEntry, SectionKind, TextIndexEntry};
use crate::meta::{hash_hex, hours, LanguageStats, Metadata, Stats, TokenizerInfo};
use crate::text;

/// Why a corpus could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// Reading or writing a file failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// An utterance cannot be stored; nothing of it was written.
    #[error("utterance {index} (segment {segment_id:?}): {message}")]
    InvalidUtterance {
        /// Position the utterance would have had.
        index: u64,
        /// Its segment id.
        segment_id: String,
        /// What is wrong.
        message: String,
    },
    /// The writer's options are invalid.
    #[error("invalid writer options: {0}")]
    InvalidOptions(String),
    /// The corpus outgrew a format limit.
    #[error("{what} would exceed the format's limit of {max}")]
    LimitExceeded {
        /// What grew too large.
        what: &'static str,
        /// The limit.
        max: u64,
    },
}

/// Options fixed for the whole corpus.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Every token id must be below this.
    pub vocab_size: u32,
    /// `"sentencepiece"`, or `"none"` with an empty model.
    pub tokenizer_kind: String,
    /// The tokenizer model file, embedded byte for byte.
    pub tokenizer_model: Vec<u8>,
    /// Utterances per text block (K).
    pub text_block_size: u32,
    /// zstd level for text blocks.
    pub zstd_level: i32,
    /// Parameters of the producing run, stored as `metadata.compile` (must be a JSON object).
    pub compile: serde_json::Value,
}

impl WriterOptions {
    /// Options with the default block size (256) and zstd level (9).
    pub fn new(vocab_size: u32, tokenizer_kind: &str, tokenizer_model: Vec<u8>) -> WriterOptions {
        WriterOptions {
            vocab_size,
            tokenizer_kind: tokenizer_kind.to_owned(),
            tokenizer_model,
            text_block_size: 256,
            zstd_level: 9,
            compile: serde_json::Value::Object(Default::default()),
        }
    }
}

/// One utterance to append.
#[derive(Debug, Clone, Copy)]
pub struct UtteranceIn<'a> {
    /// Unique segment id from the manifest.
    pub segment_id: &'a str,
    /// Cleaned transcript, without a language tag.
    pub text: &'a str,
    /// Language code (interned into `metadata.languages` on first use).
    pub language: &'a str,
    /// Source name (interned into `metadata.sources` on first use).
    pub source: &'a str,
    /// 16 kHz mono PCM, at least one sample.
    pub pcm: &'a [i16],
    /// Token ids, each below the vocabulary size.
    pub tokens: &'a [u32],
}

/// What `finish` wrote.
#[derive(Debug)]
pub struct Written {
    /// Corpus statistics, as stored in the metadata.
    pub stats: Stats,
    /// File length in bytes.
    pub bytes: u64,
    /// The file's bytes, for a writer made with [`CorpusWriter::in_memory`].
    pub data: Option<Vec<u8>>,
}

/// A section's bytes on their way into the file, with a running checksum.
struct Spool {
    sink: SpoolSink,
    hasher: Xxh3,
    len: u64,
}

enum SpoolSink {
    Memory(Vec<u8>),
    File(BufWriter<File>),
}

impl Spool {
    fn new(dir: Option<&Path>) -> io::Result<Spool> {
        let sink = match dir {
            Some(d) => {
                SpoolSink::File(BufWriter::with_capacity(1 << 20, tempfile::tempfile_in(d)?))
            }
            None => SpoolSink::Memory(Vec::new()),
        };
        Ok(Spool { sink, hasher: Xxh3::new(), len: 0 })
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hasher.update(bytes);
        self.len += bytes.len() as u64;
        match &mut self.sink {
            SpoolSink::Memory(v) => {
                v.extend_from_slice(bytes);
                Ok(())
            }
            SpoolSink::File(f) => f.write_all(bytes),
        }
    }

    /// Appends the spooled bytes to `out`.
    fn copy_into(self, out: &mut dyn Write) -> io::Result<()> {
        match self.sink {
            SpoolSink::Memory(v) => out.write_all(&v),
            SpoolSink::File(f) => {
                let mut f = f.into_inner().map_err(|e| e.into_error())?;
                f.seek(SeekFrom::Start(0))?;
                io::copy(&mut f, out).map(|_| ())
            }
        }
    }
}

/// The spooled sections, in write order: everything between PCM (streamed into the output
/// directly) and TOKENIZER and METADATA (written from memory at the end).
const SPOOLED: &[SectionKind] = SectionKind::WRITE_ORDER.split_at(1).1.split_at(9).0;

enum Out {
    File { tmp: BufWriter<tempfile::NamedTempFile>, dest: PathBuf },
    Memory(Cursor<Vec<u8>>),
}

impl Out {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Out::File { tmp, .. } => tmp,
            Out::Memory(c) => c,
        }
    }
}

/// Streaming corpus writer; see the module documentation.
pub struct CorpusWriter {
    out: Out,
    path_for_errors: PathBuf,
    opts: WriterOptions,
    token_width: u32,
    spools: Vec<Spool>,
    pcm_hasher: Xxh3,
    n_utterances: u64,
    n_samples: u64,
    n_tokens: u64,
    languages: Vec<String>,
    language_ids: HashMap<String, u16>,
    sources: Vec<String>,
    source_ids: HashMap<String, u16>,
    per_language: Vec<LanguageStats>,
    pending_text: Vec<(String, String)>,
    text_offset: u64,
}

impl CorpusWriter {
    /// Starts a corpus that `finish` will place at `dest`. The temporary file and the spools are
    /// created in `dest`'s directory, so the final rename stays on one file system.
    pub fn create(dest: impl AsRef<Path>, opts: WriterOptions) -> Result<CorpusWriter, WriteError> {
        let dest = dest.as_ref().to_path_buf();
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let io_err = |action, source| WriteError::Io { action, path: dir.clone(), source };
        // Only the temporary file's name prefix: a destination without a file name (`dir/..`)
        // gets a prefix of "..", and the final rename then reports the real error.
        let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempfile_in(&dir)
            .map_err(|e| io_err("creating a temporary file in", e))?;
        let spools = (0..SPOOLED.len())
            .map(|_| Spool::new(Some(&dir)))
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| io_err("creating a spool file in", e))?;
        let out = Out::File { tmp: BufWriter::with_capacity(4 << 20, tmp), dest: dest.clone() };
        CorpusWriter::start(out, dest, opts, spools)
    }

    /// Starts a corpus built in memory (tests, small tools); `finish` returns its bytes.
    pub fn in_memory(opts: WriterOptions) -> Result<CorpusWriter, WriteError> {
        let spools = (0..SPOOLED.len()).map(|_| Spool::new(None)).collect::<io::Result<Vec<_>>>();
        let spools = spools.map_err(|source| WriteError::Io {
            action: "allocating",
            path: PathBuf::from("<memory>"),
            source,
        })?;
        CorpusWriter::start(Out::Memory(Cursor::new(Vec::new())), "<memory>".into(), opts, spools)
    }

    fn start(
        mut out: Out,
        path_for_errors: PathBuf,
        opts: WriterOptions,
        spools: Vec<Spool>,
    ) -> Result<CorpusWriter, WriteError> {
        validate_options(&opts)?;
        out.writer().write_all(&[0u8; layout::HEADER_SIZE as usize]).map_err(|source| {
            WriteError::Io { action: "writing", path: path_for_errors.clone(), source }
        })?;
        let mut w = CorpusWriter {
            out,
            path_for_errors,
            token_width: Header::token_width_for(opts.vocab_size),
            opts,
            spools,
            pcm_hasher: Xxh3::new(),
            n_utterances: 0,
            n_samples: 0,
            n_tokens: 0,
            languages: Vec::new(),
            language_ids: HashMap::new(),
            sources: Vec::new(),
            source_ids: HashMap::new(),
            per_language: Vec::new(),
            pending_text: Vec::new(),
            text_offset: 0,
        };
        w.spool(SectionKind::TokenOffsets, &0u64.to_le_bytes())?;
        Ok(w)
    }

    /// Number of utterances pushed so far.
    pub fn len(&self) -> u64 {
        self.n_utterances
    }

    /// Whether nothing has been pushed.
    pub fn is_empty(&self) -> bool {
        self.n_utterances == 0
    }

    fn io(&self, action: &'static str) -> impl Fn(io::Error) -> WriteError + '_ {
        move |source| WriteError::Io { action, path: self.path_for_errors.clone(), source }
    }

    fn spool(&mut self, kind: SectionKind, bytes: &[u8]) -> Result<(), WriteError> {
        // A fallback slot would silently write one section's bytes into another's.
        let slot = SPOOLED
            .iter()
            .position(|&k| k == kind)
            .expect("spool() is only called with the kinds SPOOLED lists");
        let r = self.spools[slot].write(bytes);
        r.map_err(self.io("writing a spool for"))
    }

    /// Appends one utterance. An invalid utterance is refused whole, with nothing written, and
    /// the writer stays usable.
    pub fn push(&mut self, u: &UtteranceIn<'_>) -> Result<(), WriteError> {
        self.check(u)?;
        let language = intern(&mut self.languages, &mut self.language_ids, u.language);
        let source = intern(&mut self.sources, &mut self.source_ids, u.source);
        let (Some(language), Some(source)) = (language, source) else {
            return Err(WriteError::LimitExceeded {
                what: "number of distinct languages or sources",
                max: crate::meta::MAX_TABLE_ENTRIES as u64,
            });
        };

        if self.per_language.len() < self.languages.len() {
            self.per_language.resize(self.languages.len(), LanguageStats::default());
        }

        let pcm_bytes: &[u8] = bytemuck::cast_slice(u.pcm);
        self.pcm_hasher.update(pcm_bytes);
        let r = self.out.writer().write_all(pcm_bytes);
        r.map_err(self.io("writing PCM to"))?;

        let n_samples = u.pcm.len() as u64;
        let n_tokens = u.tokens.len() as u64;
        self.spool(SectionKind::NumSamples, &(n_samples as u32).to_le_bytes())?;
        self.spool(SectionKind::PcmOffsets, &self.n_samples.to_le_bytes())?;
        self.spool(SectionKind::TokenOffsets, &(self.n_tokens + n_tokens).to_le_bytes())?;
        self.spool(SectionKind::Languages, &language.to_le_bytes())?;
        self.spool(SectionKind::Sources, &source.to_le_bytes())?;
        self.spool(SectionKind::AudioHashes, &crate::audio_hash(u.pcm).to_le_bytes())?;
        let mut tok = Vec::with_capacity(u.tokens.len() * self.token_width as usize);
        for &t in u.tokens {
            if self.token_width == 2 {
                tok.extend_from_slice(&(t as u16).to_le_bytes());
            } else {
                tok.extend_from_slice(&t.to_le_bytes());
            }
        }
        self.spool(SectionKind::Tokens, &tok)?;

        let stats = &mut self.per_language[language as usize];
        stats.utterances += 1;
        stats.samples += n_samples;
        stats.tokens += n_tokens;
        self.n_utterances += 1;
        self.n_samples += n_samples;
        self.n_tokens += n_tokens;

        self.pending_text.push((u.segment_id.to_owned(), u.text.to_owned()));
        if self.pending_text.len() == self.opts.text_block_size as usize {
            self.flush_text_block()?;
        }
        Ok(())
    }

    fn check(&self, u: &UtteranceIn<'_>) -> Result<(), WriteError> {
        let bad = |message: String| WriteError::InvalidUtterance {
            index: self.n_utterances,
            segment_id: u.segment_id.to_owned(),
            message,
        };
        if self.n_utterances >= layout::MAX_UTTERANCES {
            return Err(WriteError::LimitExceeded {
                what: "number of utterances",
                max: layout::MAX_UTTERANCES,
            });
        }
        let max_samples = layout::MAX_UTTERANCE_SAMPLES as usize;
        if u.pcm.is_empty() || u.pcm.len() > max_samples {
            return Err(bad(format!("{} samples, expected 1..={max_samples}", u.pcm.len())));
        }
        if u.tokens.len() as u64 > layout::MAX_TOKENS_PER_UTTERANCE {
            return Err(bad(format!(
                "{} tokens, at most {} allowed",
                u.tokens.len(),
                layout::MAX_TOKENS_PER_UTTERANCE
            )));
        }
        if let Some(p) = u.tokens.iter().position(|&t| t >= self.opts.vocab_size) {
            return Err(bad(format!(
                "token {p} is {}, expected < vocab_size {}",
                u.tokens[p], self.opts.vocab_size
            )));
        }
        let id_len = u.segment_id.len();
        if id_len == 0 || id_len > layout::MAX_SEGMENT_ID_BYTES {
            return Err(bad(format!(
                "segment id is {id_len} bytes, expected 1..={}",
                layout::MAX_SEGMENT_ID_BYTES
            )));
        }
        if u.text.len() > layout::MAX_TEXT_BYTES {
            return Err(bad(format!(
                "transcript is {} bytes, at most {} allowed",
                u.text.len(),
                layout::MAX_TEXT_BYTES
            )));
        }
        if u.language.is_empty() {
            return Err(bad("empty language code".into()));
        }
        Ok(())
    }

    fn flush_text_block(&mut self) -> Result<(), WriteError> {
        if self.pending_text.is_empty() {
            return Ok(());
        }
        let raw = text::encode_raw(self.pending_text.iter().map(|(a, b)| (a.as_str(), b.as_str())));
        self.pending_text.clear();
        let frame = zstd::bulk::compress(&raw, self.opts.zstd_level)
            .map_err(self.io("compressing a text block for"))?;
        let entry = TextIndexEntry {
            offset: self.text_offset,
            compressed_len: frame.len() as u32,
            raw_len: raw.len() as u32,
        };
        if raw.len() > layout::MAX_TEXT_BLOCK_RAW_BYTES as usize {
            return Err(WriteError::LimitExceeded {
                what: "decompressed text block size (lower text_block_size)",
                max: u64::from(layout::MAX_TEXT_BLOCK_RAW_BYTES),
            });
        }
        self.text_offset += frame.len() as u64;
        self.spool(SectionKind::TextIndex, &entry.to_bytes())?;
        self.spool(SectionKind::TextBlocks, &frame)
    }

    /// Writes the remaining sections and the header, syncs, and renames the file into place.
    pub fn finish(mut self) -> Result<Written, WriteError> {
        self.flush_text_block()?;
        let stats = self.stats();
        let metadata = Metadata {
            languages: self.languages.clone(),
            sources: self.sources.clone(),
            tokenizer: TokenizerInfo {
                kind: self.opts.tokenizer_kind.clone(),
                vocab_size: self.opts.vocab_size,
                model_xxh3: hash_hex(xxhash_rust::xxh3::xxh3_64(&self.opts.tokenizer_model)),
                model_bytes: self.opts.tokenizer_model.len() as u64,
            },
            compile: self.opts.compile.clone(),
            stats: stats.clone(),
        }
        .to_bytes();
        if metadata.len() as u64 > layout::MAX_METADATA_BYTES {
            return Err(WriteError::LimitExceeded {
                what: "metadata size",
                max: layout::MAX_METADATA_BYTES,
            });
        }

        let mut entries: BTreeMap<SectionKind, SectionEntry> = BTreeMap::new();
        let mut pos = layout::HEADER_SIZE;
        let pcm_len = self.n_samples * 2;
        entries.insert(
            SectionKind::Pcm,
            entry(SectionKind::Pcm, pos, pcm_len, self.pcm_hasher.digest()),
        );
        pos += pcm_len;
        let spools = std::mem::take(&mut self.spools);
        let path = self.path_for_errors.clone();
        let io = |source| WriteError::Io { action: "writing", path: path.clone(), source };
        let w = self.out.writer();
        for (&kind, spool) in SPOOLED.iter().zip(spools) {
            pos = pad(w, pos).map_err(io)?;
            entries.insert(kind, entry(kind, pos, spool.len, spool.hasher.digest()));
            pos += spool.len;
            spool.copy_into(w).map_err(io)?;
        }
        for (kind, bytes) in [
            (SectionKind::Tokenizer, &self.opts.tokenizer_model[..]),
            (SectionKind::Metadata, &metadata[..]),
        ] {
            pos = pad(w, pos).map_err(io)?;
            let sum = xxhash_rust::xxh3::xxh3_64(bytes);
            entries.insert(kind, entry(kind, pos, bytes.len() as u64, sum));
            pos += bytes.len() as u64;
            w.write_all(bytes).map_err(io)?;
        }
        let file_len = pad(w, pos).map_err(io)?;

        let header = Header {
            format_version: layout::FORMAT_VERSION,
            min_reader_version: layout::MIN_READER_VERSION,
            n_utterances: self.n_utterances,
            n_samples: self.n_samples,
            n_tokens: self.n_tokens,
            sample_rate: layout::SAMPLE_RATE,
            token_width: self.token_width,
            vocab_size: self.opts.vocab_size,
            text_block_size: self.opts.text_block_size,
            sections: SectionKind::WRITE_ORDER
                .iter()
                .filter_map(|k| entries.get(k).copied())
                .collect(),
        };
        let header = header.to_bytes().map_err(|e| WriteError::InvalidOptions(e.to_string()))?;
        let data = match self.out {
            Out::Memory(mut c) => {
                c.seek(SeekFrom::Start(0)).map_err(io)?;
                c.write_all(&header).map_err(io)?;
                Some(c.into_inner())
            }
            Out::File { tmp, dest } => {
                let mut tmp = tmp.into_inner().map_err(|e| io(e.into_error()))?;
                tmp.seek(SeekFrom::Start(0)).map_err(io)?;
                tmp.write_all(&header).map_err(io)?;
                tmp.as_file().sync_all().map_err(io)?;
                tmp.persist(&dest).map_err(|e| WriteError::Io {
                    action: "renaming the finished corpus to",
                    path: dest.clone(),
                    source: e.error,
                })?;
                sync_parent_dir(&dest);
                None
            }
        };
        Ok(Written { stats, bytes: file_len, data })
    }

    fn stats(&self) -> Stats {
        let mut per_language = BTreeMap::new();
        for (code, s) in self.languages.iter().zip(&self.per_language) {
            if s.utterances > 0 {
                per_language
                    .insert(code.clone(), LanguageStats { hours: hours(s.samples), ..s.clone() });
            }
        }
        Stats {
            utterances: self.n_utterances,
            samples: self.n_samples,
            tokens: self.n_tokens,
            hours: hours(self.n_samples),
            per_language,
        }
    }
}

fn validate_options(o: &WriterOptions) -> Result<(), WriteError> {
    let bad = |m: String| Err(WriteError::InvalidOptions(m));
    if o.vocab_size == 0 {
        return bad("vocab_size must be at least 1".into());
    }
    if o.text_block_size == 0 || o.text_block_size > layout::MAX_TEXT_BLOCK_UTTERANCES {
        return bad(format!(
            "text_block_size is {}, expected 1..={}",
            o.text_block_size,
            layout::MAX_TEXT_BLOCK_UTTERANCES
        ));
    }
    match (o.tokenizer_kind.as_str(), o.tokenizer_model.is_empty()) {
        ("none", true) | ("sentencepiece", false) => {}
        (kind, empty) => {
            return bad(format!(
                "tokenizer kind {kind:?} with a {} model; expected \"sentencepiece\" with a model \
                 or \"none\" without one",
                if empty { "missing" } else { "present" }
            ))
        }
    }
    if o.tokenizer_model.len() as u64 > layout::MAX_TOKENIZER_BYTES {
        return bad(format!("tokenizer model is {} bytes, too large", o.tokenizer_model.len()));
    }
    if !o.compile.is_object() {
        return bad("compile parameters must be a JSON object".into());
    }
    if zstd::compression_level_range().contains(&o.zstd_level) {
        Ok(())
    } else {
        bad(format!("zstd level {} is out of range", o.zstd_level))
    }
}

/// Id of `name` in `table`, adding it on first use; `None` when the table is full.
fn intern(table: &mut Vec<String>, ids: &mut HashMap<String, u16>, name: &str) -> Option<u16> {
    if let Some(&id) = ids.get(name) {
        return Some(id);
    }
    let id = u16::try_from(table.len()).ok()?;
    table.push(name.to_owned());
    ids.insert(name.to_owned(), id);
    Some(id)
}

fn entry(kind: SectionKind, offset: u64, length: u64, checksum: u64) -> SectionEntry {
    SectionEntry { kind: kind.code(), flags: 0, offset, length, checksum }
}

/// Writes zeros from `pos` up to the next section boundary; returns the boundary.
fn pad(w: &mut dyn Write, pos: u64) -> io::Result<u64> {
    let next = layout::align_up(pos).unwrap_or(pos);
    w.write_all(&vec![0u8; (next - pos) as usize])?;
    Ok(next)
}

/// Makes the rename durable. Best effort: some file systems refuse to sync a directory, and the
/// data itself was already synced.
fn sync_parent_dir(dest: &Path) {
    #[cfg(unix)]
    if let Some(dir) = dest.parent() {
        let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = dest;
}
