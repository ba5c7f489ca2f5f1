//! Errors of reading and verifying a corpus. Each variant says where in the file the problem is
//! and what was expected; rule numbers (R1.., V1..) refer to SPEC.md section 8.

use std::path::PathBuf;

use crate::layout::SectionKind;

/// Why a corpus could not be opened or failed verification.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The file could not be opened, read or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The corpus path.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// R1: shorter than a header.
    #[error("file is {len} bytes, shorter than the 4096-byte header (truncated or not a corpus)")]
    TooSmall {
        /// File length.
        len: u64,
    },
    /// R2: not a corpus file.
    #[error("bad magic at byte 0: expected 89 41 53 52 43 0d 0a 1a, found {}", hex(found))]
    BadMagic {
        /// The first 8 bytes.
        found: [u8; 8],
    },
    /// R3: written by a big-endian writer, or byte-swapped.
    #[error("endian marker at byte 16 is {found:#010x}, expected 0x01020304 (not a little-endian corpus)")]
    WrongEndian {
        /// The marker as read.
        found: u32,
    },
    /// R3: this host is big-endian; the format is read without byte swapping.
    #[error(
        "this reader runs on a big-endian host; corpora are little-endian and are not byte-swapped"
    )]
    UnsupportedHost,
    /// R4: written for a reader newer than this one, or an invalid version pair.
    #[error(
        "unsupported format version {format_version} (needs a reader of version >= \
         {min_reader_version}; this reader supports {oldest}..={newest}); rebuild the corpus with \
         this version of asrc or upgrade the reader"
    )]
    UnsupportedVersion {
        /// `format_version` of the file.
        format_version: u32,
        /// `min_reader_version` of the file.
        min_reader_version: u32,
        /// Oldest version this reader supports.
        oldest: u32,
        /// Newest version this reader supports.
        newest: u32,
    },
    /// R4, R5, R9: a header field has a value the format does not allow.
    #[error("header field {field} at byte {offset}: expected {expected}, found {found}")]
    HeaderField {
        /// Field name as in SPEC.md.
        field: &'static str,
        /// Byte offset of the field.
        offset: usize,
        /// What the format allows.
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// R5: the header checksum does not match.
    #[error("header checksum mismatch: stored {stored:016x}, computed {computed:016x} (header bytes are corrupt)")]
    HeaderChecksum {
        /// Checksum stored at byte 120.
        stored: u64,
        /// Checksum of the header as read.
        computed: u64,
    },
    /// A value exceeds one of the hard limits of SPEC.md section 7.
    #[error("{what} is {value}, above the limit of {max}")]
    LimitExceeded {
        /// What was measured.
        what: &'static str,
        /// The value found.
        value: u64,
        /// The limit.
        max: u64,
    },
    /// R7: sections are not back to back, or the file length is wrong.
    #[error("section table entry {entry} ({kind}): offset {found}, expected {expected}")]
    SectionOffset {
        /// Entry index in the section table.
        entry: usize,
        /// Kind name or code.
        kind: String,
        /// Where the entry should start.
        expected: u64,
        /// Where it says it starts.
        found: u64,
    },
    /// R7: the file is longer or shorter than its section table says.
    #[error(
        "file is {found} bytes, the section table says {expected} (truncated or trailing bytes)"
    )]
    FileLength {
        /// Length implied by the section table.
        expected: u64,
        /// Actual length.
        found: u64,
    },
    /// R8: a section kind this reader does not know, not marked optional.
    #[error("section table entry {entry}: unknown required section kind {code}")]
    UnknownSection {
        /// Entry index.
        entry: usize,
        /// Kind code.
        code: u32,
    },
    /// R8: flags a section entry may not have (any flag on a kind this version defines, a flag
    /// other than OPTIONAL on an unknown kind).
    #[error("section table entry {entry} ({kind}): flags are {flags:#x}, expected {expected}")]
    SectionFlags {
        /// Entry index.
        entry: usize,
        /// Kind name or code.
        kind: String,
        /// Flags found.
        flags: u32,
        /// The flags the entry may have.
        expected: &'static str,
    },
    /// R8: a required section appears twice.
    #[error("section {kind} appears twice (table entries {first} and {second})")]
    DuplicateSection {
        /// Section kind.
        kind: SectionKind,
        /// First entry.
        first: usize,
        /// Second entry.
        second: usize,
    },
    /// R8: a required section is missing.
    #[error("required section {kind} is missing from the section table")]
    MissingSection {
        /// Section kind.
        kind: SectionKind,
    },
    /// R10: a section's length does not match N, S, T, token_width and K.
    #[error("section {kind} is {found} bytes, expected {expected}")]
    SectionLength {
        /// Section kind.
        kind: SectionKind,
        /// Length implied by the header.
        expected: u64,
        /// Length in the section table.
        found: u64,
    },
    /// R12, R13: a per-utterance or per-block array entry is invalid.
    #[error("{section}[{index}]: {message}")]
    Array {
        /// Section holding the entry.
        section: SectionKind,
        /// Entry index.
        index: u64,
        /// What is wrong, with expected and found values.
        message: String,
    },
    /// R11, V7, V8: the metadata JSON is malformed or disagrees with the header or the sections.
    #[error("METADATA: {message}")]
    Metadata {
        /// What is wrong.
        message: String,
    },
    /// V5: a text block does not decode or has the wrong layout.
    #[error("text block {block} (utterances {first}..): {message}")]
    TextBlock {
        /// Block index.
        block: u64,
        /// First utterance of the block.
        first: u64,
        /// What is wrong.
        message: String,
    },
    /// V1: a section's bytes do not match its checksum.
    #[error("section {kind} (bytes {offset}..{end}): checksum mismatch, stored {stored:016x}, computed {computed:016x}")]
    Checksum {
        /// Section kind name or code.
        kind: String,
        /// Section start.
        offset: u64,
        /// Section end.
        end: u64,
        /// Checksum in the section table.
        stored: u64,
        /// Checksum of the bytes.
        computed: u64,
    },
    /// V2: a padding byte is not zero.
    #[error("padding byte at offset {offset} is {value:#04x}, expected 0")]
    NonZeroPadding {
        /// Absolute byte offset.
        offset: u64,
        /// The byte found.
        value: u8,
    },
    /// V3: a token id is out of the vocabulary.
    #[error("utterance {utterance}: token {position} is {id}, expected < vocab_size {vocab_size}")]
    TokenOutOfRange {
        /// Utterance index.
        utterance: u64,
        /// Position within the utterance.
        position: u64,
        /// The id found.
        id: u32,
        /// The vocabulary size.
        vocab_size: u32,
    },
    /// V4: an utterance's audio does not match its hash.
    #[error("utterance {utterance}: audio hash stored {stored:016x}, computed {computed:016x} from its PCM")]
    AudioHash {
        /// Utterance index.
        utterance: u64,
        /// Hash in AUDIO_HASHES.
        stored: u64,
        /// Hash of the PCM.
        computed: u64,
    },
    /// V6: two utterances share a segment id.
    #[error("segment id {id:?} is used by utterances {first} and {second}")]
    DuplicateSegmentId {
        /// The repeated id.
        id: String,
        /// First utterance.
        first: u64,
        /// Second utterance.
        second: u64,
    },
    /// An in-memory buffer is not 8-byte aligned, so typed views cannot be made over it.
    #[error("buffer at address {address:#x} is not 8-byte aligned; use AlignedBuf")]
    Misaligned {
        /// The buffer's address.
        address: usize,
    },
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

impl FormatError {
    /// Whether the error is about the file's contents (exit code 1 for `asrc validate`) rather than
    /// about reading it at all (exit code 2).
    pub fn is_invalid_data(&self) -> bool {
        !matches!(self, FormatError::Io { .. } | FormatError::UnsupportedHost)
    }
}
