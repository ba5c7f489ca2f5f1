//! `asrt transcribe` as a library: audio files, directories, NeMo manifests or corpora in
//! (`input`), greedy TDT hypotheses with token, word and segment times out (`timestamps`).
//!
//! Items are read, decoded and resampled a group at a time (bounded memory whatever the
//! input's size), sorted by length within the group, decoded in batches of at most
//! `batch_seconds` of audio, and given back in input order. An item that cannot be read is
//! given back with its reason; the others go on.

pub mod input;
pub mod timestamps;

use std::path::PathBuf;

use asr_compiler::Resampler;
use asr_corpus::Corpus;
use burn::tensor::backend::Backend;
use serde_json::{Map, Value};

use crate::eval::{BatchDecoder, EvalError};
use crate::model::{ModelConfig, TdtModel};
use crate::tokenizer::Pieces;

pub use input::{items, Item};
pub use timestamps::{FrameTime, Span, Timestamps};

/// Why a transcription stopped (a bad file never stops it).
#[derive(Debug, thiserror::Error)]
pub enum TranscribeError {
    /// An input cannot be read at all (a missing directory, an unreadable manifest or corpus).
    #[error("{path}: {message}")]
    Input {
        /// The input.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Decoding failed on the device.
    #[error(transparent)]
    Decode(#[from] EvalError),
    /// The model cannot be loaded, or the tokenizer is not the one it was trained with.
    #[error(transparent)]
    Source(#[from] crate::model_source::ModelSourceError),
    /// The tokenizer is not a SentencePiece model.
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// A checkpoint carries no tokenizer and none was given.
    #[error("the model carries no tokenizer: give the one it was trained with (--tokenizer)")]
    NoTokenizer,
}

/// How items are transcribed.
#[derive(Debug, Clone, Copy)]
pub struct TranscribeOptions {
    /// Audio seconds per decoding batch.
    pub batch_seconds: f64,
    /// Longest item taken, in seconds.
    pub max_seconds: f64,
    /// Items read and decoded together (bounds memory).
    pub group: usize,
}

/// What the model heard in one item.
#[derive(Debug, Clone, PartialEq)]
pub struct Heard {
    /// Seconds of audio.
    pub duration: f64,
    /// The hypothesis text.
    pub text: String,
    /// Its token ids.
    pub tokens: Vec<u32>,
    /// Token, word and segment times.
    pub timestamps: Timestamps,
}

/// One item's outcome.
#[derive(Debug, Clone)]
pub struct Transcript {
    /// The item's name.
    pub name: String,
    /// The input's own fields (a manifest line).
    pub fields: Map<String, Value>,
    /// The reference, if the input has one.
    pub reference: Option<String>,
    /// What was heard, or why the item could not be read (reason, detail).
    pub result: Result<Heard, (String, String)>,
}

/// Transcribes `items` (with the `corpora` they name) in input order, calling `emit` for each.
#[allow(clippy::too_many_arguments)]
pub fn transcribe<B: Backend>(
    model: &TdtModel<B>,
    cfg: &ModelConfig,
    pieces: &Pieces,
    items: &[Item],
    corpora: &[Corpus],
    opts: &TranscribeOptions,
    device: &B::Device,
    emit: &mut dyn FnMut(Transcript),
) -> Result<(), TranscribeError> {
    crate::device_failure::watch();
    let mut resampler = Resampler::new();
    let time = FrameTime::of(cfg);
    let punctuation = timestamps::vocabulary_punctuation(pieces);
    let decoder = BatchDecoder::new(model, cfg, pieces.len(), device);
    for group in items.chunks(opts.group.max(1)) {
        let loaded: Vec<Result<Vec<i16>, (String, String)>> = group
            .iter()
            .map(|item| input::load(item, corpora, &mut resampler, opts.max_seconds))
            .collect();
        let mut order: Vec<usize> = (0..group.len()).filter(|&i| loaded[i].is_ok()).collect();
        let len = |i: usize| loaded[i].as_ref().map_or(0, Vec::len);
        order.sort_by_key(|&i| len(i));
        let mut heard: Vec<Option<Heard>> = vec![None; group.len()];
        let mut start = 0;
        while start < order.len() {
            let mut end = start + 1;
            while end < order.len()
                && (end + 1 - start) as f64 * len(order[end]) as f64 / 16_000.0
                    <= opts.batch_seconds
            {
                end += 1;
            }
            let batch = &order[start..end];
            let pcm: Vec<&[i16]> =
                batch.iter().map(|&i| loaded[i].as_deref().unwrap_or(&[])).collect();
            let hyps = decoder.decode(&pcm, opts.batch_seconds, device)?;
            for (&i, h) in batch.iter().zip(hyps) {
                let timestamps = timestamps::compute(&h, pieces, &punctuation, time);
                heard[i] = Some(Heard {
                    duration: len(i) as f64 / 16_000.0,
                    text: timestamps::text(&h, pieces, &punctuation),
                    tokens: h.tokens.iter().map(|&t| t as u32).collect(),
                    timestamps,
                });
            }
            start = end;
        }
        for ((item, l), h) in group.iter().zip(loaded).zip(heard) {
            let result = match (l, h) {
                (Err(e), _) => Err(e),
                (Ok(_), Some(h)) => Ok(h),
                (Ok(_), None) => Err(("internal".into(), "not decoded".into())),
            };
            emit(Transcript {
                name: item.name.clone(),
                fields: item.fields.clone(),
                reference: item.reference.clone(),
                result,
            });
        }
    }
    Ok(())
}
