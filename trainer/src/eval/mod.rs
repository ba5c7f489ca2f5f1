//! Evaluation: greedy TDT decoding of a corpus with a trained model, word and character error
//! rates per language. Hypothesis ids become text through the corpus's own SentencePiece model.

pub mod error_rates;

use std::collections::BTreeMap;

use asr_corpus::Corpus;
use burn::prelude::*;
use serde::Serialize;

use crate::device_failure::DeviceFailure;
use crate::model::greedy::BurnGreedy;
use crate::model::mel::MelFrontend;
use crate::model::{ModelConfig, TdtModel};
use crate::model_source::{Expected, ModelSource, ModelSourceError, TokenizerId};
use crate::tokenizer::{Pieces, TokenizerError};
use asr_tdt::greedy::{greedy_batch, GreedyOptions, Hypothesis};
pub use error_rates::{edit_distance, ErrorRates};

/// Why an evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The device failed while decoding a batch.
    #[error(
        "decoding a batch of {utterances} utterances (the longest {longest_seconds:.2} s, \
         {batch_seconds} s per batch): {failure}{}",
        if matches!(failure, DeviceFailure::OutOfMemory { .. }) {
            "; decode in smaller batches (asrt eval --batch-seconds)"
        } else {
            ""
        }
    )]
    Device {
        /// Utterances in the batch.
        utterances: usize,
        /// Its longest utterance, in seconds.
        longest_seconds: f64,
        /// The batch size in audio seconds.
        batch_seconds: f64,
        /// What the device reported.
        failure: DeviceFailure,
    },
    /// The corpus's tokenizer cannot detokenize.
    #[error("{0}")]
    Tokenizer(#[from] TokenizerError),
    /// The checkpoint could not be read.
    /// An utterance's reference text could not be read.
    #[error("utterance {index}: reading its text: {source}")]
    Text {
        /// Corpus index.
        index: usize,
        /// Why.
        source: asr_corpus::FormatError,
    },
    /// No device to decode on.
    #[error("no device to decode on")]
    NoDevice,
    /// The model could not be read, or its tokenizer is not the corpus's.
    #[error(transparent)]
    Source(#[from] ModelSourceError),
}

/// One decoded utterance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decoded {
    /// Corpus index.
    pub index: usize,
    /// Language.
    pub language: String,
    /// Reference text.
    pub reference: String,
    /// Hypothesis text.
    pub hypothesis: String,
    /// Hypothesis token ids (the tokenizer's ids; the blank is not among them).
    pub tokens: Vec<u32>,
}

/// Evaluation results.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Evaluation {
    /// Per language.
    pub languages: BTreeMap<String, ErrorRates>,
    /// All utterances.
    pub overall: ErrorRates,
    /// Every utterance's texts.
    pub utterances: Vec<Decoded>,
}

impl Evaluation {
    /// WER and CER, overall and per language, as the training metrics record them.
    pub fn summary(&self) -> serde_json::Value {
        let languages: serde_json::Map<String, serde_json::Value> = self
            .languages
            .iter()
            .map(|(l, r)| (l.clone(), serde_json::json!({"wer": r.wer, "cer": r.cer})))
            .collect();
        serde_json::json!({
            "utterances": self.overall.utterances,
            "wer": self.overall.wer,
            "cer": self.overall.cer,
            "languages": languages,
        })
    }
}

/// Greedy decoding of batches of 16 kHz utterances with one model: the front end, encoder and
/// greedy TDT search that `asrt eval` and `asrt transcribe` share.
pub struct BatchDecoder<'a, B: Backend> {
    model: &'a TdtModel<B>,
    cfg: &'a ModelConfig,
    frontend: MelFrontend<B>,
    opts: GreedyOptions,
}

impl<'a, B: Backend> BatchDecoder<'a, B> {
    /// A decoder for a model whose tokenizer has `vocab` pieces (the blank is `vocab`).
    pub fn new(
        model: &'a TdtModel<B>,
        cfg: &'a ModelConfig,
        vocab: usize,
        device: &B::Device,
    ) -> Self {
        let frontend = MelFrontend::<B>::new(&cfg.preprocessor, device);
        let opts = GreedyOptions {
            vocab: vocab + 1,
            durations: cfg.durations.clone(),
            max_symbols: cfg.max_symbols,
        };
        BatchDecoder { model, cfg, frontend, opts }
    }

    /// The hypotheses of `pcm` (one row per utterance), decoded as one padded batch;
    /// `batch_seconds` is named in the error of a device failure.
    pub fn decode(
        &self,
        pcm: &[&[i16]],
        batch_seconds: f64,
        device: &B::Device,
    ) -> Result<Vec<Hypothesis>, EvalError> {
        let lens: Vec<u32> = pcm.iter().map(|x| x.len() as u32).collect();
        let max = lens.iter().copied().max().unwrap_or(0) as usize;
        let mut padded = vec![0i16; pcm.len() * max];
        for (row, x) in padded.chunks_exact_mut(max.max(1)).zip(pcm) {
            row[..x.len()].copy_from_slice(x);
        }
        let named = |failure| EvalError::Device {
            utterances: pcm.len(),
            longest_seconds: max as f64 / f64::from(self.cfg.preprocessor.sample_rate),
            batch_seconds,
            failure,
        };
        // Greedy decoding reads arg-maxes back every step: after a failed allocation that
        // read, or the next launch, can panic on this thread; `contain` makes it the failure.
        let hyps = crate::device_failure::contain(|| {
            let (feats, frame_lens) =
                self.frontend.forward(&padded, pcm.len(), &lens, None, device);
            let (enc, enc_lens) = self.model.encode(self.cfg, feats, &frame_lens);
            let proj = self.model.joint.project_encoder(enc);
            let mut dec = BurnGreedy::new(self.model, proj, device);
            greedy_batch(&mut dec, &enc_lens, &self.opts)
        })
        .map_err(named)?;
        // A failed allocation leaves garbage behind without telling the caller.
        crate::device_failure::check::<B>(device).map_err(named)?;
        Ok(hyps)
    }
}

/// Decodes `indices` of `corpus` in batches of at most `batch_seconds` of audio.
pub fn evaluate<B: Backend>(
    model: &TdtModel<B>,
    cfg: &ModelConfig,
    corpus: &Corpus,
    indices: &[usize],
    batch_seconds: f64,
    device: &B::Device,
) -> Result<Evaluation, EvalError> {
    crate::device_failure::watch();
    let pieces = Pieces::parse(corpus.tokenizer_model())?;
    let vocab = corpus.metadata().tokenizer.vocab_size as usize;
    let decoder = BatchDecoder::new(model, cfg, vocab, device);
    let mut order = indices.to_vec();
    order.sort_by_key(|&i| corpus.num_samples()[i]);
    let mut out = Evaluation::default();
    let rate = f64::from(corpus.header().sample_rate);
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len()
            && (end + 1 - start) as f64 * f64::from(corpus.num_samples()[order[end]]) / rate
                <= batch_seconds
        {
            end += 1;
        }
        let batch = &order[start..end];
        let pcm: Vec<&[i16]> = batch.iter().map(|&i| corpus.pcm(i)).collect();
        let hyps = decoder.decode(&pcm, batch_seconds, device)?;
        for (&i, h) in batch.iter().zip(hyps) {
            let reference =
                corpus.text(i).map_err(|source| EvalError::Text { index: i, source })?.1;
            let hypothesis = pieces.decode(&h.tokens);
            let language = corpus.language_code(i).to_owned();
            out.languages.entry(language.clone()).or_default().add(&reference, &hypothesis);
            out.overall.add(&reference, &hypothesis);
            let tokens = h.tokens.iter().map(|&t| t as u32).collect();
            out.utterances.push(Decoded { index: i, language, reference, hypothesis, tokens });
        }
        start = end;
    }
    out.utterances.sort_by_key(|d| d.index);
    Ok(out)
}

/// Decodes the first `limit` utterances of `corpus` (all with `None`) with a model on `device`,
/// after checking that the corpus was compiled with the model's tokenizer.
pub fn evaluate_source<B: Backend>(
    source: &ModelSource,
    corpus: &Corpus,
    limit: Option<usize>,
    batch_seconds: f64,
    device: &B::Device,
) -> Result<Evaluation, EvalError> {
    let want = TokenizerId::of_corpus(corpus);
    let loaded = source.load::<B>(Some((&want, Expected::Corpus)), false, device)?;
    let n = limit.unwrap_or(corpus.len()).min(corpus.len());
    let indices: Vec<usize> = (0..n).collect();
    evaluate(&loaded.model, &loaded.info.model, corpus, &indices, batch_seconds, device)
}
