//! The prediction network's LSTM recurrence as one host operation on the CPU backend.
//!
//! `decoder::lstm_sequence` computes the input's projections for every step at once, then per
//! step one `[B, H] x [H, 4H]` product, four gate activations and the cell update. As Burn
//! operations under autodiff, each step's backward computes its own `[H, 4H]` weight gradient
//! (a rank-`B` product the size of the weight) and adds it into the running sum: at the
//! 0.6B width (H = 640) and about 80 steps, that backward was a fifth of the CPU training step
//! (bench/RESULTS.md, "The LSTM recurrence on the host"). Here the whole recurrence is one
//! operation with its own backward: the steps' gate gradients first (the recurrence needs
//! them in order), then the weight's gradient as one product over all steps.
//!
//! The products are `host_product`'s (`gemm` over rayon's pool). NdArray's own (matrixmultiply)
//! split each step's `[B, 640] x [640, 2560]` over a thread pool of its own whose threads wait by
//! spinning on `sched_yield`: a profile of the 0.6B-shape step put 14.5 % of its samples in this
//! recurrence, about 40 % of them in that wait and 30 % in its operand packing
//! (bench/RESULTS.md, "The LSTM's products").
//!
//! Which backend: as `host_depthwise` (whose helpers this shares), NdArray bare or under
//! autodiff, f32 tensors; `None` elsewhere, and the caller runs the graph form.
//!
//! Invariants:
//! - the gates are `[input, forget, output, cell]` blocks of `H` along the last axis, the order
//!   `lstm_sequence` concatenates Burn's gate weights in; sigmoid on the first three, tanh on
//!   the cell candidate; the state starts at zero;
//! - `xin` already holds both biases: the operation's parameters are `xin` and the hidden
//!   weight only, and their gradients are the graph form's (tested against it).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::{Autodiff, NdArray};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;

use super::host_depthwise::{cast, float, tensor, with_values};
use super::host_product::{product, product_rows, View};

/// What the forward keeps for the backward: the gate activations `[B, S, 4H]` and the cells
/// `[B, S, H]`, row-major; the outputs `[B, S, H]` and the hidden weight `[H, 4H]` as the
/// tensors themselves (shared with the graph, not copied: the weight is 6.5 MB at the 0.6B
/// width).
// Clone: Burn's bound on a backward step's state; the step takes it by value, no copy is made.
#[derive(Debug, Clone)]
struct Saved {
    acts: Vec<f32>,
    cells: Vec<f32>,
    hidden: NdArrayTensor,
    weight: NdArrayTensor,
    dims: [usize; 3],
}

/// The hidden states `[B, S, H]` of the recurrence over `xin` `[B, S, 4H]` (the input's
/// projections plus both biases) with the hidden weight `w_hid` `[H, 4H]`, as one host
/// operation where the backend is NdArray (bare or under autodiff) and the tensors f32; `None`
/// elsewhere.
pub fn on_host<B: Backend>(xin: &Tensor<B, 3>, w_hid: &Tensor<B, 2>) -> Option<Tensor<B, 3>> {
    let id = std::any::TypeId::of::<B>();
    if id == std::any::TypeId::of::<Autodiff<NdArray>>() {
        let xin = cast::<_, Tensor<Autodiff<NdArray>, 3>>(xin.clone())?;
        let w = cast::<_, Tensor<Autodiff<NdArray>, 2>>(w_hid.clone())?;
        return cast(tracked(xin, w)?);
    }
    if id == std::any::TypeId::of::<NdArray>() {
        let xin = cast::<_, Tensor<NdArray, 3>>(xin.clone())?;
        let w = cast::<_, Tensor<NdArray, 2>>(w_hid.clone())?;
        let dims = xin.dims();
        let saved = forward(&float(xin), &float(w), dims)?;
        return cast(Tensor::<NdArray, 3>::from_primitive(TensorPrimitive::Float(saved.hidden)));
    }
    None
}

fn tracked(
    xin: Tensor<Autodiff<NdArray>, 3>,
    w: Tensor<Autodiff<NdArray>, 2>,
) -> Option<Tensor<Autodiff<NdArray>, 3>> {
    let dims = xin.dims();
    let (xin, w) = (float(xin), float(w));
    let saved = forward(&xin.primitive, &w.primitive, dims)?;
    let out = saved.hidden.clone();
    let nodes = [xin.node.clone(), w.node.clone()];
    let out = match RecurrenceBackward.prepare::<NoCheckpointing>(nodes).compute_bound().stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(saved, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Some(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The forward recurrence; `None` when a tensor is not f32 or the shapes disagree.
fn forward(xin: &NdArrayTensor, w: &NdArrayTensor, dims: [usize; 3]) -> Option<Saved> {
    if !matches!(xin, NdArrayTensor::F32(_)) {
        return None;
    }
    let [b, s, h4] = dims;
    let h = h4 / 4;
    let mut acts = with_values(xin, |v| v.to_vec())?;
    let (cells, hidden) = with_values(w, |weight| recur(&mut acts, weight, dims))??;
    let hidden = tensor(hidden, &[b, s, h]);
    Some(Saved { acts, cells, hidden, weight: w.clone(), dims })
}

/// The gate activations (written over `acts`, the gates' inputs), the cells and the outputs.
fn recur(acts: &mut [f32], weight: &[f32], [b, s, h4]: [usize; 3]) -> Option<(Vec<f32>, Vec<f32>)> {
    let h = h4 / 4;
    if h4 % 4 != 0 || acts.len() != b * s * h4 || weight.len() != h * h4 {
        return None;
    }
    let w = View::row_major(weight, h, h4)?;
    let mut cells = vec![0f32; b * s * h];
    let mut hidden = vec![0f32; b * s * h];
    for t in 0..s {
        if t > 0 {
            // Step t's gates `[B, 4H]` (rows `S * 4H` apart) += h_{t-1} `[B, H]` (rows `S * H`
            // apart) times the weight.
            let prev = View::strided(&hidden[(t - 1) * h..], b, h, s * h, 1)?;
            product_rows(&mut acts[t * h4..], s * h4, prev, w, true)?;
        }
        for bi in 0..b {
            let g = &mut acts[(bi * s + t) * h4..][..h4];
            let (ifo, cand) = g.split_at_mut(3 * h);
            ifo.iter_mut().for_each(|v| *v = sigmoid(*v));
            cand.iter_mut().for_each(|v| *v = v.tanh());
            let at = (bi * s + t) * h;
            for k in 0..h {
                let prev = if t > 0 { cells[at - h + k] } else { 0.0 };
                let c = g[h + k] * prev + g[k] * g[3 * h + k];
                cells[at + k] = c;
                hidden[at + k] = g[2 * h + k] * c.tanh();
            }
        }
    }
    Some((cells, hidden))
}

/// The backward step: the gradients of `xin` and of the hidden weight from the outputs'.
#[derive(Debug)]
struct RecurrenceBackward;

impl Backward<NdArray, 2> for RecurrenceBackward {
    type State = Saved;

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [px, pw] = ops.parents;
        let upstream = grads.consume::<NdArray>(&ops.node);
        let saved = ops.state;
        let [b, s, h4] = saved.dims;
        // The forward ran on f32 tensors of these shapes, and NdArray's float gradients are
        // f32 or f64, which `with_values` reads: this cannot fail.
        let Saved { acts, cells, hidden, weight, .. } = saved;
        let (dxin, dw) = with_values(&upstream, |dy| {
            with_values(&hidden, |hidden| {
                with_values(&weight, |weight| {
                    gradients(acts, &cells, hidden, weight, [b, s, h4], dy)
                })
                .flatten()
            })
            .flatten()
        })
        .flatten()
        .expect("f32 LSTM grads");
        if let Some(p) = px {
            grads.register::<NdArray>(p.id, tensor(dxin, &[b, s, h4]));
        }
        if let Some(p) = pw {
            grads.register::<NdArray>(p.id, tensor(dw, &[h4 / 4, h4]));
        }
    }
}

/// `(d xin, d w_hid)` from the outputs' gradient `dy` `[B, S, H]`; the gate gradients are
/// written over the saved activations.
fn gradients(
    mut acts: Vec<f32>,
    cells: &[f32],
    hidden: &[f32],
    weight: &[f32],
    [b, s, h4]: [usize; 3],
    dy: &[f32],
) -> Option<(Vec<f32>, Vec<f32>)> {
    let h = h4 / 4;
    if dy.len() != b * s * h || hidden.len() != b * s * h || cells.len() != b * s * h {
        return None;
    }
    let w = View::row_major(weight, h, h4)?;
    // The recurrent gradients into step t from step t + 1: of the hidden state and the cell.
    let mut dh_next = vec![0f32; b * h];
    let mut dc_next = vec![0f32; b * h];
    for t in (0..s).rev() {
        for bi in 0..b {
            let g = &mut acts[(bi * s + t) * h4..][..h4];
            let at = (bi * s + t) * h;
            for k in 0..h {
                let (i, f, o, cand) = (g[k], g[h + k], g[2 * h + k], g[3 * h + k]);
                let prev = if t > 0 { cells[at - h + k] } else { 0.0 };
                let tc = cells[at + k].tanh();
                let dh = dy[at + k] + dh_next[bi * h + k];
                let dc = dc_next[bi * h + k] + dh * o * (1.0 - tc * tc);
                g[k] = dc * cand * i * (1.0 - i);
                g[h + k] = dc * prev * f * (1.0 - f);
                g[2 * h + k] = dh * tc * o * (1.0 - o);
                g[3 * h + k] = dc * i * (1.0 - cand * cand);
                dc_next[bi * h + k] = dc * f;
            }
        }
        // dh into step t - 1: this step's gate gradients times the weight's transpose.
        let dg = View::strided(&acts[t * h4..], b, h4, s * h4, 1)?;
        product(&mut dh_next, dg, w.t(), false)?;
    }
    // The weight's gradient: sum over steps t >= 1 of h_{t-1}^T dG_t, one product per
    // utterance over all its steps.
    let mut dw = vec![0f32; h * h4];
    if s > 1 {
        for bi in 0..b {
            // h_0 .. h_{S-2} of utterance bi, transposed, times dG_1 .. dG_{S-1}.
            let hv = View::row_major(&hidden[bi * s * h..][..(s - 1) * h], s - 1, h)?;
            let dg = View::row_major(&acts[(bi * s + 1) * h4..][..(s - 1) * h4], s - 1, h4)?;
            product(&mut dw, hv.t(), dg, true)?;
        }
    }
    Some((acts, dw))
}
