//! Token-and-Duration Transducer (TDT) loss and greedy decoding.
//!
//! - `cpu`: the forward-backward recursions and closed-form gradients of one utterance, in
//!   float64 (TDT and, for the `omega` branch, standard RNN-T).
//! - `batch`: a padded batch, parallel over utterances, with NeMo's reductions.
//! - `op`: the Burn operation: a backend extension whose autodiff backward returns the
//!   closed-form gradient computed in the forward pass.
//! - `kernels`, `cube`: the same loss as CubeCL kernels (f32 accumulation, f32/f16/bf16 logits)
//!   and the extension for Burn's CubeCL backends (wgpu, CUDA): the logits stay on the device.
//! - `fusion`: the extension for Burn's fusion backend over a CubeCL one (resolves the logits,
//!   runs the inner backend's kernels, registers the results back), and `in_stream`, which runs
//!   any inner-backend operation on fusion's tensors (the trainer's device operations).
//! - `joint`: the joint's output layer and the loss together on the host, over each utterance's
//!   valid lattice (the CPU backends' training path).
//! - `greedy`: NeMo's `greedy_batch` (label-looping) TDT decoding over small traits.
//!
//! Semantics follow NeMo's TDT loss (lattice, sigma, omega, FastEmit, clamp, reductions) as
//! specified for this project; differences are stated where they occur (impossible alignments
//! give `+inf`, or 0 with `zero_infinity`, instead of NeMo's finite 1e4-scale cost).
//!
//! Greedy decoding of the trainer's Burn model (the adapter from its prediction network and
//! joint to [`greedy::TdtDecoderModel`]) lives with the model, in the trainer.
// Only `cube` (CubeCL's unchecked kernel launches) and `joint` (`gemm`'s raw pointers) may use
// `unsafe`, and say why at each use.
#![deny(unsafe_code)]

pub mod batch;
pub mod cpu;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[allow(unsafe_code)]
pub mod cube;
#[cfg(feature = "fusion")]
pub mod fusion;
pub mod greedy;
pub mod joint;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
// `#[cube]` generates an undocumented expansion module beside each function, and `cube_reduce`
// is reachable from outside.
#[allow(missing_docs)]
mod kernels;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub use kernels::cube_reduce;
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
    /// The logits' element count is not `batch x t_max x (u_max + 1) x width`.
    #[error(
        "TDT loss input: logits have {got} values, expected {batch} x {t_max} x {u1} x {width}"
    )]
    LogitsLen {
        /// Values given.
        got: usize,
        /// Utterances.
        batch: usize,
        /// Padded frames.
        t_max: usize,
        /// Padded targets + 1.
        u1: usize,
        /// Vocabulary (with blank) + durations.
        width: usize,
    },
    /// The logits' shape does not fit the targets' padding or the duration count.
    #[error(
        "TDT loss input: logits {dims:?} do not match u_max {u_max} and {durations} durations"
    )]
    LogitsShape {
        /// `[batch, t_max, u_max + 1, width]` as given.
        dims: [usize; 4],
        /// The targets' padded length.
        u_max: usize,
        /// Durations in the options.
        durations: usize,
    },
    /// The duration logits' count is not the options' duration count.
    #[error("TDT loss input: {logits} duration logits but {durations} durations")]
    DurationLogits {
        /// Duration logits per node.
        logits: usize,
        /// Durations in the options.
        durations: usize,
    },
    /// The vocabulary has no token besides blank.
    #[error("TDT loss input: vocab {0} must include blank and at least one token")]
    Vocab(usize),
    /// The targets' value count is not `batch x u_max`.
    #[error("TDT loss input: targets have {got} values, expected {batch} x {u_max}")]
    TargetsLen {
        /// Values given.
        got: usize,
        /// Utterances.
        batch: usize,
        /// Padded targets.
        u_max: usize,
    },
    /// Not one frame length and one target length per utterance.
    #[error(
        "TDT loss input: {frame_lens} frame lengths and {target_lens} target lengths for \
         {batch} utterances"
    )]
    LengthCounts {
        /// Utterances.
        batch: usize,
        /// Frame lengths given.
        frame_lens: usize,
        /// Target lengths given.
        target_lens: usize,
    },
    /// An utterance's lengths do not fit the padding (or it has no frame).
    #[error(
        "TDT loss input: utterance {utterance}: {frames} frames and {targets} targets do not fit \
         1..={t_max} x 0..={u_max}"
    )]
    UtteranceLengths {
        /// The utterance.
        utterance: usize,
        /// Its frames.
        frames: usize,
        /// Its targets.
        targets: usize,
        /// Padded frames.
        t_max: usize,
        /// Padded targets.
        u_max: usize,
    },
    /// A target is blank or outside the vocabulary.
    #[error(
        "TDT loss input: utterance {utterance}: target {position} is {id}, expected a non-blank \
         id < {blank}"
    )]
    Target {
        /// The utterance.
        utterance: usize,
        /// The target's position in it.
        position: usize,
        /// Its id.
        id: u32,
        /// The blank id (the last of the vocabulary).
        blank: usize,
    },
    /// The joint's two inputs and the lengths disagree on the utterance count (or it is 0).
    #[error(
        "TDT loss input: joint inputs for {encoder} and {prediction} utterances with \
         {frame_lens} frame and {target_lens} target lengths"
    )]
    JointInputs {
        /// Utterances in the encoder output.
        encoder: usize,
        /// Utterances in the prediction network output.
        prediction: usize,
        /// Frame lengths given.
        frame_lens: usize,
        /// Target lengths given.
        target_lens: usize,
    },
    /// Not one reduction factor per utterance.
    #[error("TDT loss input: {factors} reduction factors for {utterances} utterances")]
    FactorCount {
        /// Factors given.
        factors: usize,
        /// Utterances.
        utterances: usize,
    },
    /// A host joint input of the wrong length.
    #[error("TDT joint on the host: the {what} has {got} values, expected {expected}")]
    JointValues {
        /// Which input.
        what: &'static str,
        /// Values given.
        got: usize,
        /// Values its shape needs.
        expected: usize,
    },
    /// A size does not fit the kernels' 32-bit indices.
    #[error("TDT loss input: {what} {value} does not fit the kernel's u32")]
    TooLargeForKernel {
        /// Which size.
        what: &'static str,
        /// Its value.
        value: usize,
    },
    /// The logits' element type is one the device does not support.
    #[error("TDT loss input: logits of dtype {0:?}: this device does not support the type")]
    DTypeNotOnDevice(burn::tensor::DType),
    /// The logits' element type is not one the kernels read.
    #[error("TDT loss input: logits of dtype {0:?}: the TDT kernel reads f32, f16 or bf16")]
    DTypeNotRead(burn::tensor::DType),
    /// The backend could not give the logits' values to the host.
    #[error("TDT loss input: reading logits: {0}")]
    ReadLogits(String),
    /// A backend returned costs without the gradient that was asked for (a bug in it).
    #[error("TDT loss: the backend returned no gradient")]
    NoGradient,
    /// The duration set is empty or not strictly ascending.
    #[error("TDT loss options: durations {0:?} must be non-empty and strictly ascending")]
    Durations(Vec<usize>),
    /// Every duration is 0 (no alignment could advance).
    #[error("TDT loss options: durations {0:?} need at least one value > 0")]
    NoAdvance(Vec<usize>),
    /// `omega` is not a probability.
    #[error("TDT loss options: need 0 <= omega <= 1 (got {0})")]
    Omega(f64),
    /// `sigma` is infinite or NaN.
    #[error("TDT loss options: sigma must be finite (got {0})")]
    Sigma(f64),
    /// `fastemit_lambda` is negative (or NaN).
    #[error("TDT loss options: fastemit_lambda must be >= 0 (got {0})")]
    FastEmit(f64),
}

impl TdtOptions {
    /// Checks the options.
    pub fn validate(&self) -> Result<(), TdtError> {
        if self.durations.is_empty() || self.durations.windows(2).any(|w| w[0] >= w[1]) {
            return Err(TdtError::Durations(self.durations.clone()));
        }
        if !self.durations.iter().any(|&d| d > 0) {
            return Err(TdtError::NoAdvance(self.durations.clone()));
        }
        if !(0.0..=1.0).contains(&self.omega) {
            return Err(TdtError::Omega(self.omega));
        }
        if !self.sigma.is_finite() {
            return Err(TdtError::Sigma(self.sigma));
        }
        if self.fastemit_lambda.is_nan() || self.fastemit_lambda < 0.0 {
            return Err(TdtError::FastEmit(self.fastemit_lambda));
        }
        Ok(())
    }
}
