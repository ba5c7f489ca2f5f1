//! Random ragged loss cases and their float64 reference, shared by the backends' tests.

use asr_corpus::synth::SplitMix64;
use asr_tdt::batch::{self, BatchInput};
use asr_tdt::op::TdtProblem;
use asr_tdt::TdtOptions;
use burn::tensor::{DType, TensorData};

/// A random ragged batch: logits, targets and lengths, with `vocab` tokens (blank last).
pub struct Case {
    pub logits: Vec<f32>,
    pub dims: [usize; 4],
    pub problem: TdtProblem,
}

pub fn case(seed: u64, batch: usize, vocab: usize, options: &TdtOptions, rnnt: bool) -> Case {
    let mut rng = SplitMix64::new(seed);
    let t_max = 1 + rng.below(14) as usize;
    let u_max = rng.below(7) as usize;
    sized(seed + 1, [batch, t_max, u_max], vocab, options, rnnt)
}

/// A random batch of `[batch, t_max, u_max]`: utterance 0 fills the padding, the others are
/// shorter at random.
pub fn sized(
    seed: u64,
    [batch, t_max, u_max]: [usize; 3],
    vocab: usize,
    options: &TdtOptions,
    rnnt: bool,
) -> Case {
    let mut rng = SplitMix64::new(seed);
    let width = vocab + options.durations.len();
    let mut frame_lens: Vec<usize> =
        (0..batch).map(|_| 1 + rng.below(t_max as u64) as usize).collect();
    let mut target_lens: Vec<usize> =
        (0..batch).map(|_| rng.below(u_max as u64 + 1) as usize).collect();
    frame_lens[0] = t_max;
    target_lens[0] = u_max;
    let targets: Vec<u32> =
        (0..batch * u_max).map(|_| rng.below(vocab as u64 - 1) as u32).collect();
    let logits: Vec<f32> = (0..batch * t_max * (u_max + 1) * width)
        .map(|_| (rng.next_f64() * 6.0 - 3.0) as f32)
        .collect();
    Case {
        logits,
        dims: [batch, t_max, u_max + 1, width],
        problem: TdtProblem {
            targets,
            u_max,
            frame_lens,
            target_lens,
            options: options.clone(),
            rnnt,
        },
    }
}

/// Costs and gradients from the float64 CPU path.
pub fn reference(c: &Case, logits: &[f32]) -> (Vec<f64>, Vec<f32>) {
    let p = &c.problem;
    let input = BatchInput {
        logits,
        batch: c.dims[0],
        t_max: c.dims[1],
        u_max: p.u_max,
        vocab: c.dims[3] - p.options.durations.len(),
        n_dur: p.options.durations.len(),
        targets: &p.targets,
        frame_lens: &p.frame_lens,
        target_lens: &p.target_lens,
    };
    let out = batch::loss(&input, &p.options, p.rnnt, true).unwrap();
    (out.costs, out.grads.unwrap())
}

pub fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| f64::from((x - y).abs())).fold(0.0, f64::max)
}

/// `logits` as `dtype` would store them, read back as f32: the reference of a backend that
/// reads half-precision logits sees the same rounded values.
pub fn rounded(logits: &[f32], dims: [usize; 4], dtype: DType) -> Vec<f32> {
    TensorData::new(logits.to_vec(), dims).convert_dtype(dtype).convert::<f32>().to_vec().unwrap()
}
