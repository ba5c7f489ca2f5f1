//! Stage 2, audio and tokens (rayon, `--jobs` threads): read and decode one row's FLAC,
//! downmix, resample to 16 kHz, convert to 16-bit, hash the PCM, tokenize the text. Rows are
//! independent here; results come back in input order.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::audio::decode::{decode_file_with, to_i16, Decoder, Reject};
use crate::audio::resample::Resampler;
use crate::tokenize::{LangPrefix, Tokenizer};

use super::report::{Entry, Reason};
use super::rows::Ready;

/// Stage 2's result for a row.
pub(super) struct Audio {
    /// 16 kHz mono 16-bit samples.
    pub(super) pcm: Vec<i16>,
    /// xxh3-64 of `pcm`, as the corpus stores it.
    pub(super) hash: u64,
    /// Duration of the decoded file at its own rate.
    pub(super) source_seconds: f64,
    /// Token ids, cut at the limit.
    pub(super) tokens: Vec<u32>,
    /// Whether the token sequence was cut.
    pub(super) truncated: bool,
}

/// One row's outcome: its audio and tokens, or its drop entry; and the time each step took.
pub(super) type Outcome = (Result<Audio, Box<Entry>>, Timings);

/// Time one row spent in each stage-2 step.
#[derive(Default, Clone, Copy)]
pub(super) struct Timings {
    pub(super) decode: Duration,
    pub(super) resample: Duration,
    pub(super) tokenize: Duration,
    pub(super) hash: Duration,
}

thread_local! {
    // One resampler per worker thread: it caches one FFT plan per input rate.
    static RESAMPLER: RefCell<Resampler> = RefCell::new(Resampler::new());
}

/// Stage 2's settings, shared by the worker threads.
#[derive(Clone, Copy)]
pub(super) struct AudioStage<'a> {
    pub(super) tokenizer: &'a Tokenizer,
    pub(super) prefix: LangPrefix,
    pub(super) max_tokens: usize,
    pub(super) decoder: Decoder,
    pub(super) verify_md5: bool,
}

impl AudioStage<'_> {
    /// Stage 2 for a chunk on `pool`, results in the order of `ready`.
    pub(super) fn chunk(&self, pool: &rayon::ThreadPool, ready: &[Ready]) -> Vec<Outcome> {
        pool.install(|| ready.par_iter().map(|r| self.row(r)).collect())
    }

    /// Stage 2 for one row: decode, resample, hash, tokenize.
    fn row(&self, ready: &Ready) -> Outcome {
        let mut timings = Timings::default();
        let audio = self.process(ready, &mut timings);
        (audio, timings)
    }

    fn process(&self, ready: &Ready, timings: &mut Timings) -> Result<Audio, Box<Entry>> {
        let reject = |reason: Reason, detail: String| {
            let mut e = Entry::new(&ready.row, reason, detail);
            e.file = Some(ready.audio.clone());
            Box::new(e)
        };
        let t = Instant::now();
        let decoded = decode_file_with(&ready.audio, self.decoder, self.verify_md5)
            .map_err(|r: Reject| reject(r.reason(), r.detail().to_owned()))?;
        timings.decode += t.elapsed();
        let t = Instant::now();
        let source_seconds = decoded.samples.len() as f64 / f64::from(decoded.rate.max(1));
        let resampled = RESAMPLER
            .with(|r| r.borrow_mut().to_target(&decoded.samples, decoded.rate))
            .map_err(|e| reject(Reason::UnsupportedAudio, e.to_string()))?;
        drop(decoded);
        let pcm = to_i16(&resampled);
        drop(resampled);
        timings.resample += t.elapsed();
        if pcm.is_empty() {
            return Err(reject(
                Reason::NoSamples,
                "no samples left after resampling to 16 kHz".into(),
            ));
        }
        let t = Instant::now();
        let hash = asr_corpus::audio_hash(&pcm);
        timings.hash += t.elapsed();
        let t = Instant::now();
        let encoded = self
            .tokenizer
            .encode(&ready.language, &ready.text, self.prefix, self.max_tokens)
            .map_err(|e| reject(Reason::TokenizeError, e.to_string()))?;
        timings.tokenize += t.elapsed();
        Ok(Audio { pcm, hash, source_seconds, tokens: encoded.ids, truncated: encoded.truncated })
    }
}
