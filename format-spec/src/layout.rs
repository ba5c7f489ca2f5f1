//! Byte layout of a corpus file: every constant, offset and size that SPEC.md names.
//!
//! This module is the only place in the workspace that knows byte positions. The tables in
//! `SPEC.md` are checked against these constants by `tests/it/spec_sync.rs`.

use crate::error::FormatError;

/// First 8 bytes of every corpus file. The high first byte and CR LF catch 7-bit and text-mode
/// mangling, as PNG's signature does.
pub const MAGIC: [u8; 8] = *b"\x89ASRC\r\n\x1a";
/// Version this crate writes. Bump it, with SPEC.md's version history and a new golden file,
/// whenever the writer's bytes change for the same input.
pub const FORMAT_VERSION: u32 = 1;
/// Oldest `min_reader_version` this reader understands.
pub const OLDEST_READABLE_VERSION: u32 = 1;
/// The `min_reader_version` this crate writes: a reader must support at least this version.
pub const MIN_READER_VERSION: u32 = 1;
/// Written as a little-endian `u32`; reads back as this value only on a little-endian reader.
pub const ENDIAN_MARKER: u32 = 0x0102_0304;
/// Size of the header, which is also the offset of the first section.
pub const HEADER_SIZE: u64 = 4096;
/// Every section starts at a multiple of this, so each can be mapped and `madvise`d on its own
/// and every array element is naturally aligned.
pub const SECTION_ALIGN: u64 = 4096;
/// Sample rate of every PCM sample in a corpus.
pub const SAMPLE_RATE: u32 = 16_000;
/// Size of the fixed header fields before the section table.
pub const FIXED_HEADER_BYTES: usize = 128;
/// Size of one section table entry.
pub const SECTION_ENTRY_BYTES: usize = 32;
/// Size of one TEXT_INDEX entry.
pub const TEXT_INDEX_ENTRY_BYTES: usize = 16;
/// Largest vocabulary whose ids are stored as `u16`.
pub const MAX_U16_VOCAB: u32 = 65_536;

/// Section entry flag: a reader that does not know the kind may skip the section.
pub const FLAG_OPTIONAL: u32 = 1;

/// Most sections a header can list (the table must fit in the 4096-byte header).
pub const MAX_SECTIONS: u32 = 124;
/// Most utterances in one corpus: utterance indices fit in a `u32`.
pub const MAX_UTTERANCES: u64 = u32::MAX as u64;
/// Longest utterance, in samples: 10 minutes at 16 kHz. Training segments are far shorter; the
/// limit bounds what a corrupt length can make a reader copy.
pub const MAX_UTTERANCE_SAMPLES: u32 = 9_600_000;
/// Most tokens in one utterance: far above the compiler's default truncation of 512.
pub const MAX_TOKENS_PER_UTTERANCE: u64 = 16_384;
/// Largest METADATA section: it is parsed as JSON when a corpus is opened.
pub const MAX_METADATA_BYTES: u64 = 16 * 1024 * 1024;
/// Largest TOKENIZER section: SentencePiece models are a few MB.
pub const MAX_TOKENIZER_BYTES: u64 = 256 * 1024 * 1024;
/// Most utterances in one text block: bounds one block's offset table.
pub const MAX_TEXT_BLOCK_UTTERANCES: u32 = 65_536;
/// Largest decompressed text block: bounds the memory a reader allocates for one block.
pub const MAX_TEXT_BLOCK_RAW_BYTES: u32 = 64 * 1024 * 1024;
/// Longest segment id, in bytes.
pub const MAX_SEGMENT_ID_BYTES: usize = 1024;
/// Longest transcript, in bytes.
pub const MAX_TEXT_BYTES: usize = 65_536;
/// Deepest nesting of arrays and objects in the METADATA JSON, the top-level object counting as
/// depth 1. It is serde_json's default recursion limit, applied to the whole document (members
/// a reader ignores included), and bounds the stack a recursive JSON parser needs.
pub const MAX_JSON_DEPTH: usize = 127;

/// First 4 bytes of a zstd frame (RFC 8878 section 3.1.1), which every text block starts with.
/// Skippable frames (`50..5F 2A 4D 18`) and legacy formats have other magic numbers.
pub const ZSTD_FRAME_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Header field offsets (SPEC.md section 4).
pub mod header_offset {
    /// `format_version` (u32).
    pub const FORMAT_VERSION: usize = 8;
    /// `min_reader_version` (u32).
    pub const MIN_READER_VERSION: usize = 12;
    /// `endian_marker` (u32).
    pub const ENDIAN_MARKER: usize = 16;
    /// `header_size` (u32).
    pub const HEADER_SIZE: usize = 20;
    /// `section_align` (u32).
    pub const SECTION_ALIGN: usize = 24;
    /// `section_count` (u32).
    pub const SECTION_COUNT: usize = 28;
    /// `n_utterances` (u64).
    pub const N_UTTERANCES: usize = 32;
    /// `n_samples` (u64).
    pub const N_SAMPLES: usize = 40;
    /// `n_tokens` (u64).
    pub const N_TOKENS: usize = 48;
    /// `sample_rate` (u32).
    pub const SAMPLE_RATE: usize = 56;
    /// `token_width` (u32).
    pub const TOKEN_WIDTH: usize = 60;
    /// `vocab_size` (u32).
    pub const VOCAB_SIZE: usize = 64;
    /// `text_block_size` (u32).
    pub const TEXT_BLOCK_SIZE: usize = 68;
    /// First reserved byte.
    pub const RESERVED: usize = 72;
    /// `header_checksum` (u64).
    pub const HEADER_CHECKSUM: usize = 120;
    /// First section table entry.
    pub const SECTION_TABLE: usize = 128;
}

/// `align_up(x)` of SPEC.md: the next multiple of [`SECTION_ALIGN`], or `None` on overflow.
pub fn align_up(x: u64) -> Option<u64> {
    x.checked_add(SECTION_ALIGN - 1).map(|v| v / SECTION_ALIGN * SECTION_ALIGN)
}

/// Section kinds of format version 1 (SPEC.md section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SectionKind {
    /// JSON tables and statistics.
    Metadata,
    /// The tokenizer model, byte for byte.
    Tokenizer,
    /// `u32` samples per utterance.
    NumSamples,
    /// `u64` first sample of each utterance.
    PcmOffsets,
    /// `u64` token offsets, N + 1 entries.
    TokenOffsets,
    /// `u16` language id per utterance.
    Languages,
    /// `u16` source id per utterance.
    Sources,
    /// `u64` xxh3 of each utterance's PCM.
    AudioHashes,
    /// Token ids, `u16` or `u32`.
    Tokens,
    /// `i16` PCM of all utterances.
    Pcm,
    /// 16-byte entries locating each text block.
    TextIndex,
    /// zstd frames of segment ids and transcripts.
    TextBlocks,
}

impl SectionKind {
    /// Every kind, in the order this crate's writer places them in a file.
    pub const WRITE_ORDER: [SectionKind; 12] = [
        SectionKind::Pcm,
        SectionKind::NumSamples,
        SectionKind::PcmOffsets,
        SectionKind::TokenOffsets,
        SectionKind::Languages,
        SectionKind::Sources,
        SectionKind::AudioHashes,
        SectionKind::Tokens,
        SectionKind::TextIndex,
        SectionKind::TextBlocks,
        SectionKind::Tokenizer,
        SectionKind::Metadata,
    ];

    /// The kind's code in the section table.
    pub const fn code(self) -> u32 {
        match self {
            SectionKind::Metadata => 1,
            SectionKind::Tokenizer => 2,
            SectionKind::NumSamples => 3,
            SectionKind::PcmOffsets => 4,
            SectionKind::TokenOffsets => 5,
            SectionKind::Languages => 6,
            SectionKind::Sources => 7,
            SectionKind::AudioHashes => 8,
            SectionKind::Tokens => 9,
            SectionKind::Pcm => 10,
            SectionKind::TextIndex => 11,
            SectionKind::TextBlocks => 12,
        }
    }

    /// The kind with this code, if version 1 defines one.
    pub fn from_code(code: u32) -> Option<SectionKind> {
        SectionKind::WRITE_ORDER.into_iter().find(|k| k.code() == code)
    }

    /// The name SPEC.md uses.
    pub const fn name(self) -> &'static str {
        match self {
            SectionKind::Metadata => "METADATA",
            SectionKind::Tokenizer => "TOKENIZER",
            SectionKind::NumSamples => "NUM_SAMPLES",
            SectionKind::PcmOffsets => "PCM_OFFSETS",
            SectionKind::TokenOffsets => "TOKEN_OFFSETS",
            SectionKind::Languages => "LANGUAGES",
            SectionKind::Sources => "SOURCES",
            SectionKind::AudioHashes => "AUDIO_HASHES",
            SectionKind::Tokens => "TOKENS",
            SectionKind::Pcm => "PCM",
            SectionKind::TextIndex => "TEXT_INDEX",
            SectionKind::TextBlocks => "TEXT_BLOCKS",
        }
    }

    /// Position of this kind in a dense per-kind table.
    pub(crate) fn slot(self) -> usize {
        self.code() as usize - 1
    }
}

impl std::fmt::Display for SectionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One section table entry (SPEC.md section 5), decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionEntry {
    /// Raw kind code (may be unknown to this reader if the entry is optional).
    pub kind: u32,
    /// Flags; only [`FLAG_OPTIONAL`] is defined.
    pub flags: u32,
    /// Absolute byte offset.
    pub offset: u64,
    /// Length in bytes, padding excluded.
    pub length: u64,
    /// xxh3 of the section's bytes.
    pub checksum: u64,
}

impl SectionEntry {
    /// Encodes the entry as its 32 table bytes.
    pub fn to_bytes(&self) -> [u8; SECTION_ENTRY_BYTES] {
        let mut b = [0u8; SECTION_ENTRY_BYTES];
        b[0..4].copy_from_slice(&self.kind.to_le_bytes());
        b[4..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.length.to_le_bytes());
        b[24..32].copy_from_slice(&self.checksum.to_le_bytes());
        b
    }

    /// Decodes an entry from its 32 table bytes.
    pub fn from_bytes(b: &[u8; SECTION_ENTRY_BYTES]) -> SectionEntry {
        SectionEntry {
            kind: le_u32(b, 0),
            flags: le_u32(b, 4),
            offset: le_u64(b, 8),
            length: le_u64(b, 16),
            checksum: le_u64(b, 24),
        }
    }
}

/// The fixed header fields (SPEC.md section 4), decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Version the file is written in.
    pub format_version: u32,
    /// Oldest reader version that can read the file.
    pub min_reader_version: u32,
    /// Number of utterances, N.
    pub n_utterances: u64,
    /// Total PCM samples, S.
    pub n_samples: u64,
    /// Total tokens, T.
    pub n_tokens: u64,
    /// Sample rate; always [`SAMPLE_RATE`].
    pub sample_rate: u32,
    /// Bytes per token id: 2 or 4.
    pub token_width: u32,
    /// Every token id is below this.
    pub vocab_size: u32,
    /// Utterances per text block, K.
    pub text_block_size: u32,
    /// The section table, in table order.
    pub sections: Vec<SectionEntry>,
}

impl Header {
    /// The token width SPEC.md requires for a vocabulary size.
    pub fn token_width_for(vocab_size: u32) -> u32 {
        if vocab_size <= MAX_U16_VOCAB {
            2
        } else {
            4
        }
    }

    /// Encodes the header as its 4096 bytes, checksum included.
    ///
    /// Fails only if the section table does not fit, which the writer never produces.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        if self.sections.len() > MAX_SECTIONS as usize {
            return Err(FormatError::LimitExceeded {
                what: "section_count",
                value: self.sections.len() as u64,
                max: MAX_SECTIONS as u64,
            });
        }
        use header_offset as o;
        let mut b = vec![0u8; HEADER_SIZE as usize];
        b[0..8].copy_from_slice(&MAGIC);
        put_u32(&mut b, o::FORMAT_VERSION, self.format_version);
        put_u32(&mut b, o::MIN_READER_VERSION, self.min_reader_version);
        put_u32(&mut b, o::ENDIAN_MARKER, ENDIAN_MARKER);
        put_u32(&mut b, o::HEADER_SIZE, HEADER_SIZE as u32);
        put_u32(&mut b, o::SECTION_ALIGN, SECTION_ALIGN as u32);
        put_u32(&mut b, o::SECTION_COUNT, self.sections.len() as u32);
        put_u64(&mut b, o::N_UTTERANCES, self.n_utterances);
        put_u64(&mut b, o::N_SAMPLES, self.n_samples);
        put_u64(&mut b, o::N_TOKENS, self.n_tokens);
        put_u32(&mut b, o::SAMPLE_RATE, self.sample_rate);
        put_u32(&mut b, o::TOKEN_WIDTH, self.token_width);
        put_u32(&mut b, o::VOCAB_SIZE, self.vocab_size);
        put_u32(&mut b, o::TEXT_BLOCK_SIZE, self.text_block_size);
        for (i, s) in self.sections.iter().enumerate() {
            let at = o::SECTION_TABLE + i * SECTION_ENTRY_BYTES;
            b[at..at + SECTION_ENTRY_BYTES].copy_from_slice(&s.to_bytes());
        }
        let sum = header_checksum(&b);
        put_u64(&mut b, o::HEADER_CHECKSUM, sum);
        Ok(b)
    }
}

/// The header checksum: xxh3 of the 4096 header bytes with the checksum field read as zero.
pub fn header_checksum(header: &[u8]) -> u64 {
    use header_offset::HEADER_CHECKSUM as C;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&header[..C]);
    h.update(&[0u8; 8]);
    h.update(&header[C + 8..]);
    h.digest()
}

/// One TEXT_INDEX entry (SPEC.md section 6.5), decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextIndexEntry {
    /// Byte offset of the block's zstd frame inside TEXT_BLOCKS.
    pub offset: u64,
    /// Bytes of the zstd frame.
    pub compressed_len: u32,
    /// Bytes after decompression.
    pub raw_len: u32,
}

impl TextIndexEntry {
    /// Encodes the entry as its 16 bytes.
    pub fn to_bytes(&self) -> [u8; TEXT_INDEX_ENTRY_BYTES] {
        let mut b = [0u8; TEXT_INDEX_ENTRY_BYTES];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.compressed_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.raw_len.to_le_bytes());
        b
    }

    /// Decodes an entry from its 16 bytes.
    pub fn from_bytes(b: &[u8]) -> TextIndexEntry {
        TextIndexEntry {
            offset: le_u64(b, 0),
            compressed_len: le_u32(b, 8),
            raw_len: le_u32(b, 12),
        }
    }
}

/// Reads a little-endian `u32` at `at`; the caller guarantees `at + 4 <= b.len()`.
pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// Reads a little-endian `u64` at `at`; the caller guarantees `at + 8 <= b.len()`.
pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_codes_roundtrip_and_only_known_codes_parse() {
        for k in SectionKind::WRITE_ORDER {
            assert_eq!(SectionKind::from_code(k.code()), Some(k));
        }
        let known: Vec<u32> = (0..100).filter(|c| SectionKind::from_code(*c).is_some()).collect();
        assert_eq!(known, (1..=12).collect::<Vec<_>>());
    }

    #[test]
    fn section_table_fits_in_header() {
        let end = FIXED_HEADER_BYTES + MAX_SECTIONS as usize * SECTION_ENTRY_BYTES;
        assert!(end <= HEADER_SIZE as usize);
        assert!(
            end + SECTION_ENTRY_BYTES > HEADER_SIZE as usize,
            "MAX_SECTIONS is the most that fit"
        );
    }

    #[test]
    fn align_up_rounds_to_pages() {
        assert_eq!(align_up(0), Some(0));
        assert_eq!(align_up(1), Some(4096));
        assert_eq!(align_up(4096), Some(4096));
        assert_eq!(align_up(4097), Some(8192));
        assert_eq!(align_up(u64::MAX), None);
    }

    #[test]
    fn token_width_follows_vocab() {
        assert_eq!(Header::token_width_for(1), 2);
        assert_eq!(Header::token_width_for(65_536), 2);
        assert_eq!(Header::token_width_for(65_537), 4);
    }
}
