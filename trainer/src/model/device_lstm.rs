//! The prediction network's LSTM recurrence as one operation on the CubeCL backends (wgpu,
//! CUDA; fused or not).
//!
//! As Burn operations, each step of the recurrence (`decoder::recurrence`) is about twenty tensor
//! operations forward and more backward: on lavapipe the two-layer prediction network cost
//! about 130 kernel launches per target token, about 10,000 of a 0.6B step's 52,000, and a GPU
//! step is bound by the host's cost per operation (bench/RESULTS.md, "Where a GPU step's
//! launches come from"). Here each step is two launches forward (the `[B, H] x [H, 4H]` product
//! and one kernel for the gates and the cell update) and two backward (the product with the
//! transposed weight and one kernel for the gate gradients); the weight's gradient is one
//! product over all steps, as on the host (`host_lstm`).
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors; `None` elsewhere, and the caller runs the graph form. Under
//! fusion the operation runs through `asr_tdt::fusion::in_stream`: queued in fusion's stream
//! by default, its inputs resolved on the calling thread with `ASRT_FUSION_QUEUE=0`.
//!
//! Invariants: the gates are `[input, forget, output, cell]` blocks of `H` along the last axis
//! (`host_lstm`'s order); sigmoid on the first three, tanh on the cell candidate; the state
//! starts at zero; `xin` holds both biases, so the operation's parameters are `xin` and the
//! hidden weight, and their gradients are the graph form's (tested against it on wgpu).

use asr_tdt::fusion::in_stream;
use burn::backend::Autodiff;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_op::{
    self, contiguous, empty, grid, on_cube_types, unit_index, DeviceBackward, DeviceOp, CUBE,
};
use super::host_depthwise::{cast, float};

#[cube]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + f32::exp(-x))
}

/// Writes the four gates' values of one `(b, j)` at `at` (the input gate's), `h` apart.
#[cube]
fn put_gates(to: &mut Array<f32>, at: usize, h: usize, i: f32, f: f32, o: f32, g: f32) {
    to[at] = i;
    to[at + h] = f;
    to[at + 2 * h] = o;
    to[at + 3 * h] = g;
}

/// Step `t` forward, one unit per `(b, j)` of `[B, H]`: the gates from `xin[b, t]` plus the
/// hidden product `hw[b]` (absent at `t = 0`, where the state is zero), the cell and hidden
/// state. Keeps the activations in `acts[b, t]` and the cell in `cells[b, t]`; writes the
/// hidden state to `out[b, t]`, to `prev[b, t + 1]` (the next step's input, for the weight's
/// gradient) and to `hidden[b]` (the next product's operand).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn lstm_step(
    xin: &Array<f32>,
    hw: &Array<f32>,
    acts: &mut Array<f32>,
    cells: &mut Array<f32>,
    out: &mut Array<f32>,
    prev: &mut Array<f32>,
    hidden: &mut Array<f32>,
    t: u32,
    steps: u32,
    width: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let h = width;
        let b = pos / h;
        let j = pos % h;
        let row = (b * steps + t) as usize;
        let g0 = row * (4 * h) as usize + j as usize;
        let mut pre_i = xin[g0];
        let mut pre_f = xin[g0 + h as usize];
        let mut pre_o = xin[g0 + 2 * h as usize];
        let mut pre_g = xin[g0 + 3 * h as usize];
        let mut c_prev = 0.0f32;
        if t > 0 {
            let r0 = (b * 4 * h + j) as usize;
            pre_i += hw[r0];
            pre_f += hw[r0 + h as usize];
            pre_o += hw[r0 + 2 * h as usize];
            pre_g += hw[r0 + 3 * h as usize];
            c_prev = cells[(row - 1) * h as usize + j as usize];
        }
        let i = sigmoid(pre_i);
        let f = sigmoid(pre_f);
        let o = sigmoid(pre_o);
        let g = f32::tanh(pre_g);
        let c = f * c_prev + i * g;
        let y = o * f32::tanh(c);
        put_gates(acts, g0, h as usize, i, f, o, g);
        let at = row * h as usize + j as usize;
        cells[at] = c;
        out[at] = y;
        if t == 0 {
            // Step 0's input is the zero state.
            prev[at] = 0.0;
        }
        if t + 1 < steps {
            prev[at + h as usize] = y;
        }
        hidden[pos as usize] = y;
    }
}

/// Step `t` backward, one unit per `(b, j)`: the hidden state's gradient (the output's,
/// `dy[b, t]`, plus the next step's through the product, `dh[b]`, absent at the last step),
/// the carried cell gradient `dc[b]` (updated in place for step `t - 1`), and the gates'
/// pre-activation gradients, written to `dxin[b, t]` and to `dgates[b]` (the next product's
/// operand).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn lstm_step_back(
    acts: &Array<f32>,
    cells: &Array<f32>,
    dy: &Array<f32>,
    dh: &Array<f32>,
    dc: &mut Array<f32>,
    dxin: &mut Array<f32>,
    dgates: &mut Array<f32>,
    t: u32,
    steps: u32,
    width: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let h = width;
        let b = pos / h;
        let j = pos % h;
        let row = (b * steps + t) as usize;
        let at = row * h as usize + j as usize;
        let mut d_y = dy[at];
        if t + 1 < steps {
            d_y += dh[pos as usize];
        }
        let g0 = row * (4 * h) as usize + j as usize;
        let i = acts[g0];
        let f = acts[g0 + h as usize];
        let o = acts[g0 + 2 * h as usize];
        let g = acts[g0 + 3 * h as usize];
        let c = cells[at];
        let tc = f32::tanh(c);
        let mut c_prev = 0.0f32;
        if t > 0 {
            c_prev = cells[at - h as usize];
        }
        // The carried cell gradient, zero at the last step (nothing carries into it).
        let mut d_c = d_y * o * (1.0 - tc * tc);
        if t + 1 < steps {
            d_c += dc[pos as usize];
        }
        dc[pos as usize] = d_c * f;
        let d_i = d_c * g * i * (1.0 - i);
        let d_f = d_c * c_prev * f * (1.0 - f);
        let d_o = d_y * tc * o * (1.0 - o);
        let d_g = d_c * i * (1.0 - g * g);
        put_gates(dxin, g0, h as usize, d_i, d_f, d_o, d_g);
        put_gates(dgates, (b * 4 * h + j) as usize, h as usize, d_i, d_f, d_o, d_g);
    }
}

/// What the forward keeps for the backward: the gate activations `[B, S, 4H]`, the cells and
/// each step's input hidden state `[B, S, H]`, and the hidden weight `[H, 4H]`.
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    acts: FloatTensor<B>,
    cells: FloatTensor<B>,
    prev: FloatTensor<B>,
    weight: FloatTensor<B>,
}

/// The recurrence as one operation (see the module): the backends that have it.
pub trait DeviceRecurrence: Backend {
    /// The hidden states `[B, S, H]` over `xin` `[B, S, 4H]` with the hidden weight `[H, 4H]`,
    /// and what the backward needs.
    fn recurrence_forward(
        xin: FloatTensor<Self>,
        weight: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, Saved<Self>);

    /// The gradients of `xin` and of the hidden weight from the outputs' gradient `dy`.
    fn recurrence_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

impl<R, F, I, BT> DeviceRecurrence for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn recurrence_forward(
        xin: FloatTensor<Self>,
        weight: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, Saved<Self>) {
        let [b, s, h4] = xin.shape().dims::<3>();
        let h = h4 / 4;
        let xin = contiguous(xin);
        let client = xin.client.clone();
        let device = xin.device.clone();
        let empty = |dims: Vec<usize>| empty::<R>(&client, &device, dims);
        let acts = empty(vec![b, s, h4]);
        let cells = empty(vec![b, s, h]);
        let out = empty(vec![b, s, h]);
        // Written by the kernel, step 0's row (the zero state) included. Not Burn's `zeros`: on
        // CUDA that tensor's rows are pitched (a row of 96 f32 takes 128, the padding never
        // written), while the kernel indexes every buffer densely; that read the padding's
        // garbage and wrote rows to the wrong place (the GPU kit's cg on an H200, 2026-11-29).
        let prev = empty(vec![b, s, h]);
        // What the kernel is given where it reads nothing (the product before step 0): a buffer
        // of its own, never one of the others (wgpu refuses a buffer bound twice for writing).
        let unused = empty(vec![1]);
        let w = Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(weight.clone()));
        let units = (b * h) as u32;
        let mut hw: Option<CubeTensor<R>> = None;
        for t in 0..s {
            let hidden = empty(vec![b, h]);
            // The kernel reads and writes within `[B, S, 4H]`, `[B, S, H]` and `[B, H]` for the
            // `units = B x H` units it runs (the others return at once); the checked launch
            // bounds every access anyway.
            lstm_step::launch::<R>(
                &client,
                grid(b * h),
                CubeDim::new_1d(CUBE),
                xin.clone().into_array_arg(),
                hw.as_ref().unwrap_or(&unused).clone().into_array_arg(),
                acts.clone().into_array_arg(),
                cells.clone().into_array_arg(),
                out.clone().into_array_arg(),
                prev.clone().into_array_arg(),
                hidden.clone().into_array_arg(),
                t as u32,
                s as u32,
                h as u32,
                units,
            );
            if t + 1 < s {
                let hidden = Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(hidden));
                hw = Some(contiguous(hidden.matmul(w.clone()).into_primitive().tensor()));
            }
        }
        (out, Saved { acts, cells, prev, weight })
    }

    fn recurrence_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let Saved { acts, cells, prev, weight } = saved;
        let [b, s, h4] = acts.shape().dims::<3>();
        let h = h4 / 4;
        let dy = contiguous(dy);
        let client = dy.client.clone();
        let device = dy.device.clone();
        let empty = |dims: Vec<usize>| empty::<R>(&client, &device, dims);
        let dxin = empty(vec![b, s, h4]);
        let unused = empty(vec![1]);
        // Dense and written before it is read (the last step starts it), as `prev` above.
        let dc = empty(vec![b, h]);
        let w_t = Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(weight)).transpose();
        let units = (b * h) as u32;
        let mut dh: Option<CubeTensor<R>> = None;
        for t in (0..s).rev() {
            let dgates = empty(vec![b, h4]);
            // As in the forward; `dc` and `dh` are `[B, H]`, `dgates` `[B, 4H]`.
            lstm_step_back::launch::<R>(
                &client,
                grid(b * h),
                CubeDim::new_1d(CUBE),
                acts.clone().into_array_arg(),
                cells.clone().into_array_arg(),
                dy.clone().into_array_arg(),
                dh.as_ref().unwrap_or(&unused).clone().into_array_arg(),
                dc.clone().into_array_arg(),
                dxin.clone().into_array_arg(),
                dgates.clone().into_array_arg(),
                t as u32,
                s as u32,
                h as u32,
                units,
            );
            if t > 0 {
                let dgates = Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(dgates));
                dh = Some(contiguous(dgates.matmul(w_t.clone()).into_primitive().tensor()));
            }
        }
        // The weight's gradient: every step's input hidden state against its gate gradients.
        let prev =
            Tensor::<Self, 3>::from_primitive(TensorPrimitive::Float(prev)).reshape([b * s, h]);
        let d = Tensor::<Self, 3>::from_primitive(TensorPrimitive::Float(dxin.clone()))
            .reshape([b * s, h4]);
        let dw = prev.transpose().matmul(d).into_primitive().tensor();
        (dxin, dw)
    }
}

impl<B> DeviceRecurrence for Fusion<B>
where
    B: FusionBackend + DeviceRecurrence,
{
    fn recurrence_forward(
        xin: FloatTensor<Self>,
        weight: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, Saved<Self>) {
        let dims = xin.shape.to_vec();
        let mut hidden = dims.clone();
        if let Some(last) = hidden.last_mut() {
            *last /= 4;
        }
        let outs = [
            (hidden.clone(), DType::F32),
            (dims, DType::F32),
            (hidden.clone(), DType::F32),
            (hidden, DType::F32),
        ];
        let [out, acts, cells, prev] = in_stream::<B, _, 2, 4>(
            "recurrence_forward",
            [xin, weight.clone()],
            outs,
            |[xin, weight]| {
                let (out, saved) = B::recurrence_forward(xin, weight);
                [out, saved.acts, saved.cells, saved.prev]
            },
        );
        (out, Saved { acts, cells, prev, weight })
    }

    fn recurrence_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let outs =
            [(saved.acts.shape.to_vec(), DType::F32), (saved.weight.shape.to_vec(), DType::F32)];
        let Saved { acts, cells, prev, weight } = saved;
        let [dxin, dw] = in_stream::<B, _, 5, 2>(
            "recurrence_backward",
            [acts, cells, prev, weight, dy],
            outs,
            |[acts, cells, prev, weight, dy]| {
                let (dxin, dw) = B::recurrence_backward(Saved { acts, cells, prev, weight }, dy);
                [dxin, dw]
            },
        );
        (dxin, dw)
    }
}

/// The recurrence as a [`DeviceOp`] of `xin` and the hidden weight.
#[derive(Debug, Clone, Copy)]
struct Recurrence;

impl<B: DeviceRecurrence> DeviceBackward<B, 2> for Recurrence {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; 2] {
        let (dxin, dw) = B::recurrence_backward(saved, dy);
        [dxin, dw]
    }
}

impl<B: DeviceRecurrence> DeviceOp<B, 2> for Recurrence {
    fn forward(&self, [xin, w]: [FloatTensor<B>; 2]) -> (FloatTensor<B>, Saved<B>) {
        B::recurrence_forward(xin, w)
    }
}

/// The recurrence under autodiff: one node with `xin` and the weight as parents.
fn tracked<B: DeviceRecurrence>(
    xin: Tensor<Autodiff<B>, 3>,
    w: Tensor<Autodiff<B>, 2>,
) -> Tensor<Autodiff<B>, 3> {
    Tensor::from_primitive(TensorPrimitive::Float(device_op::tracked(
        Recurrence,
        [float(xin), float(w)],
    )))
}

/// The recurrence without autodiff (evaluation).
fn bare<B: DeviceRecurrence>(xin: Tensor<B, 3>, w: Tensor<B, 2>) -> Tensor<B, 3> {
    let (out, _) = B::recurrence_forward(float(xin), float(w));
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The hidden states `[B, S, H]` of the recurrence over `xin` `[B, S, 4H]` (the input's
/// projections plus both biases) with the hidden weight `w_hid` `[H, 4H]`, as one operation
/// where the backend is one of the trainer's CubeCL types (bare or under autodiff) and the
/// tensors f32; `None` elsewhere.
pub fn on_device<B: Backend>(xin: &Tensor<B, 3>, w_hid: &Tensor<B, 2>) -> Option<Tensor<B, 3>> {
    if xin.dtype() != DType::F32 || w_hid.dtype() != DType::F32 {
        return None;
    }
    on_cube_types!(B, T, { cast(tracked::<T>(cast(xin.clone())?, cast(w_hid.clone())?)) }, {
        cast(bare::<T>(cast(xin.clone())?, cast(w_hid.clone())?))
    });
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_op::relative_difference as difference;
    use burn::tensor::Distribution;

    /// The operation against the graph form (`decoder::recurrence`) on the same backend: the
    /// outputs, and the gradients of `xin` and the weight under a weighted sum of the outputs.
    fn against_the_graph_form<B: DeviceRecurrence>() -> [f32; 3] {
        let device = Default::default();
        B::seed(&device, 7);
        let (b, s, h) = (3, 7, 24);
        let xin = Tensor::<B, 3>::random([b, s, 4 * h], Distribution::Normal(0.0, 1.0), &device);
        let w = Tensor::<B, 2>::random([h, 4 * h], Distribution::Normal(0.0, 0.3), &device);
        let weights = Tensor::<B, 3>::random([b, s, h], Distribution::Normal(0.0, 1.0), &device);
        type A<B> = Autodiff<B>;
        let run = |device_form: bool| {
            let x = Tensor::<A<B>, 3>::from_inner(xin.clone()).require_grad();
            let wa = Tensor::<A<B>, 2>::from_inner(w.clone()).require_grad();
            let out = if device_form {
                tracked::<B>(x.clone(), wa.clone())
            } else {
                crate::model::decoder::recurrence(x.clone(), wa.clone())
            };
            let loss = (out.clone() * Tensor::from_inner(weights.clone())).sum();
            let grads = loss.backward();
            (out.inner(), x.grad(&grads).unwrap(), wa.grad(&grads).unwrap())
        };
        let (y, dx, dw) = run(true);
        let (y0, dx0, dw0) = run(false);
        // Without autodiff, the same outputs.
        let bare_y = bare::<B>(xin.clone(), w.clone());
        assert_eq!(
            bare_y.into_data().into_vec::<f32>().unwrap(),
            y.clone().into_data().into_vec::<f32>().unwrap()
        );
        [difference(y, y0), difference(dx, dx0), difference(dw, dw0)]
    }

    #[test]
    fn matches_the_graph_form_and_its_gradients_on_wgpu_with_and_without_fusion() {
        let plain = against_the_graph_form::<burn::backend::Wgpu>();
        let fused = against_the_graph_form::<Fusion<burn::backend::Wgpu>>();
        eprintln!(
            "wgpu: y {:.1e}, dxin {:.1e}, dw {:.1e}; fused: y {:.1e}, dxin {:.1e}, dw {:.1e}",
            plain[0], plain[1], plain[2], fused[0], fused[1], fused[2]
        );
        // Measured: wgpu 2.7e-7, 1.8e-7, 3.0e-7; fused 2.7e-7, 2.8e-7, 2.6e-7 (two f32
        // evaluations of the same arithmetic, in another order). Bounds: 5x the larger.
        for (name, d) in [("wgpu", plain), ("fused wgpu", fused)] {
            for (what, v, bound) in [
                ("output", d[0], 1.35e-6),
                ("xin gradient", d[1], 1.4e-6),
                ("weight gradient", d[2], 1.5e-6),
            ] {
                assert!(v <= bound, "{name}: {what} differs by {v:.2e} (bound {bound:.1e})");
            }
        }
    }
}
