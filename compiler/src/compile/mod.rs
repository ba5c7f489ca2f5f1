//! `asrc compile`: a manifest (or the raw shard tables) to one corpus file.
//!
//! The input is read in chunks of rows (`source.rs`). Each chunk goes through three stages:
//!
//! 1. **Rows** (`rows.rs`, one thread, input order): null checks, row and segment-id
//!    deduplication, the duration and quality filters, text cleaning, language normalisation
//!    and retagging. Cheap, and deduplication needs the order.
//! 2. **Audio and tokens** (`audio.rs`, rayon, `--jobs` threads): read and decode the FLAC,
//!    downmix, resample to 16 kHz, convert to 16-bit, hash the PCM, tokenize. Results come back
//!    in input order.
//! 3. **Write** (`pipeline.rs`, one thread, input order): audio deduplication, duration check,
//!    append to the corpus writer, report entries (`report.rs`).
//!
//! `pipeline.rs` drives them, running stage 2 of a chunk while stage 3 writes the previous one.
//! Memory is bounded by one chunk of decoded audio plus a few dozen bytes per row for the
//! deduplication tables; the corpus itself streams to disk. The output depends only on the input
//! and the options that change content (`options.rs`; not on `--jobs` or the chunk size): same
//! input, same bytes.

mod audio;
mod options;
mod pipeline;
pub mod report;
mod rows;
mod source;

use std::path::PathBuf;

use asr_corpus::WriteError;

use crate::manifest::ManifestError;
use crate::tokenize::TokenizeError;

pub use options::{report_paths, CompileOptions, Input};
pub use pipeline::{compile, Progress};

/// Why a compile stopped (a bad row never stops it).
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The input cannot be read or has the wrong schema.
    #[error(transparent)]
    Input(#[from] ManifestError),
    /// A dataset input (NeMo, WebDataset, Kaldi) cannot be read.
    #[error(transparent)]
    Dataset(#[from] crate::inputs::InputError),
    /// The tokenizer cannot be loaded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizeError),
    /// The corpus cannot be written.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// A directory for the outputs cannot be created.
    #[error("creating directory {path}: {source}")]
    OutputDir {
        /// The directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
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
