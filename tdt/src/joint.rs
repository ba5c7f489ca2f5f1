//! The joint's output layer and the loss together, on the host, over each utterance's valid
//! lattice only: the CPU backends' training path (ARCHITECTURE.md, "The joint on the host").
//!
//! Run as Burn operations on a CPU backend, the joint of a micro-batch computes the logits of
//! every padded `(t, u)` node, adds the bias in a second pass over them, copies them for
//! reshapes, and its backward allocates two more logits-sized buffers; profiling the `tiny`
//! step put most of its time there. Here, one utterance at a time (parallel over utterances):
//!
//! 1. `hidden = relu(enc[t] + pred[u])` for the valid nodes only, `[n, J]`;
//! 2. `logits = hidden W + b` into one buffer, the bias as the product's initial value;
//! 3. the loss writes its gradient over the logits (`cpu::tdt_in_place`), scaled by the
//!    utterance's weight in the differentiated sum;
//! 4. the hidden gradient `G W^T`, masked by the ReLU, summed over `u` into the encoder row and
//!    over `t` into the prediction row; the weight gradient `hidden^T G` and the bias gradient
//!    (the column sums of `G`) accumulate per thread.
//!
//! The logits of one utterance are the largest buffer (one per task); nothing of the padded
//! lattice exists. The products are `gemm`'s (its AVX2 kernels where the CPU has them, not its
//! AVX-512 ones: see the manifest), and each is split over the thread pool as well: a
//! micro-batch of long utterances holds fewer utterances than there are threads (at 20 s of
//! audio, one to three), and a one-utterance batch ran on one thread. `gemm` splits the output,
//! never the inner dimension, so each value is summed in the same order at any thread count.
// `gemm` takes raw pointers and strides; every call says why its ranges are valid.
#![allow(unsafe_code)]

use gemm::{gemm, Parallelism};
use rayon::prelude::*;

use super::batch::BatchInput;
use super::cpu::{rnnt_in_place, rnnt_utterance, tdt_in_place, tdt_utterance, Dims};
use super::{TdtError, TdtOptions};

/// One utterance's work: its index and its rows of the encoder and prediction gradients.
type Task<'a> = (usize, &'a mut [f32], &'a mut [f32]);

/// Groups of utterances whose weight gradients are summed separately (see [`joint_loss`]): more
/// than the threads of a small machine, for balance; each holds one `[J, O]` sum.
const GROUPS: usize = 8;

/// A micro-batch up to the joint's output layer, row-major host values.
#[derive(Debug, Clone, Copy)]
pub struct JointInput<'a> {
    /// Encoder output projected by the joint, `[batch, t_max, hidden]`.
    pub enc: &'a [f32],
    /// Prediction output projected by the joint, `[batch, u_max + 1, hidden]`.
    pub pred: &'a [f32],
    /// The output layer's weight, `[hidden, outputs]` (Burn's `Linear` layout).
    pub weight: &'a [f32],
    /// The output layer's bias, `[outputs]`.
    pub bias: Option<&'a [f32]>,
    /// Utterances.
    pub batch: usize,
    /// Padded frames.
    pub t_max: usize,
    /// Padded target length.
    pub u_max: usize,
    /// The joint's hidden width `J`.
    pub hidden: usize,
    /// Logits per node: tokens, blank, then one per duration.
    pub outputs: usize,
    /// Targets `[batch, u_max]`; entries past an utterance's length are ignored.
    pub targets: &'a [u32],
    /// Valid frames per utterance.
    pub frame_lens: &'a [usize],
    /// Valid targets per utterance.
    pub target_lens: &'a [usize],
}

/// Gradients of `sum_b weights[b] * cost_b`, in the inputs' layouts (zero on padding).
#[derive(Debug, Clone)]
pub struct JointGradients {
    /// `[batch, t_max, hidden]`.
    pub enc: Vec<f32>,
    /// `[batch, u_max + 1, hidden]`.
    pub pred: Vec<f32>,
    /// `[hidden, outputs]`.
    pub weight: Vec<f32>,
    /// `[outputs]` (zeros when the layer has no bias).
    pub bias: Vec<f32>,
}

/// What [`joint_loss`] computed.
#[derive(Debug, Clone)]
pub struct JointOutput {
    /// Per-utterance costs, as [`crate::batch::loss`] gives them for the same logits.
    pub costs: Vec<f64>,
    /// The gradients, when weights were given.
    pub grads: Option<JointGradients>,
}

impl JointInput<'_> {
    /// The loss problem's checks (targets, lengths, durations) and every slice's length.
    fn validate(&self, opts: &TdtOptions) -> Result<(), TdtError> {
        let n_dur = opts.durations.len();
        let (b, j, o) = (self.batch, self.hidden, self.outputs);
        let expect = [
            ("encoder side", self.enc.len(), b * self.t_max * j),
            ("prediction side", self.pred.len(), b * (self.u_max + 1) * j),
            ("output weight", self.weight.len(), j * o),
            ("output bias", self.bias.map_or(o, <[f32]>::len), o),
        ];
        for (what, got, expected) in expect {
            if got != expected {
                return Err(TdtError::JointValues { what, got, expected });
            }
        }
        if j == 0 || o <= n_dur {
            return Err(TdtError::LogitsShape {
                dims: [b, self.t_max, self.u_max + 1, o],
                u_max: self.u_max,
                durations: n_dur,
            });
        }
        BatchInput {
            logits: &[],
            batch: b,
            t_max: self.t_max,
            u_max: self.u_max,
            vocab: o - n_dur,
            n_dur,
            targets: self.targets,
            frame_lens: self.frame_lens,
            target_lens: self.target_lens,
        }
        .validate_problem(opts)
    }

    /// Valid nodes of utterance `b`.
    fn nodes(&self, b: usize) -> usize {
        self.frame_lens[b] * (self.target_lens[b] + 1)
    }
}

/// The TDT loss (or, with `rnnt`, the RNN-T loss on the token logits) of the joint's logits,
/// computed from the joint's projected inputs and output layer. With `weights`, also the
/// gradients of `sum_b weights[b] * cost_b` with respect to both inputs and the layer.
pub fn joint_loss(
    input: &JointInput<'_>,
    opts: &TdtOptions,
    rnnt: bool,
    weights: Option<&[f64]>,
) -> Result<JointOutput, TdtError> {
    opts.validate()?;
    input.validate(opts)?;
    if input.batch == 0 {
        let grads = weights.map(|_| JointGradients {
            enc: Vec::new(),
            pred: Vec::new(),
            weight: vec![0.0; input.weight.len()],
            bias: vec![0.0; input.outputs],
        });
        return Ok(JointOutput { costs: Vec::new(), grads });
    }
    let par = products_parallelism();
    let Some(weights) = weights else {
        let costs = (0..input.batch)
            .into_par_iter()
            .map_init(Scratch::default, |s, b| {
                s.logits_of(input, b, par);
                let (dims, targets) = utterance(input, opts, b);
                let cost = if rnnt {
                    rnnt_utterance(&s.logits, &dims, targets, None)
                } else {
                    tdt_utterance(&s.logits, &dims, targets, opts, None)
                };
                finite_or_zero(cost, opts)
            })
            .collect();
        return Ok(JointOutput { costs, grads: None });
    };
    if weights.len() != input.batch {
        return Err(TdtError::FactorCount { factors: weights.len(), utterances: input.batch });
    }
    let (j, o) = (input.hidden, input.outputs);
    let mut d_enc = vec![0f32; input.enc.len()];
    let mut d_pred = vec![0f32; input.pred.len()];
    let mut slots: Vec<Option<(&mut [f32], &mut [f32])>> = d_enc
        .chunks_mut(input.t_max * j)
        .zip(d_pred.chunks_mut((input.u_max + 1) * j))
        .map(Some)
        .collect();
    // The weight and bias gradients are sums over utterances in f32: each group of utterances
    // sums its own in a fixed order, and the groups are added in group order, so the result is
    // the same whatever the thread count and scheduling (exact resume compares bits). Groups
    // take the utterances round-robin from the largest lattice down, for balance.
    let mut order: Vec<usize> = (0..input.batch).collect();
    order.sort_by_key(|&b| (std::cmp::Reverse(input.nodes(b)), b));
    let mut groups: Vec<Vec<Task<'_>>> = (0..GROUPS.min(input.batch)).map(|_| Vec::new()).collect();
    let n_groups = groups.len();
    for (rank, &b) in order.iter().enumerate() {
        if let Some((e, p)) = slots[b].take() {
            groups[rank % n_groups].push((b, e, p));
        }
    }
    let acc = groups
        .into_par_iter()
        .map(|group| {
            let mut acc = Accumulator::new(j, o);
            for (b, d_enc, d_pred) in group {
                let cost =
                    acc.utterance(input, opts, rnnt, b, weights[b] as f32, d_enc, d_pred, par);
                acc.costs.push((b, cost));
            }
            acc
        })
        .collect::<Vec<_>>()
        .into_iter()
        .reduce(Accumulator::merge)
        .unwrap_or_else(|| Accumulator::new(j, o));
    let mut costs = vec![0.0; input.batch];
    for (b, c) in acc.costs {
        costs[b] = c;
    }
    Ok(JointOutput {
        costs,
        grads: Some(JointGradients {
            enc: d_enc,
            pred: d_pred,
            weight: acc.weight,
            bias: acc.bias,
        }),
    })
}

/// How each product is split: over the current pool's threads (`gemm` keeps small products on
/// one), or not at all on a one-thread pool.
fn products_parallelism() -> Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => Parallelism::None,
        n => Parallelism::Rayon(n),
    }
}

fn finite_or_zero(cost: f64, opts: &TdtOptions) -> f64 {
    if opts.zero_infinity && !cost.is_finite() {
        0.0
    } else {
        cost
    }
}

/// Utterance `b`'s unpadded lattice (its logits hold valid nodes only) and targets.
fn utterance<'a>(input: &JointInput<'a>, opts: &TdtOptions, b: usize) -> (Dims, &'a [u32]) {
    let (t, u) = (input.frame_lens[b], input.target_lens[b]);
    let n_dur = opts.durations.len();
    let dims = Dims { t_max: t, u_max: u, vocab: input.outputs - n_dur, n_dur, t, u };
    (dims, &input.targets[b * input.u_max..b * input.u_max + u])
}

/// One task's buffers, reused from utterance to utterance.
#[derive(Default)]
struct Scratch {
    /// `[n, J]`: the ReLU's output.
    hidden: Vec<f32>,
    /// `[n, O]`: the logits, then their gradient.
    logits: Vec<f32>,
    /// `[n, J]`: the hidden gradient.
    d_hidden: Vec<f32>,
}

impl Scratch {
    /// Fills `hidden` and `logits` for utterance `b`'s valid nodes.
    fn logits_of(&mut self, input: &JointInput<'_>, b: usize, par: Parallelism) {
        let (j, o) = (input.hidden, input.outputs);
        let (t, u1) = (input.frame_lens[b], input.target_lens[b] + 1);
        let n = t * u1;
        self.hidden.clear();
        self.hidden.reserve(n * j);
        for ti in 0..t {
            let e = &input.enc[(b * input.t_max + ti) * j..][..j];
            for ui in 0..u1 {
                let p = &input.pred[(b * (input.u_max + 1) + ui) * j..][..j];
                self.hidden.extend(e.iter().zip(p).map(|(x, y)| (x + y).max(0.0)));
            }
        }
        self.logits.clear();
        match input.bias {
            Some(bias) => (0..n).for_each(|_| self.logits.extend_from_slice(bias)),
            None => self.logits.resize(n * o, 0.0),
        }
        // SAFETY: `logits` is `[n, O]` (row stride O), `hidden` `[n, J]` (row stride J) and the
        // weight `[J, O]` (row stride O, checked by `validate`); the destination is a buffer of
        // its own, so it aliases neither operand.
        unsafe {
            gemm(
                n,
                o,
                j,
                self.logits.as_mut_ptr(),
                1,
                o as isize,
                true,
                self.hidden.as_ptr(),
                1,
                j as isize,
                input.weight.as_ptr(),
                1,
                o as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                par,
            );
        }
    }
}

/// A task's weight and bias gradients, its costs, and its scratch buffers.
struct Accumulator {
    weight: Vec<f32>,
    bias: Vec<f32>,
    costs: Vec<(usize, f64)>,
    scratch: Scratch,
}

impl Accumulator {
    fn new(j: usize, o: usize) -> Self {
        Accumulator {
            weight: vec![0.0; j * o],
            bias: vec![0.0; o],
            costs: Vec::new(),
            scratch: Scratch::default(),
        }
    }

    fn merge(mut self, other: Accumulator) -> Accumulator {
        self.weight.iter_mut().zip(&other.weight).for_each(|(a, b)| *a += b);
        self.bias.iter_mut().zip(&other.bias).for_each(|(a, b)| *a += b);
        self.costs.extend(other.costs);
        self
    }

    /// Utterance `b`'s cost; adds `weight` times its gradients into `d_enc` (`[t_max, J]`),
    /// `d_pred` (`[u_max + 1, J]`) and the accumulator.
    #[allow(clippy::too_many_arguments)]
    fn utterance(
        &mut self,
        input: &JointInput<'_>,
        opts: &TdtOptions,
        rnnt: bool,
        b: usize,
        weight: f32,
        d_enc: &mut [f32],
        d_pred: &mut [f32],
        par: Parallelism,
    ) -> f64 {
        let (j, o) = (input.hidden, input.outputs);
        let s = &mut self.scratch;
        s.logits_of(input, b, par);
        let (dims, targets) = utterance(input, opts, b);
        let cost = if rnnt {
            rnnt_in_place(&mut s.logits, &dims, targets)
        } else {
            tdt_in_place(&mut s.logits, &dims, targets, opts)
        };
        // An impossible utterance left its gradient at zero.
        let cost = finite_or_zero(cost, opts);
        if weight != 1.0 {
            s.logits.iter_mut().for_each(|g| *g *= weight);
        }
        let (t, u1) = (dims.t, dims.u + 1);
        let n = t * u1;
        s.d_hidden.clear();
        s.d_hidden.resize(n * j, 0.0);
        // SAFETY: `d_hidden` is `[n, J]` (row stride J); the logits' gradient `[n, O]` (row
        // stride O); the weight read as its transpose `[O, J]`: element (o, j) at `j * O + o`,
        // inside its `J * O` values. The destination is a buffer of its own.
        unsafe {
            gemm(
                n,
                j,
                o,
                s.d_hidden.as_mut_ptr(),
                1,
                j as isize,
                false,
                s.logits.as_ptr(),
                1,
                o as isize,
                input.weight.as_ptr(),
                o as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                par,
            );
        }
        for ti in 0..t {
            let de = &mut d_enc[ti * j..][..j];
            for ui in 0..u1 {
                let at = (ti * u1 + ui) * j;
                let dp = &mut d_pred[ui * j..][..j];
                let rows = s.d_hidden[at..at + j].iter().zip(&s.hidden[at..at + j]);
                for ((g, h), (e, p)) in rows.zip(de.iter_mut().zip(dp.iter_mut())) {
                    // ReLU's gradient: zero where its output is zero (as Burn's `relu`).
                    let g = if *h > 0.0 { *g } else { 0.0 };
                    *e += g;
                    *p += g;
                }
            }
        }
        // SAFETY: the accumulator's weight gradient is `[J, O]` (row stride O); `hidden` read
        // as its transpose `[J, n]`: element (j, r) at `r * J + j`, inside its `n * J` values;
        // the gradient `[n, O]` (row stride O). The destination is the accumulator's own.
        unsafe {
            gemm(
                j,
                o,
                n,
                self.weight.as_mut_ptr(),
                1,
                o as isize,
                true,
                s.hidden.as_ptr(),
                j as isize,
                1,
                s.logits.as_ptr(),
                1,
                o as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                par,
            );
        }
        for row in s.logits.chunks_exact(o) {
            self.bias.iter_mut().zip(row).for_each(|(a, g)| *a += g);
        }
        cost
    }
}
