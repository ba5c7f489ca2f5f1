//! Reads, writes and verifies ASR corpus files (format version 1, specified in `SPEC.md` beside
//! this crate).
//!
//! A corpus is one memory-mappable file holding 16 kHz PCM, token ids, language and source ids,
//! audio hashes and compressed transcripts for N utterances, plus the tables and tokenizer model
//! that interpret them.
//!
//! - [`CorpusWriter`] streams utterances into a new file, deterministically and atomically.
//! - [`Corpus::open`] maps a file and checks its structure once (cheap), after which access by
//!   index cannot fail; [`Corpus::verify`] checks every byte (checksums, hashes, text blocks).
//!
//! ```
//! use asr_corpus::{Corpus, CorpusWriter, UtteranceIn, WriterOptions};
//!
//! let mut w = CorpusWriter::in_memory(WriterOptions::new(100, "none", Vec::new())).unwrap();
//! w.push(&UtteranceIn {
//!     segment_id: "utt-1",
//!     text: "hello",
//!     language: "en",
//!     source: "demo",
//!     pcm: &[0, 1, -1, 2],
//!     tokens: &[5, 7],
//! })
//! .unwrap();
//! let bytes = w.finish().unwrap().data.unwrap();
//! let corpus = Corpus::from_bytes(&bytes).unwrap();
//! assert_eq!(corpus.pcm(0), &[0, 1, -1, 2]);
//! assert_eq!(corpus.tokens(0).to_vec(), vec![5, 7]);
//! assert_eq!(corpus.text(0).unwrap(), ("utt-1".to_string(), "hello".to_string()));
//! corpus.verify().unwrap();
//! ```
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod error;
pub mod layout;
pub mod meta;
mod read;
#[allow(unsafe_code)] // The memory map; see the SAFETY comment in `storage.rs`.
mod storage;
pub mod synth;
pub mod text;
mod verify;
mod write;

pub use error::FormatError;
pub use layout::SectionKind;
pub use meta::{LanguageStats, Metadata, Stats, TokenizerInfo};
pub use read::{Corpus, TokenSlice, Utterance};
pub use storage::AlignedBuf;
pub use text::{TextBlock, TextRecord};
pub use verify::{SectionSummary, VerifyReport};
pub use write::{CorpusWriter, UtteranceIn, WriteError, WriterOptions, Written};

/// The content hash of decoded audio stored in AUDIO_HASHES: xxh3-64 of the samples as
/// little-endian bytes. Two utterances with the same samples have the same hash whatever file
/// they were decoded from.
pub fn audio_hash(pcm: &[i16]) -> u64 {
    // Corpora are only read and written on little-endian hosts (SPEC.md R3), where the in-memory
    // bytes of `pcm` are its little-endian encoding.
    xxhash_rust::xxh3::xxh3_64(bytemuck::cast_slice(pcm))
}
