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
//! shift's transpose); only the weights are kept. The weights' dropout runs inside the same
//! kernels (forward: the weights and the dropped weights written together; backward: the
//! mask applied to the incoming gradient), with the mask `device_dropout` would draw for the
//! weights' tensor at this call (element `row * T + j`): two launches fewer per layer.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors; `None` elsewhere, and the caller runs the tensor form.
//!
//! Invariants: for content scores `ac` `[B, H, T, T]`, position scores `bd` `[B, H, T, 2T - 1]`
//! (positions `T - 1 .. -(T - 1)`) and `keep` (`B * T` values, 1 on each utterance's valid
//! frames), the weights of query `i` over key `j` are the softmax over the valid keys of
//! `(ac[i, j] + bd[i, T - 1 - i + j]) / divisor`, and zero on padded keys (a row without a valid
//! key is all zero), and the output is those weights times the dropout's mask (in training);
//! no gradient reaches a padded key's scores. Masking with `-10000` as the
//! tensor form does gives the same weights wherever the valid scores lie within about 87 of each
//! other's maximum above `-10000` (f32's `exp` of the gap underflows), which scores do.

use asr_tdt::fusion::in_stream;
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

use super::device_dropout::mask_factor;
use super::device_op::{
    self, contiguous, cube_index, cube_max, cube_sum, cubes, empty, on_cube_types, DeviceBackward,
    CUBE,
};
use super::dropout::{Dropout, Rule};
use super::host_depthwise::{float, same};

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

/// The dropout's rule as a kernel's arguments ([`Rule::kernel_args`]); placeholders where there
/// is no dropout (the kernels then read none).
fn mask_args(rule: Option<Rule>) -> (u32, u32, u32, f32) {
    rule.map_or((0, 0, 0, 1.0), |r| r.kernel_args())
}

/// One cube per row `(b, h, i)` of `w` `[B, H, T, T]`: the softmax over the valid keys of the
/// scaled score sum, zero on padded keys; with `dropping`, also `y`, the weights times the
/// dropout's `mask` (element `row * T + j`, as `dropout_apply` on `w` would).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attention_forward(
    ac: &Array<f32>,
    bd: &Array<f32>,
    keep: &Array<f32>,
    w_out: &mut Array<f32>,
    y: &mut Array<f32>,
    rows: u32,
    heads: u32,
    t: u32,
    divisor: f32,
    k0: u32,
    k1: u32,
    threshold: u32,
    scale: f32,
    #[comptime] dropping: bool,
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
            let at = row * t + j;
            w_out[at as usize] = w;
            if dropping {
                y[at as usize] = w * mask_factor(at, k0, k1, threshold, scale);
            }
        }
    }
}

/// The weights' gradient at `at` from the output's `dy`: through the dropout's mask when
/// `dropping`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn weights_grad(
    dy: &Array<f32>,
    at: u32,
    k0: u32,
    k1: u32,
    threshold: u32,
    scale: f32,
    #[comptime] dropping: bool,
) -> f32 {
    let mut g = dy[at as usize];
    if dropping {
        g *= mask_factor(at, k0, k1, threshold, scale);
    }
    g
}

/// One cube per row `(b, h, i)`: with `dw` the weights' gradient (`dy`, through the dropout's
/// mask when `dropping`) and `dot` the sum over valid keys of `w * dw`, the content scores'
/// gradient `w (dw - dot) / divisor` (zero on padded keys) to `d_ac` `[B, H, T, T]` and the
/// same values at their positions of `d_bd` `[B, H, T, 2T - 1]` (zero where no key read it).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    w: &Array<f32>,
    keep: &Array<f32>,
    dy: &Array<f32>,
    d_ac: &mut Array<f32>,
    d_bd: &mut Array<f32>,
    rows: u32,
    heads: u32,
    t: u32,
    divisor: f32,
    k0: u32,
    k1: u32,
    threshold: u32,
    scale: f32,
    #[comptime] dropping: bool,
) {
    let row = cube_index();
    let mut shared = SharedMemory::<f32>::new(CUBE as usize);
    if row < rows {
        let (b, i) = row_of(row, heads, t);
        let n = 2 * t - 1;
        let mut part = 0.0f32;
        for j in range_stepped(UNIT_POS, t, CUBE_DIM) {
            if valid_key(keep, b, t, j) {
                let at = row * t + j;
                part += w[at as usize] * weights_grad(dy, at, k0, k1, threshold, scale, dropping);
            }
        }
        let dot = cube_sum(&mut shared, part);
        for j in range_stepped(UNIT_POS, t, CUBE_DIM) {
            let at = row * t + j;
            let mut g = 0.0f32;
            if valid_key(keep, b, t, j) {
                g = w[at as usize]
                    * (weights_grad(dy, at, k0, k1, threshold, scale, dropping) - dot)
                    / divisor;
            }
            d_ac[at as usize] = g;
        }
        // Position `p` was read by key `j = p + i - (T - 1)` when that lies in `0..T`.
        for p in range_stepped(UNIT_POS, n, CUBE_DIM) {
            let mut g = 0.0f32;
            if p + i + 1 >= t && p + i < n {
                let j = p + i + 1 - t;
                if valid_key(keep, b, t, j) {
                    let at = row * t + j;
                    g = w[at as usize]
                        * (weights_grad(dy, at, k0, k1, threshold, scale, dropping) - dot)
                        / divisor;
                }
            }
            d_bd[(row * n + p) as usize] = g;
        }
    }
}

/// The weights as one operation (see the module): the backends that have it.
pub trait DeviceAttention: Backend {
    /// The weights `w` `[B, H, T, T]` from `ac`, `bd` and `keep`, and `w` through `rule`'s
    /// dropout (`w` itself without one).
    fn attention_forward(
        ac: FloatTensor<Self>,
        bd: FloatTensor<Self>,
        keep: FloatTensor<Self>,
        divisor: f32,
        rule: Option<Rule>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The gradients of `ac` and `bd` from the weights `w` and the gradient `dy` of the
    /// forward's second output.
    fn attention_backward(
        w: FloatTensor<Self>,
        keep: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        divisor: f32,
        rule: Option<Rule>,
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
        rule: Option<Rule>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [b, h, t, _] = ac.shape().dims::<4>();
        let (ac, bd, keep) = (contiguous(ac), contiguous(bd), contiguous(keep));
        let client = ac.client.clone();
        let w = empty::<R>(&client, &ac.device, vec![b, h, t, t]);
        // Without a dropout the kernel writes no `y`: a one-element placeholder.
        let y = empty::<R>(
            &client,
            &ac.device,
            if rule.is_some() { vec![b, h, t, t] } else { vec![1] },
        );
        let rows = b * h * t;
        let (k0, k1, threshold, scale) = mask_args(rule);
        // Each cube reads its own row of the scores and its utterance's `keep`; the checked
        // launch bounds every access anyway.
        attention_forward::launch::<R>(
            &client,
            cubes(rows),
            CubeDim::new_1d(CUBE),
            ac.into_array_arg(),
            bd.into_array_arg(),
            keep.into_array_arg(),
            w.clone().into_array_arg(),
            y.clone().into_array_arg(),
            rows as u32,
            h as u32,
            t as u32,
            divisor,
            k0,
            k1,
            threshold,
            scale,
            rule.is_some(),
        );
        match rule {
            Some(_) => (w, y),
            None => (w.clone(), w),
        }
    }

    fn attention_backward(
        w: FloatTensor<Self>,
        keep: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        divisor: f32,
        rule: Option<Rule>,
    ) -> [FloatTensor<Self>; 2] {
        let [b, h, t, _] = w.shape().dims::<4>();
        let (w, keep, dy) = (contiguous(w), contiguous(keep), contiguous(dy));
        let client = w.client.clone();
        let d_ac = empty::<R>(&client, &w.device, vec![b, h, t, t]);
        let d_bd = empty::<R>(&client, &w.device, vec![b, h, t, 2 * t - 1]);
        let rows = b * h * t;
        let (k0, k1, threshold, scale) = mask_args(rule);
        attention_backward::launch::<R>(
            &client,
            cubes(rows),
            CubeDim::new_1d(CUBE),
            w.into_array_arg(),
            keep.into_array_arg(),
            dy.into_array_arg(),
            d_ac.clone().into_array_arg(),
            d_bd.clone().into_array_arg(),
            rows as u32,
            h as u32,
            t as u32,
            divisor,
            k0,
            k1,
            threshold,
            scale,
            rule.is_some(),
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
        rule: Option<Rule>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let out = (ac.shape.to_vec(), DType::F32);
        let inputs = [ac, bd, keep];
        let run = move |[ac, bd, keep]: [FloatTensor<B>; 3]| {
            B::attention_forward(ac, bd, keep, divisor, rule)
        };
        match rule {
            Some(_) => {
                let [w, y] = in_stream::<B, _, 3, 2>(
                    "attention_forward",
                    inputs,
                    [out.clone(), out],
                    move |i| {
                        let (w, y) = run(i);
                        [w, y]
                    },
                );
                (w, y)
            }
            // Without a dropout the weights are the output: one tensor, registered once.
            None => {
                let [w] =
                    in_stream::<B, _, 3, 1>(
                        "attention_forward",
                        inputs,
                        [out],
                        move |i| [run(i).0],
                    );
                (w.clone(), w)
            }
        }
    }

    fn attention_backward(
        w: FloatTensor<Self>,
        keep: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        divisor: f32,
        rule: Option<Rule>,
    ) -> [FloatTensor<Self>; 2] {
        // [b, h, t, t] -> the scores' gradients [b, h, t, t] and [b, h, t, 2t - 1].
        let scores = w.shape.to_vec();
        let mut shifted = scores.clone();
        if let Some(last) = shifted.last_mut() {
            *last = (2 * *last).saturating_sub(1);
        }
        in_stream::<B, _, 3, 2>(
            "attention_backward",
            [w, keep, dy],
            [(scores, DType::F32), (shifted, DType::F32)],
            move |[w, keep, dy]| B::attention_backward(w, keep, dy, divisor, rule),
        )
    }
}

/// The weights' backward, a [`DeviceBackward`] of the two score parts, keeping the weights and
/// `keep` (shared, not copied) and the dropout's rule.
#[derive(Debug, Clone, Copy)]
struct AttentionBackward {
    divisor: f32,
    rule: Option<Rule>,
}

impl<B: DeviceAttention> DeviceBackward<B, 2> for AttentionBackward {
    type Saved = [FloatTensor<B>; 2];

    fn backward(&self, [w, keep]: [FloatTensor<B>; 2], dy: FloatTensor<B>) -> [FloatTensor<B>; 2] {
        B::attention_backward(w, keep, dy, self.divisor, self.rule)
    }
}

/// The weights through the dropout under autodiff: one node with the two score parts as
/// parents (`keep` takes no gradient), keeping the weights before the dropout.
fn tracked<B: DeviceAttention>(
    ac: Tensor<Autodiff<B>, 4>,
    bd: Tensor<Autodiff<B>, 4>,
    keep: Tensor<Autodiff<B>, 3>,
    divisor: f32,
    rule: Option<Rule>,
) -> Tensor<Autodiff<B>, 4> {
    let keep = float(keep).primitive;
    let op = AttentionBackward { divisor, rule };
    let y = device_op::tracked_with(op, [float(ac), float(bd)], |_, [ac, bd]| {
        let (w, y) = B::attention_forward(ac, bd, keep.clone(), divisor, rule);
        (y, [w, keep])
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The weights without autodiff (evaluation).
fn bare<B: DeviceAttention>(
    ac: Tensor<B, 4>,
    bd: Tensor<B, 4>,
    keep: Tensor<B, 3>,
    divisor: f32,
) -> Tensor<B, 4> {
    let (w, _) = B::attention_forward(float(ac), float(bd), float(keep), divisor, None);
    Tensor::from_primitive(TensorPrimitive::Float(w))
}

/// The attention's weights (see the module) from `ac` `[B, H, T, T]`, `bd` `[B, H, T, 2T - 1]`
/// and `keep` `[B, T, 1]`, divided by `divisor` before the softmax, through `dropout`, as one
/// operation where the backend is one of the trainer's CubeCL types (bare or under autodiff)
/// and the tensors f32; `ac` and `bd` given back elsewhere (and the dropout has taken no
/// seed). The scores are taken, not borrowed: the operation holds the last handle on each
/// where the caller gave it up (under fusion, queued read-write), where a clone left the
/// caller's to be dropped after, a drop operation of fusion's stream (bench/RESULTS.md,
/// 2026-12-01, "The old parameters released").
pub fn on_device<B: Backend>(
    ac: Tensor<B, 4>,
    bd: Tensor<B, 4>,
    keep: &Tensor<B, 3>,
    divisor: f64,
    dropout: &Dropout,
) -> Result<Tensor<B, 4>, (Tensor<B, 4>, Tensor<B, 4>)> {
    let [b, h, t, t2] = ac.dims();
    if t == 0
        || t2 != t
        || bd.dims() != [b, h, t, 2 * t - 1]
        || keep.dims() != [b, t, 1]
        || [ac.dtype(), bd.dtype(), keep.dtype()].iter().any(|d| *d != DType::F32)
        || b * h * t * (2 * t - 1) > u32::MAX as usize
    {
        return Err((ac, bd));
    }
    let d = divisor as f32;
    on_cube_types!(
        B,
        T,
        {
            let ac: Tensor<Autodiff<T>, 4> = same(ac);
            let (bd, keep) = (same(bd), same(keep.clone()));
            // The seed is taken only once the operation is sure to run: a fallback draws its own.
            let rule = dropout.draw::<Autodiff<T>>(&ac.device());
            Ok(same(tracked::<T>(ac, bd, keep, d, rule)))
        },
        { Ok(same(bare::<T>(same(ac), same(bd), same(keep.clone()), d))) }
    );
    Err((ac, bd))
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_op::relative_difference as difference;
    use crate::model::encoder::attention_weights_tensor_form;
    use burn::tensor::Distribution;

    /// The operation against the tensor form on the same backend (with `rule`'s dropout, the
    /// tensor form's weights times the host's mask): the weights and both score parts'
    /// gradients under a weighted sum of the weights, largest difference relative to the
    /// largest value.
    fn against_the_tensor_form<B: DeviceAttention>(
        lens: &[usize],
        t: usize,
        heads: usize,
        rule: Option<Rule>,
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
                tracked::<B>(aca.clone(), bda.clone(), keep_a, divisor as f32, rule)
            } else {
                let pad = Tensor::<A<B>, 4, Bool>::from_inner(pad.clone());
                let w = attention_weights_tensor_form(aca.clone(), bda.clone(), pad, divisor);
                match rule {
                    Some(rule) => {
                        let mask = TensorData::new(rule.mask(b * heads * t * t), [b, heads, t, t]);
                        w * Tensor::from_data(mask, &device)
                    }
                    None => w,
                }
            };
            let grads = (w.clone() * Tensor::from_inner(weights.clone())).sum().backward();
            (w.inner(), aca.grad(&grads).unwrap(), bda.grad(&grads).unwrap())
        };
        let (w, d_ac, d_bd) = run(true);
        let (w0, d_ac0, d_bd0) = run(false);
        if rule.is_none() {
            let plain = bare::<B>(ac, bd, keep, divisor as f32);
            assert_eq!(
                plain.into_data().into_vec::<f32>().unwrap(),
                w.clone().into_data().into_vec::<f32>().unwrap(),
                "bare and tracked forwards differ"
            );
        }
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
        // Without a dropout, and with one (keeping 0.8, the mask the dropout's own kernel would
        // draw for the weights).
        for (name, lens, t) in cases {
            for (dropping, rule) in
                [("", None), (", dropout", Some(Rule::new(0xabc_0000_0042, 0.8)))]
            {
                for (backend, d) in [
                    ("wgpu", against_the_tensor_form::<Wgpu>(lens, t, 2, rule)),
                    ("fused wgpu", against_the_tensor_form::<Fused>(lens, t, 2, rule)),
                ] {
                    eprintln!(
                        "{name}{dropping}, {backend}: w {:.1e}, d_ac {:.1e}, d_bd {:.1e}",
                        d[0], d[1], d[2]
                    );
                    for k in 0..3 {
                        assert!(!d[k].is_nan(), "{name}, {backend}: a NaN");
                        worst[k] = worst[k].max(d[k]);
                    }
                }
            }
        }
        // Measured (fused or not): one frame 0, 0, 0; padded 2.1e-7, 2.9e-7, 2.9e-7 (with the
        // dropout 2.4e-7, 3.7e-7, 3.7e-7); 300 keys 3.2e-7, 2.7e-7, 2.7e-7 (2.6e-7, 2.1e-7,
        // 2.1e-7): f32 sums in another order. Bounds: 5x the largest at most.
        for (what, v, bound) in [
            ("weights", worst[0], 1.6e-6),
            ("content scores' gradient", worst[1], 1.5e-6),
            ("position scores' gradient", worst[2], 1.5e-6),
        ] {
            assert!(v <= bound, "{what}: differs by {v:.2e} (bound {bound:.1e})");
        }
    }
}
