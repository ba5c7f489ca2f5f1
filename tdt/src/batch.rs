//! The TDT (or RNN-T) loss of a padded batch on the CPU, parallel over utterances, and NeMo's
//! reductions.

use rayon::prelude::*;

use super::cpu::{rnnt_in_place, rnnt_utterance, tdt_in_place, tdt_utterance, Dims};
use super::{Reduction, TdtError, TdtOptions};

/// A padded batch, row-major.
#[derive(Debug, Clone, Copy)]
pub struct BatchInput<'a> {
    /// Logits `[batch, t_max, u_max + 1, vocab + n_dur]`.
    pub logits: &'a [f32],
    /// Utterances.
    pub batch: usize,
    /// Padded frames.
    pub t_max: usize,
    /// Padded target length.
    pub u_max: usize,
    /// Token classes including blank (blank is `vocab - 1`).
    pub vocab: usize,
    /// Duration classes.
    pub n_dur: usize,
    /// Targets `[batch, u_max]`; entries past an utterance's length are ignored.
    pub targets: &'a [u32],
    /// Valid frames per utterance.
    pub frame_lens: &'a [usize],
    /// Valid targets per utterance.
    pub target_lens: &'a [usize],
}

/// Per-utterance costs and the gradient of each cost with respect to its own logits.
#[derive(Debug, Clone)]
pub struct BatchOutput {
    /// `-log P(y|x)` per utterance (times `1 + fastemit_lambda` for TDT).
    pub costs: Vec<f64>,
    /// `d cost_b / d logits[b]`, same layout as the logits (zero on padding), if asked for.
    pub grads: Option<Vec<f32>>,
}

impl BatchInput<'_> {
    /// Checks shapes and lengths against each other and the options.
    pub fn validate(&self, opts: &TdtOptions) -> Result<(), TdtError> {
        self.validate_problem(opts)?;
        let block = self.block();
        if self.logits.len() != self.batch * block {
            return Err(TdtError::LogitsLen {
                got: self.logits.len(),
                batch: self.batch,
                t_max: self.t_max,
                u1: self.u_max + 1,
                width: self.vocab + self.n_dur,
            });
        }
        Ok(())
    }

    /// Everything [`BatchInput::validate`] checks except the logits' length (a device backend
    /// has them on the device): durations, vocabulary, targets and lengths.
    pub fn validate_problem(&self, opts: &TdtOptions) -> Result<(), TdtError> {
        if self.n_dur != opts.durations.len() {
            return Err(TdtError::DurationLogits {
                logits: self.n_dur,
                durations: opts.durations.len(),
            });
        }
        if self.vocab < 2 {
            return Err(TdtError::Vocab(self.vocab));
        }
        if self.targets.len() != self.batch * self.u_max {
            return Err(TdtError::TargetsLen {
                got: self.targets.len(),
                batch: self.batch,
                u_max: self.u_max,
            });
        }
        if self.frame_lens.len() != self.batch || self.target_lens.len() != self.batch {
            return Err(TdtError::LengthCounts {
                batch: self.batch,
                frame_lens: self.frame_lens.len(),
                target_lens: self.target_lens.len(),
            });
        }
        for b in 0..self.batch {
            let (t, u) = (self.frame_lens[b], self.target_lens[b]);
            if t == 0 || t > self.t_max || u > self.u_max {
                return Err(TdtError::UtteranceLengths {
                    utterance: b,
                    frames: t,
                    targets: u,
                    t_max: self.t_max,
                    u_max: self.u_max,
                });
            }
            let row = &self.targets[b * self.u_max..b * self.u_max + u];
            if let Some(p) = row.iter().position(|&y| y as usize >= self.vocab - 1) {
                return Err(TdtError::Target {
                    utterance: b,
                    position: p,
                    id: row[p],
                    blank: self.vocab - 1,
                });
            }
        }
        Ok(())
    }
}

/// Computes every utterance's cost (and gradient when `want_grad`), the TDT loss or, with
/// `rnnt`, the standard RNN-T loss on the token logits. Parallel over utterances.
pub fn loss(
    input: &BatchInput<'_>,
    opts: &TdtOptions,
    rnnt: bool,
    want_grad: bool,
) -> Result<BatchOutput, TdtError> {
    opts.validate()?;
    input.validate(opts)?;
    if want_grad {
        let mut grads = input.logits.to_vec();
        let costs = loss_in_place(&mut grads, input, opts, rnnt)?;
        return Ok(BatchOutput { costs, grads: Some(grads) });
    }
    let block = input.block();
    let costs = (0..input.batch)
        .into_par_iter()
        .map(|b| {
            let (dims, targets) = input.utterance(b);
            let logits = &input.logits[b * block..(b + 1) * block];
            let cost = if rnnt {
                rnnt_utterance(logits, &dims, targets, None)
            } else {
                tdt_utterance(logits, &dims, targets, opts, None)
            };
            finite_or_zero(cost, opts)
        })
        .collect();
    Ok(BatchOutput { costs, grads: None })
}

/// Every utterance's cost, with each utterance's gradient written over its logits in `logits`
/// (the layout of `input`, whose own `logits` field is not read). The batch's only large
/// buffer is the caller's. Parallel over utterances.
pub fn loss_in_place(
    logits: &mut [f32],
    input: &BatchInput<'_>,
    opts: &TdtOptions,
    rnnt: bool,
) -> Result<Vec<f64>, TdtError> {
    opts.validate()?;
    BatchInput { logits, ..*input }.validate(opts)?;
    let block = input.block();
    Ok(logits
        .par_chunks_mut(block.max(1))
        .enumerate()
        .map(|(b, g)| {
            let (dims, targets) = input.utterance(b);
            let cost = if rnnt {
                rnnt_in_place(g, &dims, targets)
            } else {
                tdt_in_place(g, &dims, targets, opts)
            };
            // An impossible utterance leaves its gradient at zero, so zero_infinity needs no
            // more.
            finite_or_zero(cost, opts)
        })
        .collect())
}

fn finite_or_zero(cost: f64, opts: &TdtOptions) -> f64 {
    if opts.zero_infinity && !cost.is_finite() {
        0.0
    } else {
        cost
    }
}

impl BatchInput<'_> {
    /// Values per utterance.
    fn block(&self) -> usize {
        self.t_max * (self.u_max + 1) * (self.vocab + self.n_dur)
    }

    /// Utterance `b`'s dimensions and valid targets.
    fn utterance(&self, b: usize) -> (Dims, &[u32]) {
        let dims = Dims {
            t_max: self.t_max,
            u_max: self.u_max,
            vocab: self.vocab,
            n_dur: self.n_dur,
            t: self.frame_lens[b],
            u: self.target_lens[b],
        };
        let targets = &self.targets[b * self.u_max..b * self.u_max + dims.u];
        (dims, targets)
    }
}

/// Each utterance's factor in the batch loss (`loss = sum_b factor_b * cost_b`), so the
/// gradient of the loss is `factor_b * d cost_b / d logits[b]`. One entry per target length.
pub fn reduction_factors(target_lens: &[usize], reduction: Reduction) -> Vec<f64> {
    let n = target_lens.len();
    let b = n.max(1) as f64;
    match reduction {
        Reduction::Sum => vec![1.0; n],
        Reduction::MeanBatch => vec![1.0 / b; n],
        // NeMo divides by the target length; a zero length gives inf/NaN there. Here an
        // utterance with no targets counts with length 1.
        Reduction::Mean => target_lens.iter().map(|&u| 1.0 / (b * u.max(1) as f64)).collect(),
        Reduction::MeanVolume => {
            let total = target_lens.iter().sum::<usize>().max(1) as f64;
            vec![1.0 / total; n]
        }
    }
}

/// The batch loss of per-utterance `costs` and each utterance's factor in it.
pub fn reduce(costs: &[f64], target_lens: &[usize], reduction: Reduction) -> (f64, Vec<f64>) {
    let factors = reduction_factors(target_lens, reduction);
    let loss = costs.iter().zip(&factors).map(|(c, f)| c * f).sum();
    (loss, factors)
}
