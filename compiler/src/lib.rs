//! `asrc`: compiles an ASR training manifest into one memory-mappable corpus file, and
//! validates corpora. The binary in `main.rs` is a thin shell over [`run`].
//!
//! The library's surface:
//!
//! - the command line: [`Cli`] and [`run`];
//! - compiling: [`compile`] with its [`CompileOptions`], returning the report's [`Summary`];
//! - the stages' building blocks, each tested on its own: transcript cleaning, language labels,
//!   the manifest reader, FLAC decoding, resampling, tokenization.
// Only `audio::libflac` may use `unsafe` (libFLAC's C API), and says why at each use.
#![deny(unsafe_code)]

mod audio;
mod cli;
mod commands;
mod compile;
mod dedup;
pub mod inputs;
mod lang;
mod manifest;
mod merge;
mod output;
mod reason;
mod records;
mod retokenize;
mod shards;
mod text;
mod tokenize;

// The command line: parse a [`Cli`] (with `clap::Parser`) and [`run`] it.
pub use cli::Cli;
pub use commands::run;

// Compiling a manifest or raw shards into a corpus, and its report.
pub use compile::report::{StageSeconds, Summary};
pub use compile::{compile, report_paths, CompileError, CompileOptions, Input, Progress};
pub use reason::{Kind, Reason};

// Transcript cleaning and `<|lang|>` tags.
pub use text::{clean as clean_transcript, strip_language_tag, with_language_tag};

// Language codes, scripts and retagging decisions.
pub use lang::{
    decide as decide_language, dominant_script, normalize as normalize_language,
    Code as LanguageCode, Decision, Method, Script,
};

// The training-ready manifest, read in chunks of rows.
pub use manifest::{ManifestError, ManifestReader, ManifestRow};

// Audio decoding (FLAC, WAV, MP3, Ogg Vorbis, Ogg Opus, AAC) and downmix, segments, conversion to
// 16-bit.
pub use audio::decode::{
    codec_of, decode, decode_file, decode_file_with, decode_pcm, decode_pcm_with, decode_stream,
    decode_with, downmix, md5_of, to_i16, Codec, DecodeOptions, Decoded, Decoder, Pcm, Reject,
    Stream, StreamSamples, MAX_SECONDS,
};
pub use audio::segment::{Segment, END_SLACK};

// Resampling to the corpus rate.
pub use audio::resample::{ResampleError, Resampler, TARGET_RATE};

// Joining the parts of a compile (`--part I/N`).
pub use merge::{merge, MergeError, MergeSummary};

// Re-tokenizing a corpus without touching its audio.
pub use retokenize::{retokenize, RetokenizeError, RetokenizeOptions, RetokenizeSummary};

// SentencePiece tokenization and the `<|lang|>` prefix policy.
pub use tokenize::{Encoded, LangPrefix, TokenizeError, Tokenizer};
