//! [`Corpus`]: a validated, zero-copy view of a corpus file.
//!
//! `open` applies the structural rules R1-R13 of SPEC.md section 8: a few header reads plus one
//! sequential pass over the small per-utterance arrays. After it succeeds, every per-utterance
//! slice is known to lie inside its section, so the accessors below cannot fail (they panic only
//! for an index `>= len()`, like slice indexing). `verify` (in `verify.rs`) reads every byte.

use std::ops::Range;
use std::path::Path;

use crate::error::FormatError;
use crate::layout::{self, header_offset as ho, le_u32, le_u64, Header, SectionEntry, SectionKind};
use crate::meta::Metadata;
use crate::storage::{AlignedBuf, Storage};
use crate::text::{self, TextBlock};

/// Token ids of one utterance (or of the whole corpus), in the width the file stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSlice<'a> {
    /// Vocabulary of at most 65536 ids.
    U16(&'a [u16]),
    /// Larger vocabulary.
    U32(&'a [u32]),
}

impl TokenSlice<'_> {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self {
            TokenSlice::U16(s) => s.len(),
            TokenSlice::U32(s) => s.len(),
        }
    }

    /// Whether there is no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token `j` widened to `u32`, or `None` past the end.
    pub fn get(&self, j: usize) -> Option<u32> {
        match self {
            TokenSlice::U16(s) => s.get(j).map(|&t| u32::from(t)),
            TokenSlice::U32(s) => s.get(j).copied(),
        }
    }

    /// The ids widened to `u32`.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenSlice::U16(s) => s.iter().map(|&t| u32::from(t)).collect(),
            TokenSlice::U32(s) => s.to_vec(),
        }
    }
}

/// Everything about one utterance that needs no decompression.
#[derive(Debug, Clone, Copy)]
pub struct Utterance<'a> {
    /// 16 kHz mono PCM.
    pub pcm: &'a [i16],
    /// Token ids.
    pub tokens: TokenSlice<'a>,
    /// Language id (index into `metadata().languages`).
    pub language: u16,
    /// Source id (index into `metadata().sources`).
    pub source: u16,
    /// xxh3 of the PCM bytes.
    pub audio_hash: u64,
}

/// A corpus file opened for reading. Cheap to share between threads (`&Corpus` is `Sync`).
pub struct Corpus {
    storage: Storage,
    header: Header,
    /// Byte range of each known section, indexed by `SectionKind::slot`.
    ranges: [Range<usize>; 12],
    metadata: Metadata,
}

impl std::fmt::Debug for Corpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Corpus")
            .field("utterances", &self.header.n_utterances)
            .field("samples", &self.header.n_samples)
            .field("tokens", &self.header.n_tokens)
            .finish_non_exhaustive()
    }
}

impl Corpus {
    /// Maps `path` read-only and applies the structural rules (R1-R13).
    ///
    /// Cost: O(1) for the header, section table and metadata, plus one sequential pass over
    /// NUM_SAMPLES, PCM_OFFSETS, TOKEN_OFFSETS, LANGUAGES and SOURCES (about 24 bytes per
    /// utterance). PCM, tokens and text are not read.
    pub fn open(path: impl AsRef<Path>) -> Result<Corpus, FormatError> {
        Corpus::from_storage(Storage::map(path.as_ref())?)
    }

    /// Opens a corpus held in memory, with the same checks as [`Corpus::open`].
    pub fn from_buf(buf: AlignedBuf) -> Result<Corpus, FormatError> {
        Corpus::from_storage(Storage::Owned(buf))
    }

    /// Copies `bytes` into an aligned buffer and opens it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Corpus, FormatError> {
        Corpus::from_buf(AlignedBuf::from_bytes(bytes))
    }

    fn from_storage(storage: Storage) -> Result<Corpus, FormatError> {
        let bytes = storage.bytes();
        // The rules in SPEC.md's order: each needs only what the ones before it established.
        let header = parse_header(bytes)?; // R1-R6, R9
        let ranges = section_ranges(&header, bytes.len() as u64)?; // R7, R8
        check_section_lengths(&header, &ranges)?; // R10
        let metadata = Metadata::parse(&bytes[ranges[SectionKind::Metadata.slot()].clone()])?;
        check_metadata_against_header(&metadata, &header, &ranges)?; // R11
        let corpus = Corpus { storage, header, ranges, metadata };
        corpus.check_utterance_arrays()?; // R12, with R11's table lengths
        corpus.check_text_index()?; // R13
        Ok(corpus)
    }

    /// The decoded header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The decoded metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Number of utterances.
    pub fn len(&self) -> usize {
        self.header.n_utterances as usize
    }

    /// Whether the corpus has no utterance.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Byte range of a section in the file.
    pub fn section_range(&self, kind: SectionKind) -> Range<usize> {
        self.ranges[kind.slot()].clone()
    }

    /// The bytes of a section.
    pub fn section_bytes(&self, kind: SectionKind) -> &[u8] {
        &self.storage.bytes()[self.section_range(kind)]
    }

    fn array<T: bytemuck::Pod>(&self, kind: SectionKind) -> &[T] {
        // `open` checked that the base is 8-byte aligned, every section starts at a multiple of
        // 4096 and each array section's length is a multiple of its element size (R7, R10), so
        // this cast cannot fail.
        bytemuck::cast_slice(self.section_bytes(kind))
    }

    /// Samples per utterance.
    pub fn num_samples(&self) -> &[u32] {
        self.array(SectionKind::NumSamples)
    }

    /// First PCM sample of each utterance.
    pub fn pcm_offsets(&self) -> &[u64] {
        self.array(SectionKind::PcmOffsets)
    }

    /// Token offsets, `len() + 1` entries.
    pub fn token_offsets(&self) -> &[u64] {
        self.array(SectionKind::TokenOffsets)
    }

    /// Language id per utterance.
    pub fn languages(&self) -> &[u16] {
        self.array(SectionKind::Languages)
    }

    /// Source id per utterance.
    pub fn sources(&self) -> &[u16] {
        self.array(SectionKind::Sources)
    }

    /// Audio hash per utterance.
    pub fn audio_hashes(&self) -> &[u64] {
        self.array(SectionKind::AudioHashes)
    }

    /// All PCM samples.
    pub fn pcm_all(&self) -> &[i16] {
        self.array(SectionKind::Pcm)
    }

    /// All token ids.
    pub fn tokens_all(&self) -> TokenSlice<'_> {
        if self.header.token_width == 2 {
            TokenSlice::U16(self.array(SectionKind::Tokens))
        } else {
            TokenSlice::U32(self.array(SectionKind::Tokens))
        }
    }

    /// PCM of utterance `i`. Panics if `i >= len()`.
    pub fn pcm(&self, i: usize) -> &[i16] {
        let start = self.pcm_offsets()[i] as usize;
        &self.pcm_all()[start..start + self.num_samples()[i] as usize]
    }

    /// Tokens of utterance `i`. Panics if `i >= len()`.
    pub fn tokens(&self, i: usize) -> TokenSlice<'_> {
        let o = self.token_offsets();
        let r = o[i] as usize..o[i + 1] as usize;
        match self.tokens_all() {
            TokenSlice::U16(s) => TokenSlice::U16(&s[r]),
            TokenSlice::U32(s) => TokenSlice::U32(&s[r]),
        }
    }

    /// Duration of utterance `i` in seconds. Panics if `i >= len()`.
    pub fn duration_seconds(&self, i: usize) -> f64 {
        f64::from(self.num_samples()[i]) / f64::from(layout::SAMPLE_RATE)
    }

    /// Language code of utterance `i`. Panics if `i >= len()`.
    pub fn language_code(&self, i: usize) -> &str {
        &self.metadata.languages[self.languages()[i] as usize]
    }

    /// Source name of utterance `i`. Panics if `i >= len()`.
    pub fn source_name(&self, i: usize) -> &str {
        &self.metadata.sources[self.sources()[i] as usize]
    }

    /// Utterance `i`, or `None` if `i >= len()`.
    pub fn utterance(&self, i: usize) -> Option<Utterance<'_>> {
        (i < self.len()).then(|| Utterance {
            pcm: self.pcm(i),
            tokens: self.tokens(i),
            language: self.languages()[i],
            source: self.sources()[i],
            audio_hash: self.audio_hashes()[i],
        })
    }

    /// The tokenizer model bytes (empty when the corpus embeds none).
    pub fn tokenizer_model(&self) -> &[u8] {
        self.section_bytes(SectionKind::Tokenizer)
    }

    /// Number of text blocks.
    pub fn text_block_count(&self) -> usize {
        self.len().div_ceil(self.header.text_block_size as usize)
    }

    /// Decompresses and checks text block `b` (rule V5: one zstd frame as SPEC.md section 6.5
    /// says, then the record layout). Fails only for a corrupt block; panics if
    /// `b >= text_block_count()`.
    pub fn text_block(&self, b: usize) -> Result<TextBlock, FormatError> {
        let k = self.header.text_block_size as usize;
        let first = (b * k) as u64;
        let records = (self.len() - b * k).min(k);
        let entry = self.text_index_entry(b);
        let blocks = self.section_bytes(SectionKind::TextBlocks);
        let frame =
            &blocks[entry.offset as usize..entry.offset as usize + entry.compressed_len as usize];
        let err = |message: String| FormatError::TextBlock { block: b as u64, first, message };
        check_frame(frame, entry.raw_len).map_err(err)?;
        let raw = decompress_exact(frame, entry.raw_len as usize).map_err(err)?;
        text::decode_raw(first, records, raw).map_err(|e| err(e.0))
    }

    /// Segment id and transcript of utterance `i`, decompressing its block. Panics if
    /// `i >= len()`. To read many, iterate blocks with [`Corpus::text_block`].
    pub fn text(&self, i: usize) -> Result<(String, String), FormatError> {
        let k = self.header.text_block_size as usize;
        let block = self.text_block(i / k)?;
        let r = block.get(i % k).ok_or_else(|| FormatError::TextBlock {
            block: (i / k) as u64,
            first: block.first_utterance(),
            message: format!("has no record for utterance {i}"),
        })?;
        Ok((r.segment_id.to_owned(), r.text.to_owned()))
    }

    pub(crate) fn text_index_entry(&self, b: usize) -> layout::TextIndexEntry {
        let at = b * layout::TEXT_INDEX_ENTRY_BYTES;
        layout::TextIndexEntry::from_bytes(
            &self.section_bytes(SectionKind::TextIndex)[at..at + layout::TEXT_INDEX_ENTRY_BYTES],
        )
    }

    /// Tells the kernel the PCM of utterances `range` will be read soon (`madvise(WILLNEED)`).
    /// No effect on in-memory corpora. Panics if the range exceeds `len()`.
    pub fn prefetch_pcm(&self, range: Range<usize>) {
        if range.is_empty() {
            return;
        }
        let base = self.ranges[SectionKind::Pcm.slot()].start;
        let start = self.pcm_offsets()[range.start] as usize;
        let last = range.end - 1;
        let end = self.pcm_offsets()[last] as usize + self.num_samples()[last] as usize;
        self.storage.will_need(base + 2 * start..base + 2 * end);
    }

    /// R12: one pass over the five per-utterance arrays.
    fn check_utterance_arrays(&self) -> Result<(), FormatError> {
        let n = self.len();
        let ns = self.num_samples();
        let po = self.pcm_offsets();
        let to = self.token_offsets();
        let max = layout::MAX_UTTERANCE_SAMPLES;
        let mut sum = 0u64;
        for i in 0..n {
            let s = ns[i];
            if s == 0 || s > max {
                return Err(FormatError::Array {
                    section: SectionKind::NumSamples,
                    index: i as u64,
                    message: format!("is {s}, expected 1..={max}"),
                });
            }
            if po[i] != sum {
                return Err(FormatError::Array {
                    section: SectionKind::PcmOffsets,
                    index: i as u64,
                    message: format!("is {}, expected {sum} (utterances are back to back)", po[i]),
                });
            }
            sum += u64::from(s);
        }
        if sum != self.header.n_samples {
            return Err(FormatError::HeaderField {
                field: "n_samples",
                offset: ho::N_SAMPLES,
                expected: format!("{sum} (the sum of NUM_SAMPLES)"),
                found: self.header.n_samples.to_string(),
            });
        }
        if to[0] != 0 {
            return Err(FormatError::Array {
                section: SectionKind::TokenOffsets,
                index: 0,
                message: format!("is {}, expected 0", to[0]),
            });
        }
        for i in 0..n {
            let (a, b) = (to[i], to[i + 1]);
            if b < a || b - a > layout::MAX_TOKENS_PER_UTTERANCE {
                return Err(FormatError::Array {
                    section: SectionKind::TokenOffsets,
                    index: i as u64 + 1,
                    message: format!(
                        "is {b} after {a}: utterance {i} would have {} tokens, expected 0..={}",
                        b as i128 - a as i128,
                        layout::MAX_TOKENS_PER_UTTERANCE
                    ),
                });
            }
        }
        if to[n] != self.header.n_tokens {
            return Err(FormatError::Array {
                section: SectionKind::TokenOffsets,
                index: n as u64,
                message: format!("is {}, expected n_tokens {}", to[n], self.header.n_tokens),
            });
        }
        for (kind, ids, table) in [
            (SectionKind::Languages, self.languages(), self.metadata.languages.len()),
            (SectionKind::Sources, self.sources(), self.metadata.sources.len()),
        ] {
            if let Some(i) = ids.iter().position(|&id| id as usize >= table) {
                return Err(FormatError::Array {
                    section: kind,
                    index: i as u64,
                    message: format!(
                        "is {}, expected < {table} (entries in the metadata table)",
                        ids[i]
                    ),
                });
            }
        }
        Ok(())
    }

    /// R13: text frames are back to back and their sizes plausible.
    fn check_text_index(&self) -> Result<(), FormatError> {
        let k = self.header.text_block_size as usize;
        let total = self.section_bytes(SectionKind::TextBlocks).len() as u64;
        let mut at = 0u64;
        for b in 0..self.text_block_count() {
            let e = self.text_index_entry(b);
            let records = (self.len() - b * k).min(k) as u64;
            let err = |message: String| FormatError::Array {
                section: SectionKind::TextIndex,
                index: b as u64,
                message,
            };
            if e.offset != at {
                return Err(err(format!("offset is {}, expected {at}", e.offset)));
            }
            if e.compressed_len == 0 {
                return Err(err("compressed_len is 0, expected >= 1".into()));
            }
            let min_raw = 4 * (2 * records + 1);
            if u64::from(e.raw_len) < min_raw || e.raw_len > layout::MAX_TEXT_BLOCK_RAW_BYTES {
                return Err(err(format!(
                    "raw_len is {}, expected {min_raw}..={} for {records} records",
                    e.raw_len,
                    layout::MAX_TEXT_BLOCK_RAW_BYTES
                )));
            }
            at += u64::from(e.compressed_len);
            if at > total {
                return Err(err(format!("frame ends at {at}, past TEXT_BLOCKS' {total} bytes")));
            }
        }
        if at != total {
            return Err(FormatError::Array {
                section: SectionKind::TextIndex,
                index: self.text_block_count() as u64,
                message: format!("frames end at {at}, expected TEXT_BLOCKS' length {total}"),
            });
        }
        Ok(())
    }
}

/// SPEC.md section 6.5: a text block is exactly one zstd frame (not skippable, not legacy, nothing
/// after it) that declares its content size as `raw_len` and names no dictionary. Reads only the
/// frame header and the block headers.
fn check_frame(frame: &[u8], raw_len: u32) -> Result<(), String> {
    use zstd::zstd_safe;
    if !frame.starts_with(&layout::ZSTD_FRAME_MAGIC) {
        let head: Vec<String> = frame.iter().take(4).map(|b| format!("{b:02x}")).collect();
        return Err(format!(
            "starts with {}, expected the zstd frame magic 28 b5 2f fd (one zstd frame per block)",
            head.join(" ")
        ));
    }
    match zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) if n == u64::from(raw_len) => {}
        Ok(Some(n)) => {
            return Err(format!("zstd frame declares a content size of {n}, raw_len is {raw_len}"))
        }
        Ok(None) => {
            return Err(format!(
                "zstd frame does not declare its content size, expected raw_len {raw_len}"
            ))
        }
        Err(_) => return Err("zstd frame header is invalid or truncated".into()),
    }
    if let Some(id) = zstd_safe::get_dict_id_from_frame(frame) {
        return Err(format!("zstd frame needs dictionary {id}, text frames use none"));
    }
    match zstd_safe::find_frame_compressed_size(frame) {
        Ok(n) if n == frame.len() => Ok(()),
        Ok(n) => Err(format!(
            "its zstd frame ends at byte {n} of {}: anything after the one frame of a block (a \
             second frame, a skippable frame) is not allowed",
            frame.len()
        )),
        Err(code) => {
            Err(format!("is not one complete zstd frame: {}", zstd_safe::get_error_name(code)))
        }
    }
}

/// Decompresses one zstd frame, refusing output larger than `expected` and requiring exactly it.
fn decompress_exact(frame: &[u8], expected: usize) -> Result<Vec<u8>, String> {
    // One byte of headroom distinguishes "exactly raw_len" from "more than raw_len".
    let raw = zstd::bulk::decompress(frame, expected + 1)
        .map_err(|e| format!("zstd frame does not decompress within {expected} bytes: {e}"))?;
    if raw.len() != expected {
        return Err(format!("decompresses to {} bytes, expected raw_len {expected}", raw.len()));
    }
    Ok(raw)
}

/// R1-R6 and R9 (R9 needs only the header, so it is applied here, before R7 and R8): the fixed
/// header fields and the section table entries.
fn parse_header(bytes: &[u8]) -> Result<Header, FormatError> {
    if bytes.len() < layout::HEADER_SIZE as usize {
        return Err(FormatError::TooSmall { len: bytes.len() as u64 });
    }
    let h = &bytes[..layout::HEADER_SIZE as usize];
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&h[..8]);
    if magic != layout::MAGIC {
        return Err(FormatError::BadMagic { found: magic });
    }
    let marker = le_u32(h, ho::ENDIAN_MARKER);
    if marker != layout::ENDIAN_MARKER {
        return Err(FormatError::WrongEndian { found: marker });
    }
    if cfg!(target_endian = "big") {
        return Err(FormatError::UnsupportedHost);
    }
    if !(bytes.as_ptr() as usize).is_multiple_of(8) {
        return Err(FormatError::Misaligned { address: bytes.as_ptr() as usize });
    }
    let format_version = le_u32(h, ho::FORMAT_VERSION);
    let min_reader_version = le_u32(h, ho::MIN_READER_VERSION);
    if min_reader_version == 0 {
        return Err(FormatError::HeaderField {
            field: "min_reader_version",
            offset: ho::MIN_READER_VERSION,
            expected: format!("1..={format_version} (format_version)"),
            found: "0".into(),
        });
    }
    if format_version < layout::OLDEST_READABLE_VERSION
        || min_reader_version > format_version
        || min_reader_version > layout::FORMAT_VERSION
    {
        return Err(FormatError::UnsupportedVersion {
            format_version,
            min_reader_version,
            oldest: layout::OLDEST_READABLE_VERSION,
            newest: layout::FORMAT_VERSION,
        });
    }
    let stored = le_u64(h, ho::HEADER_CHECKSUM);
    let computed = layout::header_checksum(h);
    if stored != computed {
        return Err(FormatError::HeaderChecksum { stored, computed });
    }
    let field = |name: &'static str, offset: usize, expected: String, found: String| {
        FormatError::HeaderField { field: name, offset, expected, found }
    };
    for (name, offset, expected) in [
        ("header_size", ho::HEADER_SIZE, layout::HEADER_SIZE as u32),
        ("section_align", ho::SECTION_ALIGN, layout::SECTION_ALIGN as u32),
        ("sample_rate", ho::SAMPLE_RATE, layout::SAMPLE_RATE),
    ] {
        let found = le_u32(h, offset);
        if found != expected {
            return Err(field(name, offset, expected.to_string(), found.to_string()));
        }
    }
    if let Some(i) = h[ho::RESERVED..ho::HEADER_CHECKSUM].iter().position(|&b| b != 0) {
        return Err(field(
            "reserved",
            ho::RESERVED + i,
            "0".into(),
            h[ho::RESERVED + i].to_string(),
        ));
    }
    let count = le_u32(h, ho::SECTION_COUNT);
    if count > layout::MAX_SECTIONS {
        return Err(FormatError::LimitExceeded {
            what: "section_count",
            value: u64::from(count),
            max: u64::from(layout::MAX_SECTIONS),
        });
    }
    let table_end = ho::SECTION_TABLE + count as usize * layout::SECTION_ENTRY_BYTES;
    if let Some(i) = h[table_end..].iter().position(|&b| b != 0) {
        return Err(field(
            "padding after the section table",
            table_end + i,
            "0".into(),
            h[table_end + i].to_string(),
        ));
    }
    let sections = (0..count as usize)
        .map(|i| {
            let at = ho::SECTION_TABLE + i * layout::SECTION_ENTRY_BYTES;
            let mut e = [0u8; layout::SECTION_ENTRY_BYTES];
            e.copy_from_slice(&h[at..at + layout::SECTION_ENTRY_BYTES]);
            SectionEntry::from_bytes(&e)
        })
        .collect();
    let header = Header {
        format_version,
        min_reader_version,
        n_utterances: le_u64(h, ho::N_UTTERANCES),
        n_samples: le_u64(h, ho::N_SAMPLES),
        n_tokens: le_u64(h, ho::N_TOKENS),
        sample_rate: le_u32(h, ho::SAMPLE_RATE),
        token_width: le_u32(h, ho::TOKEN_WIDTH),
        vocab_size: le_u32(h, ho::VOCAB_SIZE),
        text_block_size: le_u32(h, ho::TEXT_BLOCK_SIZE),
        sections,
    };
    if header.vocab_size == 0 {
        return Err(field("vocab_size", ho::VOCAB_SIZE, ">= 1".into(), "0".into()));
    }
    let width = Header::token_width_for(header.vocab_size);
    if header.token_width != width {
        return Err(field(
            "token_width",
            ho::TOKEN_WIDTH,
            format!("{width} for vocab_size {}", header.vocab_size),
            header.token_width.to_string(),
        ));
    }
    let k = header.text_block_size;
    if k == 0 || k > layout::MAX_TEXT_BLOCK_UTTERANCES {
        return Err(field(
            "text_block_size",
            ho::TEXT_BLOCK_SIZE,
            format!("1..={}", layout::MAX_TEXT_BLOCK_UTTERANCES),
            k.to_string(),
        ));
    }
    if header.n_utterances > layout::MAX_UTTERANCES {
        return Err(FormatError::LimitExceeded {
            what: "n_utterances",
            value: header.n_utterances,
            max: layout::MAX_UTTERANCES,
        });
    }
    Ok(header)
}

/// R7 and R8: sections back to back, each known kind once, the file length exact.
fn section_ranges(header: &Header, file_len: u64) -> Result<[Range<usize>; 12], FormatError> {
    let mut slots: [Option<(usize, Range<usize>)>; 12] = Default::default();
    let mut expected = layout::HEADER_SIZE;
    for (i, s) in header.sections.iter().enumerate() {
        let kind = SectionKind::from_code(s.kind);
        let name = kind.map_or_else(|| format!("kind {}", s.kind), |k| k.name().to_owned());
        if s.offset != expected {
            return Err(FormatError::SectionOffset {
                entry: i,
                kind: name,
                expected,
                found: s.offset,
            });
        }
        // Every kind this version defines is required, so its entry has no flag; only an unknown
        // kind may be OPTIONAL.
        let (allowed, allowed_text) = match kind {
            Some(_) => (0, "0 (every kind this version defines is required)"),
            None => (layout::FLAG_OPTIONAL, "0 or 0x1 (OPTIONAL)"),
        };
        if s.flags & !allowed != 0 {
            return Err(FormatError::SectionFlags {
                entry: i,
                kind: name,
                flags: s.flags,
                expected: allowed_text,
            });
        }
        let end = s.offset.checked_add(s.length).filter(|&e| e <= file_len).ok_or(
            FormatError::FileLength {
                expected: s.offset.saturating_add(s.length),
                found: file_len,
            },
        )?;
        match kind {
            Some(k) => {
                if let Some((first, _)) = &slots[k.slot()] {
                    return Err(FormatError::DuplicateSection {
                        kind: k,
                        first: *first,
                        second: i,
                    });
                }
                slots[k.slot()] = Some((i, s.offset as usize..end as usize));
            }
            None if s.flags & layout::FLAG_OPTIONAL == 0 => {
                return Err(FormatError::UnknownSection { entry: i, code: s.kind });
            }
            None => {}
        }
        // `end <= file_len`, so this cannot overflow.
        expected = layout::align_up(end).unwrap_or(u64::MAX);
    }
    if expected != file_len {
        return Err(FormatError::FileLength { expected, found: file_len });
    }
    let mut ranges: [Range<usize>; 12] = Default::default();
    for k in SectionKind::WRITE_ORDER {
        match slots[k.slot()].take() {
            Some((_, r)) => ranges[k.slot()] = r,
            None => return Err(FormatError::MissingSection { kind: k }),
        }
    }
    Ok(ranges)
}

/// R10: each array section's length follows from N, S, T, token_width and K.
fn check_section_lengths(header: &Header, ranges: &[Range<usize>; 12]) -> Result<(), FormatError> {
    let n = header.n_utterances;
    let blocks = n.div_ceil(u64::from(header.text_block_size));
    let overflow = |what| FormatError::LimitExceeded { what, value: u64::MAX, max: u64::MAX };
    let expect = [
        (SectionKind::NumSamples, n.checked_mul(4)),
        (SectionKind::PcmOffsets, n.checked_mul(8)),
        (SectionKind::TokenOffsets, n.checked_add(1).and_then(|v| v.checked_mul(8))),
        (SectionKind::Languages, n.checked_mul(2)),
        (SectionKind::Sources, n.checked_mul(2)),
        (SectionKind::AudioHashes, n.checked_mul(8)),
        (SectionKind::Tokens, header.n_tokens.checked_mul(u64::from(header.token_width))),
        (SectionKind::Pcm, header.n_samples.checked_mul(2)),
        (SectionKind::TextIndex, blocks.checked_mul(layout::TEXT_INDEX_ENTRY_BYTES as u64)),
    ];
    for (kind, want) in expect {
        let want = want.ok_or_else(|| overflow(kind.name()))?;
        let found = ranges[kind.slot()].len() as u64;
        if found != want {
            return Err(FormatError::SectionLength { kind, expected: want, found });
        }
    }
    for (kind, max) in [
        (SectionKind::Metadata, layout::MAX_METADATA_BYTES),
        (SectionKind::Tokenizer, layout::MAX_TOKENIZER_BYTES),
    ] {
        let len = ranges[kind.slot()].len() as u64;
        if len > max {
            return Err(FormatError::LimitExceeded { what: kind.name(), value: len, max });
        }
    }
    Ok(())
}

/// R11: the metadata's counts agree with the header.
fn check_metadata_against_header(
    meta: &Metadata,
    header: &Header,
    ranges: &[Range<usize>; 12],
) -> Result<(), FormatError> {
    let tokenizer_len = ranges[SectionKind::Tokenizer.slot()].len() as u64;
    for (name, found, expected) in [
        (
            "tokenizer.vocab_size",
            u64::from(meta.tokenizer.vocab_size),
            u64::from(header.vocab_size),
        ),
        ("tokenizer.model_bytes", meta.tokenizer.model_bytes, tokenizer_len),
        ("stats.utterances", meta.stats.utterances, header.n_utterances),
        ("stats.samples", meta.stats.samples, header.n_samples),
        ("stats.tokens", meta.stats.tokens, header.n_tokens),
    ] {
        if found != expected {
            return Err(FormatError::Metadata {
                message: format!("{name} is {found}, the header and section table say {expected}"),
            });
        }
    }
    Ok(())
}
