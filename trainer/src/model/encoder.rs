//! FastConformer encoder: depthwise-striding subsampling, then Conformer blocks with
//! relative-position multi-head attention (Transformer-XL style, as NeMo's
//! `RelPositionMultiHeadAttention`), a convolution module and macaron feed-forward halves.

use burn::nn::{BatchNorm, BatchNormConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{glu, silu, softmax};

use super::config::EncoderConfig;
use super::conv::{relu, Conv3x3S2, DepthwiseConv1d};
use super::dropout::{Dropout, NextNorm};
use super::handoff::Handoff;
use super::host_reshape::Reshaped;
use super::precision::Precision;

/// NeMo masks attention scores with -10000 rather than -inf.
const MASK_VALUE: f64 = -10_000.0;

/// The Conformer block's layer normalisations' epsilon (NeMo's and PyTorch's default), set on
/// the modules and read by the host form (Burn's `LayerNorm` does not expose it).
const LAYER_NORM_EPS: f64 = 1e-5;

/// `norm(x)`: one host operation on the CPU backend (`host_layer_norm`), one operation on the
/// CubeCL ones (`device_layer_norm`), Burn's elsewhere.
fn layer_norm<B: Backend, const D: usize>(
    norm: &LayerNorm<B>,
    x: Tensor<B, D>,
    handoff: Option<&Handoff>,
) -> Tensor<B, D> {
    let beta = norm.beta.as_ref().map(|b| b.val());
    let gamma = norm.gamma.val();
    if let Some(y) = super::host_layer_norm::on_host(&x, &gamma, beta.as_ref(), LAYER_NORM_EPS) {
        return y;
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(y) =
        super::device_layer_norm::on_device(&x, &gamma, beta.as_ref(), LAYER_NORM_EPS, handoff)
    {
        return y;
    }
    let _ = handoff;
    norm.forward(x)
}

/// One of a block's residual connections as its modules run it: its dropout, the block's
/// handoffs, its place among them (it hands its input's gradient over `link[at]` and the
/// normalisation after it, `norm`, claims `link[at + 1]` where there is one), and whether the
/// block's connections are a `chain` (`device_residual_norm::chain_fits`).
#[derive(Clone, Copy)]
struct Connection<'a, B: Backend> {
    dropout: &'a Dropout,
    link: &'a [Handoff; 4],
    at: usize,
    norm: &'a LayerNorm<B>,
    chain: bool,
}

impl<'a, B: Backend> Connection<'a, B> {
    /// The handoff its input's gradient goes over.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    fn handoff(&self) -> Option<&'a Handoff> {
        self.link.get(self.at)
    }

    /// The normalisation after it as a link of a device chain takes it (the module before it,
    /// the residual and the normalisation one node): in a chain, in f32 (`p`), where `also`
    /// holds; its parameters read only then.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    fn chained(&self, p: Precision, also: bool) -> Option<NextNorm<'a, B>> {
        let takes = self.chain && p.compute().is_none() && also;
        takes.then(|| next_norm(self.norm, self.link.get(self.at + 1), self.chain)).flatten()
    }

    /// The connection from `x` after `layer` of `h` (`Dropout::residual_linear`, times
    /// `factor`), then the normalisation of its output: `(the residual's output, the
    /// normalised)`. The normalisation's forward runs in the residual's kernel where both are
    /// device operations, else on its own ([`layer_norm`]). In a chain the two may be one node,
    /// the residual's output untracked: the caller gives it only to the chain's next
    /// connection, or drops it.
    fn residual_then_norm(
        &self,
        x: Tensor<B, 3>,
        layer: &Linear<B>,
        h: Tensor<B, 3>,
        factor: f32,
        p: Precision,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let handoff = self.link.get(self.at + 1);
        let next = next_norm(self.norm, handoff, self.chain);
        let given = self.link.get(self.at);
        match self.dropout.residual_linear(x, layer, h, factor, p, given, next) {
            (x, Some(normed)) => (x, normed),
            (x, None) => {
                let normed = layer_norm(self.norm, x.clone(), handoff);
                (x, normed)
            }
        }
    }
}

/// `norm` as the normalisation after a residual connection, claiming `handoff`; `None` without
/// a shift (`device_layer_norm` needs one).
fn next_norm<'a, B: Backend>(
    norm: &LayerNorm<B>,
    handoff: Option<&'a Handoff>,
    chain: bool,
) -> Option<NextNorm<'a, B>> {
    let beta = norm.beta.as_ref()?.val();
    Some(NextNorm { gamma: norm.gamma.val(), beta, eps: LAYER_NORM_EPS, handoff, chain })
}

/// Output length of one stride-2, kernel-3, padding-1 stage.
fn stage_len(n: usize) -> usize {
    (n + 2 - 3) / 2 + 1
}

/// Encoder frames for `frames` input feature frames.
pub fn encoded_len(cfg: &EncoderConfig, frames: usize) -> usize {
    let mut n = frames;
    for _ in 0..cfg.subsampling_factor.trailing_zeros() {
        n = stage_len(n);
    }
    n
}

/// NeMo's `dw_striding` subsampling: a full 3x3 stride-2 convolution, then (depthwise 3x3
/// stride-2 + pointwise 1x1) per further factor of two, ReLU after each, then a linear map of
/// channels x remaining features to `d_model`.
#[derive(Module, Debug)]
pub struct Subsampling<B: Backend> {
    first: Conv3x3S2<B>,
    depthwise: Vec<Conv3x3S2<B>>,
    pointwise: Vec<Linear<B>>,
    out: Linear<B>,
}

impl<B: Backend> Subsampling<B> {
    fn new(cfg: &EncoderConfig, features: usize, device: &B::Device) -> Self {
        let c = cfg.subsampling_conv_channels;
        let stages = cfg.subsampling_factor.trailing_zeros() as usize;
        let mut f = features;
        for _ in 0..stages {
            f = stage_len(f);
        }
        Subsampling {
            first: Conv3x3S2::new(c, device),
            depthwise: (1..stages).map(|_| Conv3x3S2::new(c, device)).collect(),
            pointwise: (1..stages).map(|_| LinearConfig::new(c, c).init(device)).collect(),
            out: LinearConfig::new(c * f, cfg.d_model).init(device),
        }
    }

    /// `[B, T, F]` with `lens` valid frames to `[B, T', d_model]` (channels-last inside;
    /// flattened channel-major, as NeMo flattens `[C, F']`). As NeMo 2's
    /// `MaskedConvSequential`, every stage's output is zeroed past that stage's valid length,
    /// so the frames next to the end of an utterance never read padding's activations (and an
    /// utterance encodes the same alone or padded in a batch).
    fn forward(&self, x: Tensor<B, 3>, lens: &[usize], p: Precision) -> Tensor<B, 3> {
        let device = x.device();
        let mut lens = lens.to_vec();
        let stage = |x: Tensor<B, 4>, lens: &mut Vec<usize>| {
            lens.iter_mut().for_each(|n| *n = stage_len(*n));
            let t = x.dims()[1];
            x * time_mask::<B>(lens, t, &device)
        };
        lens.iter_mut().for_each(|n| *n = stage_len(*n));
        let mut x = self.first.forward_relu_rows(x.unsqueeze_dim(3), &lens);
        for (dw, pw) in self.depthwise.iter().zip(&self.pointwise) {
            // The pointwise projection as a rank-2 Linear: on Burn 0.21's CubeCL backends (wgpu,
            // CUDA) this rank-4 Linear got a wrong bias gradient (its weight gradient and the
            // CPU backend's were right); as rank 2 both backends agree (wgpu_training test).
            let y = dw.forward(x);
            let [b, t, f, c] = y.dims();
            let y = p.linear(pw, y.reshaped([b * t * f, c])).reshaped([b, t, f, c]);
            // Masked, then the ReLU that keeps its output (`conv::relu`): the next stage's
            // input, kept once.
            x = relu(stage(y, &mut lens));
        }
        let [b, t, f, c] = x.dims();
        p.linear(&self.out, x.swap_dims(2, 3).reshape([b, t, c * f]))
    }
}

/// Swish (SiLU): one host operation on the CPU backend (`host_silu`), one operation on the
/// CubeCL ones (`device_gates`), Burn's `silu` elsewhere.
fn swish<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    if let Some(y) = super::host_silu::on_host(&x) {
        return y;
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(y) = super::device_gates::on_device(super::device_gates::Gate::Swish, &x) {
        return y;
    }
    silu(x)
}

/// `dropout` of [`swish`] of `x`: in training one operation each way on the CubeCL backends
/// (`device_gates`, the dropout's mask applied inside the gate's operation), Swish and the
/// dropout elsewhere.
fn swish_dropped<B: Backend, const D: usize>(x: Tensor<B, D>, dropout: &Dropout) -> Tensor<B, D> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(y) =
        super::device_gates::on_device_dropped(super::device_gates::Gate::Swish, &x, dropout)
    {
        return y;
    }
    dropout.forward(swish(x))
}

/// `dropout` of [`swish`] of `layer` of `x`: in training in f32 one operation each way on the
/// CubeCL backends (`device_matmul::linear_gated`: the product, then the bias, the Swish and the
/// dropout in one kernel), where the layer and the gate were two; the layer then
/// [`swish_dropped`] elsewhere.
fn linear_swish_dropped<B: Backend, const D: usize>(
    p: Precision,
    layer: &Linear<B>,
    x: Tensor<B, D>,
    dropout: &Dropout,
) -> Tensor<B, D> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let (Some(b), None) = (&layer.bias, p.compute()) {
        use super::device_matmul::{linear_gated, GateMask};
        let (w, b, gate) = (layer.weight.val(), b.val(), super::device_gates::Gate::Swish);
        if let Some(y) = linear_gated(&x, &w, &b, gate, GateMask::Dropout(dropout)) {
            return y;
        }
    }
    swish_dropped(p.linear(layer, x), dropout)
}

/// [`gated_masked`] of `layer` of `x`: in f32 under autodiff one operation each way on the
/// CubeCL backends (`device_matmul::linear_gated`, as [`linear_swish_dropped`]); the layer then
/// [`gated_masked`] elsewhere.
fn linear_gated_masked<B: Backend, const D: usize>(
    p: Precision,
    layer: &Linear<B>,
    x: Tensor<B, D>,
    keep: Tensor<B, D>,
) -> Tensor<B, D> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let (Some(b), None) = (&layer.bias, p.compute()) {
        use super::device_matmul::{linear_gated, GateMask};
        let (w, b, gate) = (layer.weight.val(), b.val(), super::device_gates::Gate::Glu);
        if let Some(y) = linear_gated(&x, &w, &b, gate, GateMask::Mask(&keep)) {
            return y;
        }
    }
    gated_masked(p.linear(layer, x), keep)
}

/// The gated linear unit over the last axis: one operation on the CubeCL backends
/// (`device_gates`), Burn's `glu` elsewhere.
fn gated<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(y) = super::device_gates::on_device(super::device_gates::Gate::Glu, &x) {
        return y;
    }
    glu(x, D - 1)
}

/// [`gated`] of `x` times `keep` (`[B, T, 1]`, 1 on valid frames): one operation each way on
/// the CubeCL backends (`device_gates`), the GLU and the product elsewhere.
fn gated_masked<B: Backend, const D: usize>(x: Tensor<B, D>, keep: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(y) =
        super::device_gates::on_device_masked(super::device_gates::Gate::Glu, &x, &keep)
    {
        return y;
    }
    gated(x) * keep
}

/// `norm` over the channels-last `x` `[B, T, C]`: in training one host operation on the CPU
/// backend (`host_batch_norm`); elsewhere Burn's `BatchNorm`, which wants the channels second.
/// (On the CubeCL backends in training the normalisation runs with its Swish,
/// [`batch_norm_swish`].)
fn batch_norm<B: Backend>(norm: &BatchNorm<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    if let Some(y) = super::host_batch_norm::train_on_host(norm, &x) {
        return y;
    }
    let y = norm.forward(x.swap_dims(1, 2)).swap_dims(1, 2);
    // Burn's forward leaves its running statistics in a map per thread (`running_stats`).
    super::running_stats::settle(norm);
    y
}

/// [`swish`] of [`batch_norm`] of `x`: in training one operation each way on the CubeCL
/// backends (`device_batch_norm`, the Swish inside the normalisation's kernels), the two
/// elsewhere.
fn batch_norm_swish<B: Backend>(norm: &BatchNorm<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        use super::device_batch_norm::{train_on_device, Activation};
        if let Some(y) = train_on_device(norm, &x, Activation::Swish) {
            return y;
        }
    }
    swish(batch_norm(norm, x))
}

/// `[B, T, 1, 1]`: 1 on each row's first `lens[b]` frames, 0 after.
fn time_mask<B: Backend>(lens: &[usize], t: usize, device: &B::Device) -> Tensor<B, 4> {
    super::mask::keep::<B>(lens, t, device).reshape([lens.len(), t, 1, 1])
}

/// Sinusoidal encodings of relative positions `T-1, ..., -(T-1)`: `[1, 2T-1, d]`.
fn rel_positions<B: Backend>(t: usize, d: usize, device: &B::Device) -> Tensor<B, 3> {
    let n = 2 * t - 1;
    let mut pe = vec![0f32; n * d];
    for (row, p) in (0..n).map(|i| t as f64 - 1.0 - i as f64).enumerate() {
        for i in (0..d).step_by(2) {
            let div = (-(i as f64) * (10_000f64).ln() / d as f64).exp();
            pe[row * d + i] = (p * div).sin() as f32;
            if i + 1 < d {
                pe[row * d + i + 1] = (p * div).cos() as f32;
            }
        }
    }
    Tensor::from_data(TensorData::new(pe, [1, n, d]), device)
}

/// Relative-position multi-head self-attention.
#[derive(Module, Debug)]
pub struct RelPositionAttention<B: Backend> {
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    pos: Linear<B>,
    out: Linear<B>,
    pos_bias_u: burn::module::Param<Tensor<B, 2>>,
    pos_bias_v: burn::module::Param<Tensor<B, 2>>,
    dropout: Dropout,
    heads: usize,
}

impl<B: Backend> RelPositionAttention<B> {
    fn new(cfg: &EncoderConfig, device: &B::Device) -> Self {
        let d = cfg.d_model;
        let dk = d / cfg.n_heads;
        RelPositionAttention {
            q: LinearConfig::new(d, d).init(device),
            k: LinearConfig::new(d, d).init(device),
            v: LinearConfig::new(d, d).init(device),
            pos: LinearConfig::new(d, d).with_bias(false).init(device),
            out: LinearConfig::new(d, d).init(device),
            pos_bias_u: burn::module::Param::from_tensor(Tensor::zeros([cfg.n_heads, dk], device)),
            pos_bias_v: burn::module::Param::from_tensor(Tensor::zeros([cfg.n_heads, dk], device)),
            dropout: Dropout::new(cfg.dropout),
            heads: cfg.n_heads,
        }
    }

    /// `x` `[B, T, d]`, `pos` `[1, 2T-1, d]`, `pad` `[B, 1, 1, T]` (true on padded keys), `keep`
    /// `[B, T, 1]` (1 on valid frames, the same mask): the heads' context merged, `out`'s
    /// input, which the caller runs with the residual after it.
    fn context(
        &self,
        x: Tensor<B, 3>,
        pos: Tensor<B, 3>,
        pad: Tensor<B, 4, Bool>,
        keep: &Tensor<B, 3>,
        p: Precision,
    ) -> Tensor<B, 3> {
        let [_, _, d] = x.dims();
        let (h, dk) = (self.heads, d / self.heads);
        let divisor = (dk as f64).sqrt();
        // In f32 on the CubeCL backends the whole attention is one operation each way unless
        // `ASRT_ATTENTION_OP=0` (`device_self_attention`: the projections' group, then the
        // context).
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let pos = match p.compute() {
            // The positions' layer has no bias (NeMo's `linear_pos`).
            None if self.pos.bias.is_none() && super::device_self_attention::enabled() => {
                let layers = [&self.q, &self.k, &self.v];
                let biases = [self.pos_bias_u.val(), self.pos_bias_v.val()];
                let w_pos = self.pos.weight.val();
                let on = super::device_self_attention::on_device;
                match on(&x, layers, biases, h, pos, &w_pos, keep, divisor, &self.dropout) {
                    Ok(y) => return y,
                    Err(pos) => pos,
                }
            }
            _ => pos,
        };
        let [q_u, q_v, k, v] = self.heads(x, p);
        // Otherwise (or where the whole attention was refused: the projections' group past its
        // rows, say) the rest is one operation each way in f32 on the CubeCL backends
        // (`device_context`).
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let ([q_u, q_v, k, v], pos) = match p.compute() {
            // The positions' layer has no bias (NeMo's `linear_pos`).
            None if self.pos.bias.is_none() => {
                let (heads, w_pos) = ([q_u, q_v, k, v], self.pos.weight.val());
                let on = super::device_context::on_device;
                match on(heads, pos, &w_pos, keep, divisor, &self.dropout) {
                    Ok(y) => return y,
                    Err(back) => back,
                }
            }
            _ => ([q_u, q_v, k, v], pos),
        };
        // [1, H, 2T-1, dk]
        let r = split_heads(p.linear(&self.pos, pos), Vec::new(), h);
        // The scores come back in f32: the mask and the softmax run there.
        let ac = p.matmul_transposed(q_u, k); // [B, H, T, T]
        let bd = p.matmul_transposed(q_v, r); // [B, H, T, 2T-1]
        let attn = attention_weights(ac, bd, pad, keep, divisor, &self.dropout);
        merge_heads(p.matmul(attn, v))
    }

    /// This module of `n` (`pos`, `pad`, `keep` as [`Self::context`] takes them), then `out`
    /// with the residual connection `to` from `x` and the normalisation after it
    /// ([`Connection::residual_then_norm`]). In a chain in f32 on the CubeCL backends in
    /// training all of it is one node and one operation each way (`device_attention_module`),
    /// where it was two.
    fn with_residual_norm(
        &self,
        x: Tensor<B, 3>,
        n: Tensor<B, 3>,
        (pos, pad, keep): (Tensor<B, 3>, Tensor<B, 4, Bool>, &Tensor<B, 3>),
        p: Precision,
        to: Connection<'_, B>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        // The positions' layer has no bias (NeMo's `linear_pos`).
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let also = self.pos.bias.is_none() && super::device_self_attention::enabled();
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let (x, pos) = match to.chained(p, also) {
            Some(next) => {
                use super::device_attention_module::{train_on_device, Attention};
                let [_, _, d_model] = n.dims();
                let att = Attention {
                    layers: [&self.q, &self.k, &self.v],
                    pos_biases: [self.pos_bias_u.val(), self.pos_bias_v.val()],
                    heads: self.heads,
                    w_pos: self.pos.weight.val(),
                    divisor: ((d_model / self.heads) as f64).sqrt(),
                    dropout: &self.dropout,
                };
                let (out, d) = (&self.out, to.dropout);
                match train_on_device(att, out, d, x, &n, pos, keep, to.handoff(), next) {
                    Ok([x, normed]) => return (x, normed),
                    Err(back) => back,
                }
            }
            None => (x, pos),
        };
        let h = self.context(n, pos, pad, keep, p);
        to.residual_then_norm(x, &self.out, h, 1.0, p)
    }

    /// The heads of `x` `[B, T, d]`, `[B, H, T, dk]` each: the query's with the position biases
    /// `u` and `v`, the key's and the value's. In f32 on the CubeCL backends one product and one
    /// kernel each way (`device_qkv`); elsewhere each projection, then its heads.
    fn heads(&self, x: Tensor<B, 3>, p: Precision) -> [Tensor<B, 4>; 4] {
        let h = self.heads;
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if p.compute().is_none() {
            let layers = [&self.q, &self.k, &self.v];
            let pos = [self.pos_bias_u.val(), self.pos_bias_v.val()];
            if let Some(heads) = super::device_qkv::project_heads(&x, layers, pos, h) {
                return heads;
            }
        }
        let (q, bq) = project(p, &self.q, x.clone(), h);
        let with = |extra: Tensor<B, 2>| {
            bq.iter().cloned().map(HeadBias::Flat).chain([HeadBias::Heads(extra)]).collect()
        };
        let q_u = split_heads(q.clone(), with(self.pos_bias_u.val()), h);
        let q_v = split_heads(q, with(self.pos_bias_v.val()), h);
        let (k, bk) = project(p, &self.k, x.clone(), h);
        let k = split_heads(k, bk.into_iter().map(HeadBias::Flat).collect(), h);
        let (v, bv) = project(p, &self.v, x, h);
        let v = split_heads(v, bv.into_iter().map(HeadBias::Flat).collect(), h);
        [q_u, q_v, k, v]
    }
}

/// `layer` of `x` `[B, T, d]` for a split into `heads` heads: where the split is one operation
/// (`device_heads::takes`) the product alone and the bias `[d]`, for the split to add;
/// elsewhere the whole linear layer and no bias.
fn project<B: Backend>(
    p: Precision,
    layer: &Linear<B>,
    x: Tensor<B, 3>,
    heads: usize,
) -> (Tensor<B, 3>, Option<Tensor<B, 1>>) {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(bias) = &layer.bias {
        let [_, _, d] = x.dims();
        if super::device_heads::takes(&x) && d.is_multiple_of(heads) {
            return (p.linear_unbiased(layer, x), Some(bias.val()));
        }
    }
    let _ = heads;
    (p.linear(layer, x), None)
}

/// A bias added to each head of a projection split into heads: the projection's own, `[H * dk]`,
/// or a position bias, `[H, dk]`; the same elements in the same order. Each keeps its shape,
/// so that neither is reshaped (`device_heads`).
#[derive(Debug, Clone)]
pub enum HeadBias<B: Backend> {
    /// `[H * dk]`.
    Flat(Tensor<B, 1>),
    /// `[H, dk]`.
    Heads(Tensor<B, 2>),
}

impl<B: Backend> HeadBias<B> {
    /// As `[1, 1, H, dk]` (`heads` = `H`), to add to the projection viewed head by head.
    pub fn per_head(self, heads: usize, dk: usize) -> Tensor<B, 4> {
        match self {
            Self::Flat(t) => t.reshape([1, 1, heads, dk]),
            Self::Heads(t) => t.reshape([1, 1, heads, dk]),
        }
    }
}

/// `x` `[B, T, H * dk]` head by head, `[B, H, T, dk]`, plus `biases` (`H * dk` elements each,
/// in order) in each head. One operation each way on the CubeCL backends (`device_heads`: the
/// products then read no permuted operand, which they would copy), views and sums elsewhere.
fn split_heads<B: Backend>(
    x: Tensor<B, 3>,
    biases: Vec<HeadBias<B>>,
    heads: usize,
) -> Tensor<B, 4> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let x = match super::device_heads::split(x, &biases, heads) {
        Ok(y) => return y,
        Err(x) => x,
    };
    let [b, t, d] = x.dims();
    let dk = d / heads;
    let mut x = x.reshaped([b, t, heads, dk]);
    for u in biases {
        x = x + u.per_head(heads, dk);
    }
    x.swap_dims(1, 2)
}

/// The inverse of [`split_heads`] without a bias: `[B, H, T, dk]` to `[B, T, H * dk]`.
fn merge_heads<B: Backend>(y: Tensor<B, 4>) -> Tensor<B, 3> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let y = match super::device_heads::merge(y) {
        Ok(x) => return x,
        Err(y) => y,
    };
    let [b, h, t, dk] = y.dims();
    y.swap_dims(1, 2).reshape([b, t, h * dk])
}

/// The attention's weights `[B, H, T, T]` from the content scores `ac` `[B, H, T, T]` and the
/// position scores `bd` `[B, H, T, 2T-1]`: the softmax over the valid keys of the shifted sum
/// divided by `divisor`, zero on padded keys (`pad` `[B, 1, 1, T]`, true on them; `keep`
/// `[B, T, 1]`, 1 elsewhere), through `dropout`. One operation, the dropout included, on the
/// CubeCL backends (`device_attention`); the tensor form and the dropout elsewhere.
fn attention_weights<B: Backend>(
    ac: Tensor<B, 4>,
    bd: Tensor<B, 4>,
    pad: Tensor<B, 4, Bool>,
    keep: &Tensor<B, 3>,
    divisor: f64,
    dropout: &Dropout,
) -> Tensor<B, 4> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let (ac, bd) = match super::device_attention::on_device(ac, bd, keep, divisor, dropout) {
        Ok(w) => return w,
        Err(scores) => scores,
    };
    // Without the CubeCL operation `keep` is unused: the tensor form masks with `pad`.
    let _ = keep;
    dropout.forward(attention_weights_tensor_form(ac, bd, pad, divisor))
}

/// [`attention_weights`] from tensor operations: NeMo's form (the padded keys' scores filled
/// with -10000 before the softmax, the weights zeroed there after it).
pub(super) fn attention_weights_tensor_form<B: Backend>(
    ac: Tensor<B, 4>,
    bd: Tensor<B, 4>,
    pad: Tensor<B, 4, Bool>,
    divisor: f64,
) -> Tensor<B, 4> {
    let [b, h, t, _] = ac.dims();
    let scores = (ac + rel_shift(bd, t)).div_scalar(divisor);
    let pad = pad.expand([b, h, t, t]);
    let scores = scores.mask_fill(pad.clone(), MASK_VALUE);
    softmax(scores, 3).mask_fill(pad, 0.0)
}

/// Transformer-XL's relative shift: scores against positions `T-1 .. -(T-1)` `[.., T, 2T-1]`
/// become scores against key positions `[.., T, T]` (query i, key j uses position i - j). One
/// host operation on the CPU backend (`host_rel_shift`), one operation on the CubeCL ones
/// (`device_rel_shift`), the tensor form elsewhere.
fn rel_shift<B: Backend>(x: Tensor<B, 4>, t: usize) -> Tensor<B, 4> {
    if let Some(y) = super::host_rel_shift::on_host(&x) {
        return y;
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(y) = super::device_rel_shift::on_device(&x) {
        return y;
    }
    rel_shift_tensor_form(x, t)
}

/// [`rel_shift`] from tensor operations: a zero column prepended, the rows re-cut one longer,
/// and the first `T` columns kept.
pub(super) fn rel_shift_tensor_form<B: Backend>(x: Tensor<B, 4>, t: usize) -> Tensor<B, 4> {
    let [b, h, _, n] = x.dims(); // n = 2T - 1
    let zeros = Tensor::zeros([b, h, t, 1], &x.device());
    let x = Tensor::cat(vec![zeros, x], 3) // [B, H, T, 2T]
        .reshape([b, h, n + 1, t])
        .slice([0..b, 0..h, 1..n + 1, 0..t])
        .reshape([b, h, t, n]);
    x.slice([0..b, 0..h, 0..t, 0..t])
}

/// Feed-forward: linear, Swish, dropout, linear.
#[derive(Module, Debug)]
pub struct FeedForward<B: Backend> {
    up: Linear<B>,
    down: Linear<B>,
    dropout: Dropout,
}

impl<B: Backend> FeedForward<B> {
    fn new(cfg: &EncoderConfig, device: &B::Device) -> Self {
        FeedForward {
            up: LinearConfig::new(cfg.d_model, cfg.ff_dim).init(device),
            down: LinearConfig::new(cfg.ff_dim, cfg.d_model).init(device),
            dropout: Dropout::new(cfg.dropout),
        }
    }

    /// The hidden layer, `down`'s input: the caller runs `down` with the residual after it.
    fn hidden(&self, x: Tensor<B, 3>, p: Precision) -> Tensor<B, 3> {
        linear_swish_dropped(p, &self.up, x, &self.dropout)
    }

    /// This module of `input`, then `down` with the residual connection `to` from `x` (times
    /// `factor`) and the normalisation after it ([`Connection::residual_then_norm`]). In a
    /// chain in f32 on the CubeCL backends in training all of it is one node and one operation
    /// each way (`device_feed_forward`), where it was two, with the normalisation of `x`
    /// inside it where `input` is that normalisation (where it was three).
    fn with_residual_norm(
        &self,
        x: Tensor<B, 3>,
        input: ModuleInput<'_, B>,
        factor: f32,
        p: Precision,
        to: Connection<'_, B>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let x = match to.chained(p, true) {
            Some(next) => {
                use super::device_feed_forward::{self as device, train_on_device};
                let device_input = match &input {
                    ModuleInput::Normalised(n) => Some(device::ModuleInput::Given(n)),
                    ModuleInput::Norm(first) => first.beta.as_ref().map(|beta| {
                        let (gamma, beta) = (first.gamma.val(), beta.val());
                        device::ModuleInput::Normalised { gamma, beta, eps: LAYER_NORM_EPS }
                    }),
                };
                let (layers, dropouts) = ([&self.up, &self.down], [&self.dropout, to.dropout]);
                let handoff = to.handoff();
                match device_input {
                    Some(i) => match train_on_device(layers, dropouts, factor, x, i, handoff, next)
                    {
                        Ok([x, normed]) => return (x, normed),
                        Err(x) => x,
                    },
                    None => x,
                }
            }
            None => x,
        };
        let n = match input {
            ModuleInput::Normalised(n) => n,
            ModuleInput::Norm(first) => layer_norm(first, x.clone(), to.link.get(to.at)),
        };
        let h = self.hidden(n, p);
        to.residual_then_norm(x, &self.down, h, factor, p)
    }
}

/// A feed-forward module's input as [`FeedForward::with_residual_norm`] takes it: normalised
/// already, or the normalisation to run on the residual's input (claiming the handoff the
/// residual gives its input's gradient over).
enum ModuleInput<'a, B: Backend> {
    Normalised(Tensor<B, 3>),
    Norm(&'a LayerNorm<B>),
}

/// Convolution module: pointwise to 2d, GLU, depthwise conv, batch norm, Swish, pointwise.
#[derive(Module, Debug)]
pub struct ConvModule<B: Backend> {
    pointwise1: Linear<B>,
    depthwise: DepthwiseConv1d<B>,
    norm: BatchNorm<B>,
    pointwise2: Linear<B>,
}

impl<B: Backend> ConvModule<B> {
    fn new(cfg: &EncoderConfig, device: &B::Device) -> Self {
        let d = cfg.d_model;
        ConvModule {
            pointwise1: LinearConfig::new(d, 2 * d).init(device),
            depthwise: DepthwiseConv1d::new(d, cfg.conv_kernel_size, device),
            norm: BatchNormConfig::new(d).init(device),
            pointwise2: LinearConfig::new(d, d).init(device),
        }
    }

    /// `x` `[B, T, d]`, `keep` `[B, T, 1]` (1 on valid frames): everything but `pointwise2`,
    /// which the caller runs with the residual after it.
    ///
    /// In training in f32 one operation each way on the CubeCL backends
    /// (`device_conv_module`), where the parts were three.
    fn hidden(&self, x: Tensor<B, 3>, keep: Tensor<B, 3>, p: Precision) -> Tensor<B, 3> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if p.compute().is_none() {
            use super::device_conv_module::train_on_device;
            let (pw, dw, norm) = (&self.pointwise1, &self.depthwise, &self.norm);
            if let Some(y) = train_on_device(pw, dw, norm, &x, &keep) {
                return y;
            }
        }
        let x = linear_gated_masked(p, &self.pointwise1, x, keep);
        // The depthwise convolution stays in f32 (ARCHITECTURE.md, "Mixed precision").
        let x = self.depthwise.forward(x);
        batch_norm_swish(&self.norm, x)
    }
}

impl<B: Backend> ConvModule<B> {
    /// This module of `n` (`keep` as [`Self::hidden`] takes it), then `pointwise2` with the
    /// residual connection `to` from `x` and the normalisation after it
    /// ([`Connection::residual_then_norm`]). In a chain in f32 on the CubeCL backends in
    /// training all of it is one node and one operation each way (`device_conv_residual`),
    /// where it was two.
    fn with_residual_norm(
        &self,
        x: Tensor<B, 3>,
        n: Tensor<B, 3>,
        keep: Tensor<B, 3>,
        p: Precision,
        to: Connection<'_, B>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let x = match to.chained(p, true) {
            Some(next) => {
                use super::device_conv_residual::train_on_device;
                let layers = [&self.pointwise1, &self.pointwise2];
                let (dw, bn, d, handoff) = (&self.depthwise, &self.norm, to.dropout, to.handoff());
                match train_on_device(layers, dw, bn, d, x, &n, &keep, handoff, next) {
                    Ok([x, normed]) => return (x, normed),
                    Err(x) => x,
                }
            }
            None => x,
        };
        let h = self.hidden(n, keep, p);
        to.residual_then_norm(x, &self.pointwise2, h, 1.0, p)
    }
}

/// One Conformer block (macaron: half FF, attention, convolution, half FF, norm).
#[derive(Module, Debug)]
pub struct ConformerLayer<B: Backend> {
    norm_ff1: LayerNorm<B>,
    ff1: FeedForward<B>,
    norm_att: LayerNorm<B>,
    att: RelPositionAttention<B>,
    norm_conv: LayerNorm<B>,
    conv: ConvModule<B>,
    norm_ff2: LayerNorm<B>,
    ff2: FeedForward<B>,
    norm_out: LayerNorm<B>,
    dropout: Dropout,
}

impl<B: Backend> ConformerLayer<B> {
    fn new(cfg: &EncoderConfig, device: &B::Device) -> Self {
        let norm = || LayerNormConfig::new(cfg.d_model).with_epsilon(LAYER_NORM_EPS).init(device);
        ConformerLayer {
            norm_ff1: norm(),
            ff1: FeedForward::new(cfg, device),
            norm_att: norm(),
            att: RelPositionAttention::new(cfg, device),
            norm_conv: norm(),
            conv: ConvModule::new(cfg, device),
            norm_ff2: norm(),
            ff2: FeedForward::new(cfg, device),
            norm_out: norm(),
            dropout: Dropout::new(cfg.dropout),
        }
    }

    fn forward(
        &self,
        x: Tensor<B, 3>,
        pos: Tensor<B, 3>,
        pad: Tensor<B, 4, Bool>,
        keep: Tensor<B, 3>,
        p: Precision,
    ) -> Tensor<B, 3> {
        // Each residual connection (input + factor x dropout(branch)) runs with the linear
        // layer that ends its branch: one operation each way on the CubeCL backends in f32
        // (`Dropout::residual_linear`), which hands its input's gradient to the backward of
        // the layer normalisation reading the same input (`handoff`).
        // The normalisation after each residual runs in the residual's kernel where both are
        // on the device (`Connection::residual_then_norm`).
        // Where every connection takes the device operation, each with the normalisation after
        // it is one node (`device_residual_norm`; with the whole feed-forward module before it,
        // `device_feed_forward`, the first one with the block's first normalisation too; with
        // the whole self-attention, `device_attention_module`; with the convolution module's
        // chain, `device_conv_residual`), and the residual's output, untracked, goes only to
        // the next connection, which hands its gradient back.
        let d = &self.dropout;
        let link = [0; 4].map(|_| Handoff::new());
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let chain = super::device_residual_norm::chain_fits(&[
            &self.ff1.down,
            &self.att.out,
            &self.conv.pointwise2,
            &self.ff2.down,
        ]);
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        let chain = false;
        let to = |at, norm| Connection { dropout: d, link: &link, at, norm, chain };
        let first = ModuleInput::Norm(&self.norm_ff1);
        let (x, normed) = self.ff1.with_residual_norm(x, first, 0.5, p, to(0, &self.norm_att));
        let attend = (pos, pad, &keep);
        let (x, normed) = self.att.with_residual_norm(x, normed, attend, p, to(1, &self.norm_conv));
        let (x, normed) = self.conv.with_residual_norm(x, normed, keep, p, to(2, &self.norm_ff2));
        let normed = ModuleInput::Normalised(normed);
        self.ff2.with_residual_norm(x, normed, 0.5, p, to(3, &self.norm_out)).1
    }
}

/// The encoder.
#[derive(Module, Debug)]
pub struct Encoder<B: Backend> {
    subsampling: Subsampling<B>,
    layers: Vec<ConformerLayer<B>>,
    dropout: Dropout,
    d_model: usize,
    xscaling: bool,
    /// The type of the products (not a parameter: checkpoints are the same whatever it is).
    #[module(skip)]
    precision: Precision,
}

impl<B: Backend> Encoder<B> {
    /// A freshly initialised encoder for `features` mel bands.
    pub fn new(cfg: &EncoderConfig, features: usize, device: &B::Device) -> Self {
        Encoder {
            subsampling: Subsampling::new(cfg, features, device),
            layers: (0..cfg.n_layers).map(|_| ConformerLayer::new(cfg, device)).collect(),
            dropout: Dropout::new(cfg.dropout),
            d_model: cfg.d_model,
            xscaling: cfg.xscaling,
            precision: Precision::F32,
        }
    }

    /// This encoder with its products in `precision`'s type.
    pub fn with_precision(self, precision: Precision) -> Self {
        Encoder { precision, ..self }
    }

    /// Features `[B, T, F]` with `frame_lens` valid frames each, to encodings `[B, T', d_model]`
    /// with `enc_lens` valid frames (computed by the caller with [`encoded_len`]).
    pub fn forward(
        &self,
        features: Tensor<B, 3>,
        frame_lens: &[usize],
        enc_lens: &[usize],
    ) -> Tensor<B, 3> {
        let device = features.device();
        let p = self.precision;
        let mut x = self.subsampling.forward(features, frame_lens, p);
        let [b, t, d] = x.dims();
        if self.xscaling {
            x = x.mul_scalar((d as f64).sqrt());
        }
        let pos = self.dropout.forward(rel_positions::<B>(t, self.d_model, &device));
        let x = self.dropout.forward(x);
        let valid = super::mask::valid::<B>(enc_lens, t, &device);
        let keep = valid.clone().float().reshape([b, t, 1]);
        let pad = valid.bool_not().reshape([b, 1, 1, t]);
        let mut x = x;
        for layer in &self.layers {
            x = layer.forward(x, pos.clone(), pad.clone(), keep.clone(), p);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    #[test]
    fn rel_shift_picks_position_i_minus_j() {
        // Scores equal to the position index: after the shift, entry (i, j) must hold the index
        // of position i - j, which is (T - 1) - (i - j).
        let t = 4;
        let n = 2 * t - 1;
        let data: Vec<f32> = (0..t).flat_map(|_| (0..n).map(|p| p as f32)).collect();
        let x = Tensor::<NdArray, 4>::from_data(
            TensorData::new(data, [1, 1, t, n]),
            &Default::default(),
        );
        let y = rel_shift(x, t).into_data().to_vec::<f32>().unwrap();
        for i in 0..t {
            for j in 0..t {
                let want = (t as i64 - 1 - (i as i64 - j as i64)) as f32;
                assert_eq!(y[i * t + j], want, "({i}, {j})");
            }
        }
    }
}
