//! The relative-position attention's weights from its two score parts
//! (`encoder::attention_weights`) as one operation on the CubeCL backends (wgpu, CUDA; fused or
//! not).
//!
//! The tensor form shifts the position scores (`rel_shift`), adds the content scores, divides by
//! `sqrt(dk)`, fills the padded keys with NeMo's `-10000`, takes Burn's softmax (a maximum, a
//! difference, an exponential, a sum and a quotient) and zeroes the padded keys again: about
//! ten launches forward and a dozen backward per Conformer layer, several `[B, H, T, T]`
//! tensors kept between them, and a GPU step is bound by the host's cost per launch
//! (bench/RESULTS.md). Here one kernel forward (a cube per row of scores: the largest valid
//! score, the sum of exponentials, the weights) and one backward (a cube per row: the sum of the
//! weights times their gradient, then both parts' gradients, the position part's through the
//! shift's transpose); only the weights are kept.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors; `None` elsewhere, and the caller runs the tensor form.
//!
//! Invariants: for content scores `ac` `[B, H, T, T]`, position scores `bd` `[B, H, T, 2T - 1]`
//! (positions `T - 1 .. -(T - 1)`) and `keep` (`B * T` values, 1 on each utterance's valid
//! frames), the weights of query `i` over key `j` are the softmax over the valid keys of
//! `(ac[i, j] + bd[i, T - 1 - i + j]) / divisor`, and zero on padded keys (a row without a valid
//! key is all zero); no gradient reaches a padded key's scores. Masking with `-10000` as the
//! tensor form does gives the same weights wherever the valid scores lie within about 87 of each
//! other's maximum above `-10000` (f32's `exp` of the gap underflows), which scores do.

use burn::backend::Autodiff;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
// CubeCL's `Float` (for `f32::new` in kernels), apart from Burn's tensor kind of that name.
use burn_cubecl::cubecl::prelude::Float as _;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_op::{
    self, contiguous, cube_index, cube_max, cube_sum, cubes, empty, on_cube_types, DeviceBackward,
    CUBE,
};
use super::host_depthwise::{cast, float};

/// Row `row` of `[B, H, T, ..]`'s batch element and query.
#[cube]
fn row_of(row: u32, heads: u32, t: u32) -> (u32, u32) {
    (row / (heads * t), row % t)
}

/// Whether key `j` of batch element `b` is an utterance's frame, not padding.
#[cube]
fn valid_key(keep: &Array<f32>, b: u32, t: u32, j: u32) -> bool {
    keep[(b * t + j) as usize] > 0.5
}

/// Row `row` (query `i`)'s scaled score of key `j`: the content score plus the position score of
/// position `i - j`, over `divisor`.
#[cube]
fn score(ac: &Array<f32>, bd: &Array<f32>, row: u32, i: u32, j: u32, t: u32, divisor: f32) -> f32 {
    let n = 2 * t - 1;
    (ac[(row * t + j) as usize] + bd[(row * n + t - 1 - i + j) as usize]) / divisor
}

/// One cube per row `(b, h, i)` of `y` `[B, H, T, T]`: the softmax over the valid keys of the
/// scaled score sum, zero on padded keys.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attention_forward(
    ac: &Array<f32>,
    bd: &Array<f32>,
    keep: &Array<f32>,
    y: &mut Array<f32>,
    rows: u32,
    heads: u32,
    t: u32,
    divisor: f32,
) {
    let row = cube_index();
    let mut shared = SharedMemory::<f32>::new(CUBE as usize);
    // The condition is the same for every unit of a cube: the barriers in the reductions are
    // uniform.
    if row < rows {
        let (b, i) = row_of(row, heads, t);
        // Below every score: the running maximum's start.
        let mut top = f32::new(-3.0e38);
        for j in range_stepped(UNIT_POS, t, CUBE_DIM) {
            if valid_key(keep, b, t, j) {
                let s = score(ac, bd, row, i, j, t, divisor);
                if s > top {
                    top = s;
                }
            }
        }
        let top = cube_max(&mut shared, top);
        let mut part = 0.0f32;
        for j in range_stepped(UNIT_POS, t, CUBE_DIM) {
            if valid_key(keep, b, t, j) {
                part += f32::exp(score(ac, bd, row, i, j, t, divisor) - top);
            }
        }
        let sum = cube_sum(&mut shared, part);
        for j in range_stepped(UNIT_POS, t, CUBE_DIM) {
            let mut w = 0.0f32;
            if valid_key(keep, b, t, j) {
                w = f32::exp(score(ac, bd, row, i, j, t, divisor) - top) / sum;
            }
            y[(row * t + j) as usize] = w;
        }
    }
}

/// One cube per row `(b, h, i)`: with `dot` the sum over valid keys of `w * dw`, the content
/// scores' gradient `w (dw - dot) / divisor` (zero on padded keys) to `d_ac` `[B, H, T, T]` and
/// the same values at their positions of `d_bd` `[B, H, T, 2T - 1]` (zero where no key read it).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    w: &Array<f32>,
    keep: &Array<f32>,
    dw: &Array<f32>,
    d_ac: &mut Array<f32>,
    d_bd: &mut Array<f32>,
    rows: u32,
    heads: u32,
    t: u32,
    divisor: f32,
) {
    let row = cube_index();
    let mut shared = SharedMemory::<f32>::new(CUBE as usize);
    if row < rows {
        let (b, i) = row_of(row, heads, t);
        let n = 2 * t - 1;
        let mut part = 0.0f32;
        for j in range_stepped(UNIT_POS, t, CUBE_DIM) {
            if valid_key(keep, b, t, j) {
                let at = (row * t + j) as usize;
                part += w[at] * dw[at];
            }
        }
        let dot = cube_sum(&mut shared, part);
        for j in range_stepped(UNIT_POS, t, CUBE_DIM) {
            let at = (row * t + j) as usize;
            let mut g = 0.0f32;
            if valid_key(keep, b, t, j) {
                g = w[at] * (dw[at] - dot) / divisor;
            }
            d_ac[at] = g;
        }
        // Position `p` was read by key `j = p + i - (T - 1)` when that lies in `0..T`.
        for p in range_stepped(UNIT_POS, n, CUBE_DIM) {
            let mut g = 0.0f32;
            if p + i + 1 >= t && p + i < n {
                let j = p + i + 1 - t;
                if valid_key(keep, b, t, j) {
                    let at = (row * t + j) as usize;
                    g = w[at] * (dw[at] - dot) / divisor;
                }
            }
            d_bd[(row * n + p) as usize] = g;
        }
    }
}

/// The weights as one operation (see the module): the backends that have it.
pub trait DeviceAttention: Backend {
    /// The weights `[B, H, T, T]` from `ac`, `bd` and `keep`.
    fn attention_forward(
        ac: FloatTensor<Self>,
        bd: FloatTensor<Self>,
        keep: FloatTensor<Self>,
        divisor: f32,
    ) -> FloatTensor<Self>;

    /// The gradients of `ac` and `bd` from the weights `w` and their gradient `dw`.
    fn attention_backward(
        w: FloatTensor<Self>,
        keep: FloatTensor<Self>,
        dw: FloatTensor<Self>,
        divisor: f32,
    ) -> [FloatTensor<Self>; 2];
}

impl<R, F, I, BT> DeviceAttention for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn attention_forward(
        ac: FloatTensor<Self>,
        bd: FloatTensor<Self>,
        keep: FloatTensor<Self>,
        divisor: f32,
    ) -> FloatTensor<Self> {
        let [b, h, t, _] = ac.shape().dims::<4>();
        let (ac, bd, keep) = (contiguous(ac), contiguous(bd), contiguous(keep));
        let client = ac.client.clone();
        let y = empty::<R>(&client, &ac.device, vec![b, h, t, t]);
        let rows = b * h * t;
        // Each cube reads its own row of the scores and its utterance's `keep`; the checked
        // launch bounds every access anyway.
        attention_forward::launch::<R>(
            &client,
            cubes(rows),
            CubeDim::new_1d(CUBE),
            ac.into_array_arg(),
            bd.into_array_arg(),
            keep.into_array_arg(),
            y.clone().into_array_arg(),
            rows as u32,
            h as u32,
            t as u32,
            divisor,
        );
        y
    }

    fn attention_backward(
        w: FloatTensor<Self>,
        keep: FloatTensor<Self>,
        dw: FloatTensor<Self>,
        divisor: f32,
    ) -> [FloatTensor<Self>; 2] {
        let [b, h, t, _] = w.shape().dims::<4>();
        let (w, keep, dw) = (contiguous(w), contiguous(keep), contiguous(dw));
        let client = w.client.clone();
        let d_ac = empty::<R>(&client, &w.device, vec![b, h, t, t]);
        let d_bd = empty::<R>(&client, &w.device, vec![b, h, t, 2 * t - 1]);
        let rows = b * h * t;
        attention_backward::launch::<R>(
            &client,
            cubes(rows),
            CubeDim::new_1d(CUBE),
            w.into_array_arg(),
            keep.into_array_arg(),
            dw.into_array_arg(),
            d_ac.clone().into_array_arg(),
            d_bd.clone().into_array_arg(),
            rows as u32,
            h as u32,
            t as u32,
            divisor,
        );
        [d_ac, d_bd]
    }
}

impl<B> DeviceAttention for Fusion<B>
where
    B: FusionBackend + DeviceAttention,
{
    fn attention_forward(
        ac: FloatTensor<Self>,
        bd: FloatTensor<Self>,
        keep: FloatTensor<Self>,
        divisor: f32,
    ) -> FloatTensor<Self> {
        let client = ac.client.clone();
        let resolve = |t| client.resolve_tensor_float::<B>(t);
        let y = B::attention_forward(resolve(ac), resolve(bd), resolve(keep), divisor);
        asr_tdt::fusion::adopt::<B>(&client, y)
    }

    fn attention_backward(
        w: FloatTensor<Self>,
        keep: FloatTensor<Self>,
        dw: FloatTensor<Self>,
        divisor: f32,
    ) -> [FloatTensor<Self>; 2] {
        let client = dw.client.clone();
        let resolve = |t| client.resolve_tensor_float::<B>(t);
        B::attention_backward(resolve(w), resolve(keep), resolve(dw), divisor)
            .map(|t| asr_tdt::fusion::adopt::<B>(&client, t))
    }
}

/// The weights' backward, a [`DeviceBackward`] of the two score parts, keeping the weights and
/// `keep` (shared, not copied).
#[derive(Debug, Clone, Copy)]
struct AttentionBackward {
    divisor: f32,
}

impl<B: DeviceAttention> DeviceBackward<B, 2> for AttentionBackward {
    type Saved = [FloatTensor<B>; 2];

    fn backward(&self, [w, keep]: [FloatTensor<B>; 2], dw: FloatTensor<B>) -> [FloatTensor<B>; 2] {
        B::attention_backward(w, keep, dw, self.divisor)
    }
}

/// The weights under autodiff: one node with the two score parts as parents (`keep` takes no
/// gradient).
fn tracked<B: DeviceAttention>(
    ac: Tensor<Autodiff<B>, 4>,
    bd: Tensor<Autodiff<B>, 4>,
    keep: Tensor<Autodiff<B>, 3>,
    divisor: f32,
) -> Tensor<Autodiff<B>, 4> {
    let inputs = [float(ac), float(bd)];
    let keep = float(keep).primitive;
    let [ac, bd] = inputs.each_ref().map(|t| t.primitive.clone());
    let w = B::attention_forward(ac, bd, keep.clone(), divisor);
    let y = device_op::node(AttentionBackward { divisor }, &inputs, w.clone(), [w, keep]);
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The weights without autodiff (evaluation).
fn bare<B: DeviceAttention>(
    ac: Tensor<B, 4>,
    bd: Tensor<B, 4>,
    keep: Tensor<B, 3>,
    divisor: f32,
) -> Tensor<B, 4> {
    let w = B::attention_forward(float(ac), float(bd), float(keep), divisor);
    Tensor::from_primitive(TensorPrimitive::Float(w))
}

/// The attention's weights (see the module) from `ac` `[B, H, T, T]`, `bd` `[B, H, T, 2T - 1]`
/// and `keep` `[B, T, 1]`, divided by `divisor` before the softmax, as one operation where the
/// backend is one of the trainer's CubeCL types (bare or under autodiff) and the tensors f32;
/// `None` elsewhere.
pub fn on_device<B: Backend>(
    ac: &Tensor<B, 4>,
    bd: &Tensor<B, 4>,
    keep: &Tensor<B, 3>,
    divisor: f64,
) -> Option<Tensor<B, 4>> {
    let [b, h, t, t2] = ac.dims();
    if t == 0
        || t2 != t
        || bd.dims() != [b, h, t, 2 * t - 1]
        || keep.dims() != [b, t, 1]
        || [ac.dtype(), bd.dtype(), keep.dtype()].iter().any(|d| *d != DType::F32)
        || b * h * t * (2 * t - 1) > u32::MAX as usize
    {
        return None;
    }
    let d = divisor as f32;
    on_cube_types!(
        B,
        T,
        { cast(tracked::<T>(cast(ac.clone())?, cast(bd.clone())?, cast(keep.clone())?, d)) },
        { cast(bare::<T>(cast(ac.clone())?, cast(bd.clone())?, cast(keep.clone())?, d)) }
    );
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_op::relative_difference as difference;
    use crate::model::encoder::attention_weights_tensor_form;
    use burn::tensor::Distribution;

    /// The operation against the tensor form on the same backend: the weights and both score
    /// parts' gradients under a weighted sum of the weights, largest difference relative to the
    /// largest value.
    fn against_the_tensor_form<B: DeviceAttention>(
        lens: &[usize],
        t: usize,
        heads: usize,
    ) -> [f32; 3] {
        let device = Default::default();
        B::seed(&device, 13);
        let b = lens.len();
        let ac = Tensor::<B, 4>::random([b, heads, t, t], Distribution::Normal(0.0, 4.0), &device);
        let bd = Tensor::<B, 4>::random(
            [b, heads, t, 2 * t - 1],
            Distribution::Normal(0.0, 4.0),
            &device,
        );
        let weights =
            Tensor::<B, 4>::random([b, heads, t, t], Distribution::Normal(0.0, 1.0), &device);
        let valid = crate::model::mask::valid::<B>(lens, t, &device);
        let keep = valid.clone().float().reshape([b, t, 1]);
        let pad = valid.bool_not().reshape([b, 1, 1, t]);
        let divisor = 8f64.sqrt();
        type A<B> = Autodiff<B>;
        let run = |device_form: bool| {
            let aca = Tensor::<A<B>, 4>::from_inner(ac.clone()).require_grad();
            let bda = Tensor::<A<B>, 4>::from_inner(bd.clone()).require_grad();
            let keep_a = Tensor::<A<B>, 3>::from_inner(keep.clone());
            let w = if device_form {
                tracked::<B>(aca.clone(), bda.clone(), keep_a, divisor as f32)
            } else {
                let pad = Tensor::<A<B>, 4, Bool>::from_inner(pad.clone());
                attention_weights_tensor_form(aca.clone(), bda.clone(), pad, divisor)
            };
            let grads = (w.clone() * Tensor::from_inner(weights.clone())).sum().backward();
            (w.inner(), aca.grad(&grads).unwrap(), bda.grad(&grads).unwrap())
        };
        let (w, d_ac, d_bd) = run(true);
        let (w0, d_ac0, d_bd0) = run(false);
        let plain = bare::<B>(ac, bd, keep, divisor as f32);
        assert_eq!(
            plain.into_data().into_vec::<f32>().unwrap(),
            w.clone().into_data().into_vec::<f32>().unwrap(),
            "bare and tracked forwards differ"
        );
        [compare(w, w0), compare(d_ac, d_ac0), compare(d_bd, d_bd0)]
    }

    /// [`difference`], or, where the reference is all zeros (one frame: the weight is 1 whatever
    /// the scores, so their gradients vanish), the largest absolute value.
    fn compare<B: Backend>(a: Tensor<B, 4>, b: Tensor<B, 4>) -> f32 {
        if b.clone().abs().max().into_scalar().elem::<f32>() == 0.0 {
            return a.abs().max().into_scalar().elem::<f32>();
        }
        difference(a, b)
    }

    #[test]
    fn matches_the_tensor_form_and_its_gradients_on_wgpu_with_and_without_fusion() {
        type Fused = Fusion<burn::backend::Wgpu>;
        type Wgpu = burn::backend::Wgpu;
        // One frame; padded utterances; rows longer than a cube (300 keys).
        let cases: [(&str, &[usize], usize); 3] =
            [("1 frame", &[1], 1), ("padded", &[37, 20, 1], 37), ("300 keys", &[300, 211], 300)];
        let mut worst = [0f32; 3];
        for (name, lens, t) in cases {
            for (backend, d) in [
                ("wgpu", against_the_tensor_form::<Wgpu>(lens, t, 2)),
                ("fused wgpu", against_the_tensor_form::<Fused>(lens, t, 2)),
            ] {
                eprintln!(
                    "{name}, {backend}: w {:.1e}, d_ac {:.1e}, d_bd {:.1e}",
                    d[0], d[1], d[2]
                );
                for k in 0..3 {
                    assert!(!d[k].is_nan(), "{name}, {backend}: a NaN");
                    worst[k] = worst[k].max(d[k]);
                }
            }
        }
        // Measured (fused or not): one frame 0, 0, 0; padded 2.1e-7, 2.9e-7, 2.9e-7; 300 keys
        // 3.2e-7, 2.7e-7, 2.7e-7 (f32 sums in another order). Bounds: 5x the largest.
        for (what, v, bound) in [
            ("weights", worst[0], 1.6e-6),
            ("content scores' gradient", worst[1], 1.5e-6),
            ("position scores' gradient", worst[2], 1.5e-6),
        ] {
            assert!(v <= bound, "{what}: differs by {v:.2e} (bound {bound:.1e})");
        }
    }
}
