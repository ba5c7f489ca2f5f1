//! Token-and-Duration Transducer (TDT) loss and greedy decoding.
//!
//! - `cpu`: the forward-backward recursions and closed-form gradients of one utterance, in
//!   float64 (TDT and, for the `omega` branch, standard RNN-T).
//! - `batch`: a padded batch, parallel over utterances, with NeMo's reductions.
//! - `op`: the Burn operation: a backend extension whose autodiff backward returns the
//!   closed-form gradient computed in the forward pass.
//! - `kernels`, `cube`: the same loss as CubeCL kernels (f32 accumulation, f32/f16/bf16 logits)
//!   and the extension for Burn's CubeCL backends (wgpu, CUDA): the logits stay on the device.
//! - `greedy`: NeMo's `greedy_batch` (label-looping) TDT decoding over small traits.
//!
//! Semantics follow NeMo's TDT loss (lattice, sigma, omega, FastEmit, clamp, reductions) as
//! specified for this project; differences are stated where they occur (impossible alignments
//! give `+inf`, or 0 with `zero_infinity`, instead of NeMo's finite 1e4-scale cost).

pub mod batch;
pub mod cpu;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[allow(unsafe_code)]
pub mod cube;
pub mod greedy;
pub mod greedy_burn;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod kernels;
pub mod op;

use serde::{Deserialize, Serialize};

/// How per-utterance costs are reduced to the batch loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Reduction {
    /// (1/B) sum of costs (NeMo's default for transducer models).
    #[default]
    MeanBatch,
    /// Sum of costs.
    Sum,
    /// (1/B) sum of cost / target length.
    Mean,
    /// Sum of costs / sum of target lengths.
    MeanVolume,
}

/// Options of the TDT loss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TdtOptions {
    /// Duration set, strictly ascending (Parakeet: `[0, 1, 2, 3, 4]`).
    pub durations: Vec<usize>,
    /// Logit under-normalisation: every arc weight is `log p - sigma` (Parakeet: 0.02).
    pub sigma: f64,
    /// Probability of computing the standard RNN-T loss instead, per loss call (Parakeet: 0.1).
    pub omega: f64,
    /// FastEmit regularisation weight (0: off).
    pub fastemit_lambda: f64,
    /// Clip token-logit gradients to `[-clamp, clamp]` per utterance (<= 0: off).
    pub clamp: f64,
    /// Batch reduction.
    pub reduction: Reduction,
    /// Give utterances with no possible alignment a cost and gradient of 0 instead of `+inf`.
    pub zero_infinity: bool,
}

impl Default for TdtOptions {
    fn default() -> TdtOptions {
        TdtOptions {
            durations: vec![0, 1, 2, 3, 4],
            sigma: 0.02,
            omega: 0.1,
            fastemit_lambda: 0.0,
            clamp: -1.0,
            reduction: Reduction::MeanBatch,
            zero_infinity: false,
        }
    }
}

/// Why the loss cannot be computed for the given inputs.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TdtError {
    /// Shapes or lengths disagree.
    #[error("TDT loss input: {0}")]
    Shape(String),
    /// Options out of range.
    #[error("TDT loss options: {0}")]
    Options(String),
}

impl TdtOptions {
    /// Checks the options.
    pub fn validate(&self) -> Result<(), TdtError> {
        if self.durations.is_empty() || self.durations.windows(2).any(|w| w[0] >= w[1]) {
            return Err(TdtError::Options(format!(
                "durations {:?} must be non-empty and strictly ascending",
                self.durations
            )));
        }
        if !self.durations.iter().any(|&d| d > 0) {
            return Err(TdtError::Options("durations need at least one value > 0".into()));
        }
        if !(0.0..=1.0).contains(&self.omega)
            || !self.sigma.is_finite()
            || self.fastemit_lambda < 0.0
        {
            return Err(TdtError::Options(format!(
                "need 0 <= omega <= 1 (got {}), finite sigma (got {}), fastemit_lambda >= 0 (got {})",
                self.omega, self.sigma, self.fastemit_lambda
            )));
        }
        Ok(())
    }
}
