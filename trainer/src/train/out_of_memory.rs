//! The report of a micro-batch the device had no memory for: which batch (utterances, longest
//! duration, tokens) and the `sampler.max_batch_seconds` estimated to fit.
//!
//! The estimate: a step's largest tensors are the joint's, `[B, T, U + 1, *]` (hidden
//! activations, logits, their gradients), so peak memory grows with the micro-batch's lattice
//! `B x T x (U + 1)` in padded samples and tokens. With utterances of similar length `d`
//! (the sampler buckets by duration), `B ~ max_batch_seconds / d` and `T, U ~ d`, so the
//! lattice scales linearly with the micro-batch's audio seconds at a given length. The
//! suggestion scales this micro-batch's audio seconds (or `max_batch_seconds`, when smaller) by
//! (largest lattice that fit on this device) / (this lattice), less 10 % for the encoder and
//! fragmentation; with no micro-batch fitted yet it halves them. Starting from the batch, not the
//! setting: a setting far above what any bucket holds (100000 s against a bucket of 8000 s)
//! would otherwise be halved to a value that still takes the whole bucket.

use crate::config::TrainConfig;
use crate::device_failure::bytes_text;
use asr_plan::batcher::PaddedBatch;

/// Padded lattice cells of a micro-batch: utterances x padded samples x (padded tokens + 1).
pub fn lattice_cells(batch: &PaddedBatch) -> u128 {
    batch.size() as u128 * batch.max_samples as u128 * (batch.max_tokens as u128 + 1)
}

/// The failed micro-batch's seconds (`batch_seconds`, at most `now`) scaled to the lattice that
/// fitted (see the module documentation).
pub fn suggest_max_batch_seconds(
    now: f64,
    batch_seconds: f64,
    failed: u128,
    largest_fit: Option<u128>,
) -> f64 {
    let base = if batch_seconds > 0.0 { now.min(batch_seconds) } else { now };
    let scale = match largest_fit {
        Some(fit) if failed > 0 => (fit as f64 / failed as f64).min(1.0) * 0.9,
        _ => 0.5,
    };
    // One decimal, rounded down so the suggestion is not above the estimate.
    (base * scale * 10.0).floor() / 10.0
}

/// A micro-batch the device could not allocate for.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfMemory {
    /// Micro-batch number of the run.
    pub micro_batch: u64,
    /// Optimizer step it belonged to.
    pub step: u64,
    /// Utterances in it.
    pub utterances: usize,
    /// Its longest utterance, in seconds.
    pub longest_seconds: f64,
    /// Its tokens, all utterances together.
    pub tokens: u64,
    /// Most tokens of one utterance.
    pub max_tokens: usize,
    /// Its audio, in seconds.
    pub audio_seconds: f64,
    /// The allocation that failed, in bytes.
    pub bytes: u64,
    /// `sampler.max_batch_seconds` of the run.
    pub max_batch_seconds: f64,
    /// `train.fused_batch_size` of the run.
    pub fused_batch_size: usize,
    /// This micro-batch's lattice over the largest that fitted, when one did.
    pub over_largest_fit: Option<f64>,
    /// The suggested `sampler.max_batch_seconds`.
    pub suggested: f64,
}

impl OutOfMemory {
    /// The report of `batch`, micro-batch `micro_batch` of step `step` of a run configured by
    /// `cfg`, after an allocation of `bytes` failed.
    pub fn new(
        batch: &PaddedBatch,
        micro_batch: u64,
        step: u64,
        bytes: u64,
        cfg: &TrainConfig,
        largest_fit: Option<u128>,
    ) -> Self {
        let sample_rate = cfg.model.preprocessor.sample_rate;
        let max_batch_seconds = cfg.sampler.max_batch_seconds;
        let cells = lattice_cells(batch);
        let longest = batch.audio_lens.iter().copied().max().unwrap_or(0);
        OutOfMemory {
            micro_batch,
            step,
            utterances: batch.size(),
            longest_seconds: f64::from(longest) / f64::from(sample_rate.max(1)),
            tokens: batch.token_lens.iter().map(|&n| u64::from(n)).sum(),
            max_tokens: batch.token_lens.iter().copied().max().unwrap_or(0) as usize,
            audio_seconds: batch.seconds,
            bytes,
            max_batch_seconds,
            fused_batch_size: cfg.train.fused_batch_size,
            over_largest_fit: largest_fit.map(|fit| cells as f64 / fit.max(1) as f64),
            suggested: suggest_max_batch_seconds(
                max_batch_seconds,
                batch.seconds,
                cells,
                largest_fit,
            ),
        }
    }
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the device ran out of memory in micro-batch {} (step {}): {} utterances, the \
             longest {:.2} s, {} tokens (at most {} in one utterance), {:.1} s of audio; a \
             buffer of {} could not be allocated. Set sampler.max_batch_seconds = {:.1} or lower \
             (now {}; estimated: ",
            self.micro_batch,
            self.step,
            self.utterances,
            self.longest_seconds,
            self.tokens,
            self.max_tokens,
            self.audio_seconds,
            bytes_text(self.bytes),
            self.suggested,
            self.max_batch_seconds,
        )?;
        match self.over_largest_fit {
            Some(r) => write!(
                f,
                "this micro-batch's joint lattice (utterances x padded samples x (tokens + 1)) is \
                 {r:.2}x the largest that fitted on this device, and the estimate scales this \
                 micro-batch's audio to that, less 10 %)"
            )?,
            None => write!(
                f,
                "no micro-batch has fitted on this device yet, so this halves this one's audio)"
            )?,
        }
        if self.fused_batch_size != 1 {
            write!(
                f,
                "; or set train.fused_batch_size = 1 to run the joint and loss one utterance at \
                 a time (now {})",
                self.fused_batch_size
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::suggest_max_batch_seconds;

    #[test]
    fn the_suggestion_starts_from_the_batch_not_a_setting_far_above_it() {
        // Nothing fitted: half of what the failed batch held, not half of the setting.
        assert_eq!(suggest_max_batch_seconds(100_000.0, 8_000.0, 10, None), 4_000.0);
        // A batch as large as the setting: the setting is the base.
        assert_eq!(suggest_max_batch_seconds(90.0, 95.0, 10, None), 45.0);
        // Scaled by the lattice that fitted, less 10 %.
        assert_eq!(suggest_max_batch_seconds(100.0, 80.0, 400, Some(100)), 18.0);
    }
}
