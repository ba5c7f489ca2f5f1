//! Stage 2, audio and tokens (rayon, `--jobs` threads): read and decode one recording, cut each
//! row's segment, downmix, resample to 16 kHz, convert to 16-bit, hash the PCM, tokenize the
//! text. Rows of one recording (consecutive in the chunk: segments of a long file) share one
//! decode; recordings are independent. Results come back in input order.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::audio::decode::{decode_stream, to_i16, DecodeOptions, Decoded, Decoder, Reject};
use crate::audio::pcm::MAX_SECONDS;
use crate::audio::resample::Resampler;
use crate::inputs::TarCache;
use crate::tokenize::{LangPrefix, Tokenizer};

use super::report::{Entry, Reason};
use super::rows::Ready;

/// Most audio decoded from a recording that segments are cut from: one hour (at 48 kHz stereo,
/// 1.4 GB of samples while it is downmixed).
pub const MAX_RECORDING_SECONDS: u64 = 3600;

/// Stage 2's result for a row.
pub(super) struct Audio {
    /// 16 kHz mono 16-bit samples.
    pub(super) pcm: Vec<i16>,
    /// xxh3-64 of `pcm`, as the corpus stores it.
    pub(super) hash: u64,
    /// Duration of the decoded file (or segment) at its own rate.
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
    pub(super) tars: &'a TarCache,
}

impl AudioStage<'_> {
    /// Stage 2 for a chunk on `pool`, results in the order of `ready`.
    pub(super) fn chunk(&self, pool: &rayon::ThreadPool, ready: &[Ready]) -> Vec<Outcome> {
        // Runs of consecutive rows with the same audio: one decode each.
        let mut runs: Vec<&[Ready]> = Vec::new();
        let mut start = 0;
        for i in 1..=ready.len() {
            if i == ready.len() || ready[i].audio != ready[start].audio {
                runs.push(&ready[start..i]);
                start = i;
            }
        }
        pool.install(|| {
            runs.par_iter().flat_map_iter(|run| self.recording(run)).collect::<Vec<_>>()
        })
    }

    /// Stage 2 for the rows of one recording: one read and decode, then each row.
    fn recording(&self, rows: &[Ready]) -> Vec<Outcome> {
        let first = &rows[0];
        let t = Instant::now();
        let segmented = rows.iter().any(|r| r.row.segment.is_some());
        let opts = DecodeOptions {
            flac: self.decoder,
            verify_md5: self.verify_md5,
            max_seconds: if segmented { MAX_RECORDING_SECONDS } else { MAX_SECONDS },
        };
        let decoded = first
            .audio
            .read(self.tars)
            .and_then(|bytes| decode_stream(bytes, &opts))
            .map(|s| Decoded::from_stream(&s));
        // The decode's time is shared by the rows it serves.
        let decode_time = t.elapsed() / rows.len() as u32;
        rows.iter()
            .map(|ready| {
                let mut timings = Timings { decode: decode_time, ..Timings::default() };
                let audio = match &decoded {
                    Ok(d) => self.process(ready, d, &mut timings),
                    Err(r) => Err(self.reject(ready, r)),
                };
                (audio, timings)
            })
            .collect()
    }

    /// The drop entry for `ready` rejected as `r`.
    fn reject(&self, ready: &Ready, r: &Reject) -> Box<Entry> {
        Box::new(Entry::new(&ready.row, r.reason(), r.detail().to_owned()).with_audio(&ready.audio))
    }

    /// One row from its decoded recording: cut, resample, hash, tokenize.
    fn process(
        &self,
        ready: &Ready,
        decoded: &Decoded,
        timings: &mut Timings,
    ) -> Result<Audio, Box<Entry>> {
        let reject = |reason: Reason, detail: String| {
            Box::new(Entry::new(&ready.row, reason, detail).with_audio(&ready.audio))
        };
        let t = Instant::now();
        let samples = match &ready.row.segment {
            Some(seg) => {
                let range = seg
                    .range(decoded.samples.len(), decoded.rate)
                    .map_err(|r| self.reject(ready, &r))?;
                &decoded.samples[range]
            }
            None => &decoded.samples[..],
        };
        if samples.len() as u64 > MAX_SECONDS * u64::from(decoded.rate) {
            return Err(reject(
                Reason::Unstorable,
                format!(
                    "more than {MAX_SECONDS} s of audio: longer than a corpus utterance may be"
                ),
            ));
        }
        let source_seconds = samples.len() as f64 / f64::from(decoded.rate.max(1));
        let resampled = RESAMPLER
            .with(|r| r.borrow_mut().to_target(samples, decoded.rate))
            .map_err(|e| reject(Reason::UnsupportedAudio, e.to_string()))?;
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
