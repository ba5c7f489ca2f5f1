//! A linear layer's product `x [rows, in] · w [in, out]` launched with a chosen CubeCL matmul
//! kernel (`cubek`'s strategies) on the CubeCL backends (wgpu, CUDA; fused or not), and its two
//! gradients (`dy · wᵀ`, `xᵀ · dy`) with the same kernel.
//!
//! Why: without autotune Burn runs one fixed kernel, under fusion cubek's simple cyclic CMMA
//! (TF32 on CUDA for f32). On an H200 the 0.6B step's 1,314 products took 0.240 s of its
//! 0.474 s of device time, about 21 TFLOP/s (bench/RESULTS.md, "The step on the device").
//! Autotune picks per shape but timed candidates for minutes on the first steps
//! (README, "Kernel cache"). Here `asrt-bench matmul` times each kernel at the preset's shapes
//! once, and `--matmul KERNEL` trains with the fastest. On CUDA the default is `cublas`, the
//! fastest there (0.23 ms over the preset's five product cases against Burn's 1.39 ms on an
//! H200; the 0.6B step 0.205 s against 0.290 s); Burn's product elsewhere.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors, whatever the kernel ([`Kernel::Burn`] is the inner backend's
//! `float_matmul` inside the operation); Burn's `matmul` elsewhere. The input may have leading axes
//! (`[B, T, in]`): the operation views them as rows itself, and transposes the operands of the
//! gradients itself, so that under fusion each of the three products is one operation of its stream
//! with no reshape or transposition beside it ([`DeviceMatmul::linear_product`]; they were 1,570 of
//! the 0.6B step's 7,116 operations, bench/RESULTS.md, 2026-12-01). The layer is one operation each
//! way, its bias included ([`linear`]): the forward's product and the bias's addition, the
//! backward's two products and the bias's sum (`device_bias`'s kernels), not five operations. A
//! kernel the device cannot run (CMMA on lavapipe, TMA before Hopper, TMA on rows not a multiple of
//! 16 bytes) falls back to Burn's product for that product, saying so once per product and weight
//! shape. Mixed precision's products of two matrices take the chosen kernel too, on operands
//! already rounded to the half type ([`chosen_product`]).
//!
//! Under `--matmul cublas` with `ASRT_CUBLAS_STACKS=1` the attention's stacks of products
//! (`[B, H, m, k] · [B or 1, H, k, n]`: the content and position scores, the weights times the
//! values) go through cuBLAS too, as strided-batched calls ([`stacked`],
//! `cublas_product::batched`), with their gradients; by default they are Burn's product, which
//! an H200's step measured as fast or faster ([`stacks_to_cublas`]). (cubek's kernels are not
//! offered for them: Burn's product already is one.) Either way a stack and each of its
//! gradients is one operation, which transposes its operands itself
//! ([`DeviceMatmul::stack_product`]).
//!
//! Invariants: the product and its gradients are Burn's within the kernel's rounding (TF32's 10-bit
//! mantissa on CUDA's tensor cores); the input's gradient is computed only where the input is
//! tracked, and so are the weight's and the bias's; a layer with its bias gives the bits of the
//! product followed by `device_bias`'s addition, both ways. A stack's operand of outer size 1 (read
//! by every outer index) gets its gradient summed over the outer axis.

use std::sync::Mutex;

use asr_tdt::fusion::{in_stream, in_stream_vec};
use burn::backend::Autodiff;
use burn::prelude::*;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::Strategy;
use cubek::matmul::routines::double_buffering::DoubleBufferingArgs;
use cubek::matmul::routines::ordered_double_buffering::{
    OrderedDoubleBufferingAlgorithm, OrderedSelectionArgs,
};
use cubek::matmul::routines::simple::SimpleArgs;
use cubek::matmul::routines::{BlueprintStrategy, Routine};
use cubek::std::InputBinding;

use super::device_bias::DeviceBias;
use super::device_dropout::DeviceDropout;
use super::device_gates::{After, DeviceGates, Gate};
use super::device_layer_norm::DeviceLayerNorm;
use super::device_op::{self, contiguous, empty, on_cube_types, DeviceBackward, DeviceOp};
use super::dropout::{Dropout, NextNorm, Rule};
use super::handoff::Handoff;
use super::host_depthwise::{cast, float, same};
pub use super::matmul_kernel::{chosen, Kernel};

/// cubek's strategy for `kernel`, with the blueprint inferred from the problem; `None` for
/// Burn's.
fn strategy(kernel: Kernel) -> Option<Strategy> {
    Some(match kernel {
        // cuBLAS is no cubek strategy: `try_product` takes it first.
        Kernel::Burn | Kernel::Cublas => return None,
        Kernel::SimpleCyclicCmma => Strategy::SimpleCyclicCmma(Default::default()),
        Kernel::SimpleCyclicMma => Strategy::SimpleCyclicMma(Default::default()),
        Kernel::SimpleTmaCmma => Strategy::SimpleTmaCmma(Default::default()),
        Kernel::DoubleCyclicCmma => Strategy::DoubleCyclicCmma(Default::default()),
        Kernel::DoubleCyclicMma => Strategy::DoubleCyclicMma(Default::default()),
        Kernel::DoubleTilewiseCmma => Strategy::DoubleTilewiseCmma(Default::default()),
        Kernel::DoubleHybridCmma => Strategy::DoubleHybridCmma(Default::default()),
        Kernel::DoubleTmaCmma => Strategy::DoubleTmaCmma(Default::default()),
        Kernel::DoubleTmaMma => Strategy::DoubleTmaMma(Default::default()),
        Kernel::SpecializedCyclicCmma => Strategy::SpecializedCyclicCmma(Default::default()),
        Kernel::SpecializedTmaCmma => Strategy::SpecializedTmaCmma(Default::default()),
        Kernel::OrderedDoubleCmma => Strategy::OrderedDoubleCmma(Default::default()),
        Kernel::OrderedDoubleMma => Strategy::OrderedDoubleMma(Default::default()),
        Kernel::SimpleCyclicCmmaMultiRows => Strategy::SimpleCyclicCmma(multi_rows()),
        Kernel::SimpleCyclicMmaMultiRows => Strategy::SimpleCyclicMma(multi_rows()),
        Kernel::SimpleTmaMma => Strategy::SimpleTmaMma(Default::default()),
        Kernel::SimpleTmaCmmaMultiRows => Strategy::SimpleTmaCmma(multi_rows()),
        Kernel::SimpleTmaMmaMultiRows => Strategy::SimpleTmaMma(multi_rows()),
        Kernel::DoubleCyclicMmaSpecialized => Strategy::DoubleCyclicMma(specialized()),
        Kernel::DoubleTmaCmmaSpecialized => Strategy::DoubleTmaCmma(specialized()),
        Kernel::DoubleTmaMmaSpecialized => Strategy::DoubleTmaMma(specialized()),
        Kernel::DoubleAsyncCyclicMma => Strategy::DoubleAsyncCyclicMma(Default::default()),
        Kernel::DoubleAsyncStridedMma => Strategy::DoubleAsyncStridedMma(Default::default()),
        Kernel::SpecializedCyclicMma => Strategy::SpecializedCyclicMma(Default::default()),
        Kernel::SpecializedTmaMma => Strategy::SpecializedTmaMma(Default::default()),
        Kernel::OrderedDoubleMmaRows4 => Strategy::OrderedDoubleMma(ordered(4)),
        Kernel::OrderedDoubleMmaRows8 => Strategy::OrderedDoubleMma(ordered(8)),
        Kernel::SimpleUnit => Strategy::SimpleUnit(Default::default()),
        Kernel::DoubleUnit => Strategy::DoubleUnit(Default::default()),
    })
}

/// Inferred blueprint, several rows of tiles per plane (the tile kind is stamped by the strategy).
fn multi_rows<A>() -> BlueprintStrategy<(), A>
where
    A: Routine<(), Strategy = SimpleArgs>,
{
    BlueprintStrategy::Inferred(SimpleArgs { multi_rows: true, ..Default::default() })
}

/// Inferred blueprint, loading and computing warps specialised.
fn specialized<A>() -> BlueprintStrategy<(), A>
where
    A: Routine<(), Strategy = DoubleBufferingArgs>,
{
    BlueprintStrategy::Inferred(DoubleBufferingArgs { specialized: true, ..Default::default() })
}

/// Inferred blueprint of the ordered double buffering with `rows` rows of planes, k split in 2
/// partitions and 2 rows per plane (Burn's autotune's two settings).
fn ordered(rows: u32) -> BlueprintStrategy<(), OrderedDoubleBufferingAlgorithm> {
    BlueprintStrategy::Inferred(OrderedSelectionArgs {
        partition_k: Some(2),
        row_count: Some(rows),
        rows_per_plane: Some(2),
        ..Default::default()
    })
}

/// Which of a linear layer's three products, and its weight's shape `[in, out]`: where a kernel
/// falls back, the warning names it (on an H200 TMA refused some of the 0.6B step's products,
/// "strides aligned to 16 bytes", and the log did not say which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Site {
    /// `forward`, `input gradient` or `weight gradient`.
    pub form: &'static str,
    /// The weight's `[in, out]`.
    pub weight: [usize; 2],
}

/// Which of a linear layer's three products, `y [.., out] = x [.., in] · w [in, out]` and its
/// gradients: the leading axes of `x` and of `dy` are the product's rows, viewed as a matrix
/// inside the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `x [.., in] · w`, `[.., out]`.
    Forward,
    /// `dy [.., out] · wᵀ`, `[.., in]`.
    InputGradient,
    /// `xᵀ · dy` over the rows of both, `[in, out]`.
    WeightGradient,
}

impl Form {
    /// The form's name in a fallback's warning.
    pub fn name(self) -> &'static str {
        match self {
            Form::Forward => "forward",
            Form::InputGradient => "input gradient",
            Form::WeightGradient => "weight gradient",
        }
    }

    /// The output's shape, and the weight's `[in, out]`, from the operands' shapes (`x` and
    /// `w`, `dy` and `w`, or `x` and `dy`).
    fn shapes(self, a: &[usize], b: &[usize]) -> (Vec<usize>, [usize; 2]) {
        let last = |d: &[usize]| d.last().copied().unwrap_or(1);
        let leading = |d: &[usize], n: usize| {
            let mut d = d.to_vec();
            if let Some(l) = d.last_mut() {
                *l = n;
            }
            d
        };
        match self {
            Form::Forward => (leading(a, b[1]), [b[0], b[1]]),
            Form::InputGradient => (leading(a, b[0]), [b[0], b[1]]),
            Form::WeightGradient => (vec![last(a), last(b)], [last(a), last(b)]),
        }
    }
}

/// Kernels and sites that failed to launch, each reported once.
static REPORTED: Mutex<Vec<(Kernel, Site)>> = Mutex::new(Vec::new());

/// Says once per kernel and site that it could not run there and Burn's product is used
/// instead.
fn report_fallback(kernel: Kernel, site: Site, why: &str) {
    let Ok(mut seen) = REPORTED.lock() else { return };
    if !seen.contains(&(kernel, site)) {
        seen.push((kernel, site));
        let [i, o] = site.weight;
        eprintln!(
            "warning: --matmul {}: cannot run the {} product of a [{i}, {o}] weight on this \
             device ({why}); Burn's product is used there",
            kernel.name(),
            site.form
        );
    }
}

/// A stack's product with Burn's own kernel, summed over the outer axis where `sum_outer`.
fn burn_stacked<B: Backend>(
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    sum_outer: bool,
) -> FloatTensor<B> {
    let y = B::float_matmul(a, b);
    if sum_outer {
        B::float_sum_dim(y, 0)
    } else {
        y
    }
}

/// Stack forms that failed to go through cuBLAS, each reported once.
static STACKS_REPORTED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

/// Says once per form that a stack of products could not go through cuBLAS.
fn report_stack_fallback(form: &'static str, why: &str) {
    let Ok(mut seen) = STACKS_REPORTED.lock() else { return };
    if !seen.contains(&form) {
        seen.push(form);
        eprintln!(
            "warning: --matmul cublas: cannot run the attention's {form} products through cuBLAS \
             on this device ({why}); Burn's product is used there"
        );
    }
}

/// The product with a chosen kernel, and a linear layer's bias with it: the backends that have
/// them.
pub trait DeviceMatmul: DeviceBias + DeviceDropout + DeviceGates + DeviceLayerNorm {
    /// `a [m, k] · b [k, n]` (either may be a transposed view) with `kernel`, written in f32,
    /// or why it could not run. The operands are f32, or both of mixed precision's half type
    /// (`device_mixed`), which the kernel multiplies as they are, accumulating in f32.
    fn try_product(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        kernel: Kernel,
    ) -> Result<FloatTensor<Self>, String>;

    /// The stack `a [O, H, m, k] · b [O or 1, H, k, n]` (either's `O` may be 1) with `kernel`,
    /// `[O, H, m, n]` in f32, summed over the outer axis into `[1, H, m, n]` where `sum_outer`;
    /// or why it could not run. Only cuBLAS takes stacks (see the module).
    fn try_stacked(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        kernel: Kernel,
        sum_outer: bool,
    ) -> Result<FloatTensor<Self>, String>;

    /// The stack `op(a) · op(b)` (`op` transposing the last two axes of the operands that
    /// `transposed` names) with `kernel`, summed over the outer axis into `[1, H, m, n]` where
    /// `sum_outer`: Burn's product (and sum) for [`Kernel::Burn`], else [`Self::stacked`]. The
    /// transpositions are views of the backend's tensors, inside the one operation under
    /// fusion: its stream holds no swap of axes beside the attention's products (240 a step at
    /// the 0.6B preset's 24 layers before, bench/RESULTS.md, 2026-12-01).
    fn stack_product(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        transposed: [bool; 2],
        sum_outer: bool,
        kernel: Kernel,
        form: &'static str,
    ) -> FloatTensor<Self> {
        let op = |t, yes| if yes { Self::float_swap_dims(t, 2, 3) } else { t };
        let (a, b) = (op(a, transposed[0]), op(b, transposed[1]));
        if kernel == Kernel::Burn {
            burn_stacked::<Self>(a, b, sum_outer)
        } else {
            Self::stacked(a, b, kernel, sum_outer, form)
        }
    }

    /// [`Self::try_stacked`], else Burn's product (and sum), reporting why once per `form`.
    fn stacked(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        kernel: Kernel,
        sum_outer: bool,
        form: &'static str,
    ) -> FloatTensor<Self> {
        match Self::try_stacked(a.clone(), b.clone(), kernel, sum_outer) {
            Ok(y) => y,
            Err(why) => {
                report_stack_fallback(form, &why);
                burn_stacked::<Self>(a, b, sum_outer)
            }
        }
    }

    /// The linear layer's product of `form` (operands `x` and `w`, `dy` and `w`, or `x` and
    /// `dy`; see [`Form`]) with `kernel`, else Burn's product (reporting why once per site).
    /// The leading axes are flattened and the transposed operand is transposed here, on the
    /// backend's tensors, where a contiguous tensor's reshape and any tensor's transposition
    /// are views: under fusion the whole product is then one operation of its stream, not
    /// five (two reshapes and two transpositions of the 0.6B step's linear layers were 1,570
    /// of its 7,116 operations; bench/RESULTS.md, 2026-12-01).
    fn linear_product(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        form: Form,
        kernel: Kernel,
    ) -> FloatTensor<Self> {
        let (out, weight) = form.shapes(&a.shape(), &b.shape());
        let site = Site { form: form.name(), weight };
        let y = match form {
            Form::Forward => Self::product(rows::<Self>(a), b, kernel, site),
            Form::InputGradient => {
                Self::product(rows::<Self>(a), Self::float_transpose(b), kernel, site)
            }
            Form::WeightGradient => {
                let x = Self::float_transpose(rows::<Self>(a));
                Self::product(x, rows::<Self>(b), kernel, site)
            }
        };
        if y.shape().as_slice() == out.as_slice() {
            y
        } else {
            Self::float_reshape(y, out.into())
        }
    }

    /// A linear layer, `x [.., in] · w` plus `b` `[out]` on every row where given:
    /// [`Self::linear_product`], then the bias's addition (`device_bias`). Under fusion one
    /// operation of its stream, not two ([`Fusion`]'s override).
    fn linear_forward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: Option<FloatTensor<Self>>,
        kernel: Kernel,
    ) -> FloatTensor<Self> {
        let y = Self::linear_product(x, w, Form::Forward, kernel);
        match b {
            Some(b) => Self::bias_add(y, b),
            None => y,
        }
    }

    /// A linear layer's gradients from its output's `dy` `[.., out]`, in the order input,
    /// weight, bias: the input's where the weight `w` is given ([`Form::InputGradient`]), the
    /// weight's where the input `x` is ([`Form::WeightGradient`]), the bias's where `bias` (the
    /// rows of `dy` summed, `device_sum`). Under fusion one operation of its stream, not one
    /// each ([`Fusion`]'s override).
    fn linear_grads(
        dy: FloatTensor<Self>,
        w: Option<FloatTensor<Self>>,
        x: Option<FloatTensor<Self>>,
        bias: bool,
        kernel: Kernel,
    ) -> [Option<FloatTensor<Self>>; 3] {
        let dx = w.map(|w| Self::linear_product(dy.clone(), w, Form::InputGradient, kernel));
        let dw = x.map(|x| Self::linear_product(x, dy.clone(), Form::WeightGradient, kernel));
        let db = bias.then(|| super::device_bias::bias_grad::<Self>(dy));
        [dx, dw, db]
    }

    /// A linear layer with its bias and the residual connection after it,
    /// `x + (h · w + b)` times `rule`'s mask: [`Self::linear_product`], then the bias and the
    /// residual in one kernel (`device_dropout`'s `bias_residual_apply`). Under fusion one
    /// operation of its stream, not two ([`Fusion`]'s override).
    fn linear_residual_forward(
        x: FloatTensor<Self>,
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
        rule: Rule,
        kernel: Kernel,
    ) -> FloatTensor<Self> {
        let p = Self::linear_product(h, w, Form::Forward, kernel);
        Self::bias_residual_apply(rule, x, p, b)
    }

    /// [`Self::linear_residual_forward`], then the layer normalisation of its output by `gamma`
    /// and `beta`: `[the residual's output, the normalised, the normalisation's stats]`, the
    /// residual's kernel and the normalisation's forward one kernel
    /// (`DeviceLayerNorm::bias_residual_norm`). Under fusion one operation of its stream.
    #[allow(clippy::too_many_arguments)]
    fn linear_residual_norm_forward(
        x: FloatTensor<Self>,
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
        rule: Rule,
        kernel: Kernel,
        [gamma, beta]: [FloatTensor<Self>; 2],
        eps: f64,
    ) -> [FloatTensor<Self>; 3] {
        let p = Self::linear_product(h, w, Form::Forward, kernel);
        Self::bias_residual_norm(rule, x, p, b, gamma, beta, eps)
    }

    /// The gradients of [`Self::linear_residual_forward`]'s `h`, `w` and `b`, each where asked
    /// as in [`Self::linear_grads`], from the output's `dy`: the mask applied to `dy`, then the
    /// layer's (`x`'s is `dy` itself). The masked gradient and the bias's, its rows summed, are
    /// one kernel where the backend has it ([`DeviceDropout::dropout_row_sums`]): 96 of the
    /// step's launches at 24 layers (bench/RESULTS.md, 2026-12-07, "The masked gradient and the
    /// bias's sum"). Under fusion one operation of its stream.
    fn linear_residual_grads(
        dy: FloatTensor<Self>,
        w: Option<FloatTensor<Self>>,
        h: Option<FloatTensor<Self>>,
        bias: bool,
        rule: Rule,
        kernel: Kernel,
    ) -> [Option<FloatTensor<Self>>; 3] {
        if w.is_none() && h.is_none() && !bias {
            return [None, None, None];
        }
        let dy = if bias {
            match Self::dropout_row_sums(rule, dy) {
                Ok([g, db]) => {
                    let [dx, dw, _] = Self::linear_grads(g, w, h, false, kernel);
                    return [dx, dw, Some(db)];
                }
                Err(dy) => dy,
            }
        } else {
            dy
        };
        Self::linear_grads(Self::dropout_apply(rule, dy), w, h, bias, kernel)
    }

    /// A linear layer with its bias and a gate after it, `gate(h · w + b)` then `after`:
    /// [`Self::linear_product`], then the bias, the gate and the mask in one kernel where the
    /// backend has it (`device_gates`' `bias_gate_forward_then`). Returns the output and
    /// `h · w + b`, the gate's input, which the backward keeps. Under fusion one operation of
    /// its stream, not two ([`Fusion`]'s override).
    fn linear_gate_forward(
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
        gate: Gate,
        after: After<Self>,
        kernel: Kernel,
    ) -> [FloatTensor<Self>; 2] {
        let p = Self::linear_product(h, w, Form::Forward, kernel);
        Self::bias_gate_forward_then(gate, after, p, b)
    }

    /// The gradients of [`Self::linear_gate_forward`]'s `h`, `w` and `b`, each where asked as in
    /// [`Self::linear_grads`], from the output's `dy` and the gate's input `x` it kept: the gate's
    /// backward through the mask (`gate_backward_then`), then the layer's. The gate's backward
    /// and the bias's gradient, its rows summed, are one kernel where the backend has it
    /// (`gate_backward_then_row_sums`). Under fusion one operation of its stream, not two.
    #[allow(clippy::too_many_arguments)]
    fn linear_gate_grads(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        w: Option<FloatTensor<Self>>,
        h: Option<FloatTensor<Self>>,
        bias: bool,
        gate: Gate,
        after: After<Self>,
        kernel: Kernel,
    ) -> [Option<FloatTensor<Self>>; 3] {
        if w.is_none() && h.is_none() && !bias {
            return [None, None, None];
        }
        if bias {
            if let Some([g, db]) = Self::gate_backward_then_row_sums(gate, &after, &x, &dy) {
                let [dh, dw, _] = Self::linear_grads(g, w, h, false, kernel);
                return [dh, dw, Some(db)];
            }
        }
        let g = Self::gate_backward_then(gate, after, x, dy);
        Self::linear_grads(g, w, h, bias, kernel)
    }

    /// [`Self::try_product`], else Burn's product (reporting why once per site).
    fn product(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        kernel: Kernel,
        site: Site,
    ) -> FloatTensor<Self> {
        try_reported::<Self>(&a, &b, kernel, site).unwrap_or_else(|| Self::float_matmul(a, b))
    }
}

/// `t` `[.., k]` as the matrix `[rows, k]` of its leading axes (itself where it is one).
fn rows<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let dims = t.shape();
    let k = dims.as_slice().last().copied().unwrap_or(1);
    let rows = dims.as_slice().iter().rev().skip(1).product::<usize>();
    device_op::as_matrix::<B>(t, rows, k)
}

/// [`DeviceMatmul::try_product`], or `None` where the kernel cannot run, said once per kernel
/// and site: the caller then runs its own product.
fn try_reported<B: DeviceMatmul>(
    a: &FloatTensor<B>,
    b: &FloatTensor<B>,
    kernel: Kernel,
    site: Site,
) -> Option<FloatTensor<B>> {
    B::try_product(a.clone(), b.clone(), kernel)
        .map_err(|why| report_fallback(kernel, site, &why))
        .ok()
}

impl<R, F, I, BT> DeviceMatmul for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn try_product(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        kernel: Kernel,
    ) -> Result<FloatTensor<Self>, String> {
        if kernel == Kernel::Cublas {
            return cublas::<R>(a, b, None);
        }
        let Some(strategy) = strategy(kernel) else {
            // Half-type operands: mixed precision's own product, writing f32.
            return Ok(if a.dtype == DType::F32 {
                Self::float_matmul(a, b)
            } else {
                super::device_mixed::burn_product_f32::<R, F, I, BT>(a, b)
            });
        };
        let (m, n) = (a.shape()[0], b.shape()[1]);
        let (client, device) = (a.client.clone(), a.device.clone());
        let out = empty::<R>(&client, &device, vec![m, n]);
        if m == 0 || n == 0 {
            return Ok(out);
        }
        // cubek reads strided operands; other layouts than a plain or transposed matrix are
        // made contiguous first, and rows not 16 bytes apart are copied into rows that are.
        let (lhs, rhs) = (a.dtype, b.dtype);
        let operand = |t: FloatTensor<Self>| {
            let t = aligned_rows(if is_matrix_view(&t) { t } else { contiguous(t) });
            let dtype = t.dtype;
            InputBinding::new(t.binding(), dtype.into())
        };
        let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
            lhs: lhs.into(),
            rhs: rhs.into(),
            out: DType::F32.into(),
        });
        cubek::matmul::launch::launch_ref(
            &strategy,
            &client,
            operand(a),
            operand(b),
            out.clone().binding(),
            &mut dtypes,
        )
        .map_err(|e| format!("{e:?}").trim().replace('\n', "; "))?;
        Ok(out)
    }

    fn try_stacked(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        kernel: Kernel,
        sum_outer: bool,
    ) -> Result<FloatTensor<Self>, String> {
        if kernel != Kernel::Cublas {
            return Err(format!("{} takes no stacks of products; cuBLAS does", kernel.name()));
        }
        cublas::<R>(a, b, Some(sum_outer))
    }
}

/// The product through cuBLAS where `R` is CUDA's runtime (`model::cublas_product`), else why
/// not: a matrix product where `stack` is `None`, else a stack's, summed over its outer axis
/// where `stack` is `Some(true)`.
fn cublas<R: CubeRuntime>(
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    stack: Option<bool>,
) -> Result<CubeTensor<R>, String> {
    // The casts take the tensors (no clone on this per-product path): where `R` is not CUDA's
    // runtime both casts fail and the tensors are dropped with them.
    #[cfg(feature = "cuda")]
    if let (Some(a), Some(b)) = (
        cast::<_, CubeTensor<burn_cubecl::cubecl::cuda::CudaRuntime>>(a),
        cast::<_, CubeTensor<burn_cubecl::cubecl::cuda::CudaRuntime>>(b),
    ) {
        let y = match stack {
            None => super::cublas_product::product(a, b),
            Some(sum_outer) => super::cublas_product::batched(a, b, sum_outer),
        };
        let y = y.map_err(|e| e.to_string())?;
        return cast::<_, CubeTensor<R>>(y).ok_or_else(|| "CUDA's tensor type".to_string());
    }
    #[cfg(not(feature = "cuda"))]
    drop((a, b, stack));
    Err("cuBLAS runs on CUDA only".to_string())
}

/// Whether `t` is a row-major matrix or its transpose (unit stride on one axis, the other's
/// stride at least that axis's length).
fn is_matrix_view<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    let (shape, strides) = (t.meta.shape(), t.meta.strides());
    shape.num_dims() == 2
        && ((strides[1] == 1 && strides[0] >= shape[1])
            || (strides[0] == 1 && strides[1] >= shape[0]))
}

/// The distance in bytes between a matrix operand's rows (along its stride that is not 1)
/// that cubek's TMA and `cp.async` loads require ("strides aligned to 16 bytes").
const ROW_ALIGN: usize = 16;

/// The stride of a matrix view (see [`is_matrix_view`]) that is not its unit one: between rows
/// of a row-major view, between columns of a transposed one. A row-major view wins a tie
/// (`[m, 1]`, strides `[1, 1]`), as cubek decides its layout.
fn outer_stride(strides: &[usize]) -> usize {
    if strides[1] == 1 {
        strides[0]
    } else {
        strides[1]
    }
}

/// `t`, a matrix view, as it is where its [`outer_stride`] is a multiple of [`ROW_ALIGN`]
/// bytes; else a row-major copy of it whose rows are padded to that (the padding is never
/// read).
///
/// Why: TMA and `cp.async` kernels refuse other operands, and on an H200 the joint's output
/// layer, `[640, 1030]` (4,120-byte rows), was the one linear layer whose three products
/// fell back to Burn's slower kernel (bench/RESULTS.md, 2026-11-29). Every chosen kernel
/// reads the copy, so the unit kernels' tests on lavapipe cover it. The copy costs one pass
/// over the operand: for that layer's logits gradient, about 0.5 GB, a fraction
/// of a millisecond on an H200's HBM, against a product of 0.17 TFLOP.
fn aligned_rows<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let size = t.dtype.size();
    let (rows, cols) = (t.meta.shape()[0], t.meta.shape()[1]);
    if (outer_stride(t.meta.strides()) * size).is_multiple_of(ROW_ALIGN) || rows * cols == 0 {
        return t;
    }
    let pitch = (cols * size).next_multiple_of(ROW_ALIGN) / size;
    let (client, device, dtype) = (t.client.clone(), t.device.clone(), t.dtype);
    // `empty`'s buffer (poisoned with NaN in the tests), counted in f32: rows of a multiple of
    // 16 bytes hold a whole number of them.
    let buffer = empty::<R>(&client, &device, vec![rows * pitch * size / 4]);
    let mut meta = (*t.meta).clone();
    meta.strides[0] = pitch;
    meta.strides[1] = 1;
    let out = CubeTensor::new(client.clone(), buffer.handle, meta, device, dtype);
    burn_cubecl::cubecl::std::tensor::copy_gpu_ref(
        &client,
        t.binding(),
        out.clone().binding(),
        dtype.into(),
    );
    out
}

/// `a [m, k] · b [k, n]` in f32 with the kernel `--matmul` chose, for mixed precision's products
/// of two matrices (`device_mixed`, operands in the half type); `None` for Burn's kernel, other
/// shapes, and where the kernel cannot run (said once per kernel and `b`'s shape), and the
/// caller runs its own product.
pub(crate) fn chosen_product<B: DeviceMatmul>(
    a: &FloatTensor<B>,
    b: &FloatTensor<B>,
) -> Option<FloatTensor<B>> {
    product_with::<B>(a, b, chosen())
}

/// `a [O, H, m, k] · b [O or 1, H, k, n]` in f32 through cuBLAS where `--matmul cublas` is
/// chosen and `ASRT_CUBLAS_STACKS=1`, for mixed precision's stacks (`device_mixed`,
/// operands in the half type; a shared operand's gradient is summed by the caller); `None`
/// elsewhere, and where cuBLAS cannot run (said once), and the caller runs its own product.
pub(crate) fn chosen_stacked<B: DeviceMatmul>(
    a: &FloatTensor<B>,
    b: &FloatTensor<B>,
) -> Option<FloatTensor<B>> {
    if !stacks_to_cublas() || a.shape().num_dims() != 4 || b.shape().num_dims() != 4 {
        return None;
    }
    B::try_stacked(a.clone(), b.clone(), Kernel::Cublas, false)
        .map_err(|why| report_stack_fallback("mixed-precision", &why))
        .ok()
}

/// [`chosen_product`] with `kernel`.
fn product_with<B: DeviceMatmul>(
    a: &FloatTensor<B>,
    b: &FloatTensor<B>,
    kernel: Kernel,
) -> Option<FloatTensor<B>> {
    let (da, db) = (a.shape(), b.shape());
    if kernel == Kernel::Burn || da.num_dims() != 2 || db.num_dims() != 2 {
        return None;
    }
    try_reported::<B>(a, b, kernel, Site { form: "mixed-precision", weight: [db[0], db[1]] })
}

impl<B> DeviceMatmul for Fusion<B>
where
    B: FusionBackend + DeviceMatmul,
{
    fn try_product(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        kernel: Kernel,
    ) -> Result<FloatTensor<Self>, String> {
        let client = a.client.clone();
        let resolve = |t| client.resolve_tensor_float::<B>(t);
        let y = B::try_product(resolve(a), resolve(b), kernel)?;
        Ok(asr_tdt::fusion::adopt::<B>(&client, y))
    }

    fn try_stacked(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        kernel: Kernel,
        sum_outer: bool,
    ) -> Result<FloatTensor<Self>, String> {
        let client = a.client.clone();
        let resolve = |t| client.resolve_tensor_float::<B>(t);
        let y = B::try_stacked(resolve(a), resolve(b), kernel, sum_outer)?;
        Ok(asr_tdt::fusion::adopt::<B>(&client, y))
    }

    /// In fusion's stream, as [`Self::linear_product`] (the inner backend falls back to Burn's
    /// product where cuBLAS cannot run).
    fn stack_product(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        transposed: [bool; 2],
        sum_outer: bool,
        kernel: Kernel,
        form: &'static str,
    ) -> FloatTensor<Self> {
        let (da, db) = (&a.shape, &b.shape);
        let m = if transposed[0] { da[3] } else { da[2] };
        let n = if transposed[1] { db[2] } else { db[3] };
        let outer = if sum_outer { 1 } else { da[0].max(db[0]) };
        let out = vec![outer, da[1], m, n];
        let [y] =
            in_stream::<B, _, 2, 1>("stack product", [a, b], [(out, DType::F32)], move |[a, b]| {
                [B::stack_product(a, b, transposed, sum_outer, kernel, form)]
            });
        y
    }

    /// In fusion's stream ([`in_stream`]), the flattening and the transpositions the inner
    /// backend's inside the one operation. The inner backend's `product` falls back to its own
    /// `float_matmul` where the kernel cannot run, so nothing is left to fail and be returned
    /// here; and the 0.6B step's 1,316 products are not 1,316 round trips to fusion's thread
    /// (an H200's step with `--matmul` was slower than without while they were:
    /// bench/RESULTS.md, 2026-11-30). (The default `product` and `stacked` would resolve their
    /// operands on `Fusion`: nothing calls them there.)
    fn linear_product(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        form: Form,
        kernel: Kernel,
    ) -> FloatTensor<Self> {
        let (out, _) = form.shapes(&a.shape, &b.shape);
        let [y] =
            in_stream::<B, _, 2, 1>("linear product", [a, b], [(out, DType::F32)], move |[a, b]| {
                [B::linear_product(a, b, form, kernel)]
            });
        y
    }

    /// With a bias, the product and the addition as one operation of fusion's stream: 173 of
    /// the 0.6B step's operations were the additions (bench/RESULTS.md, 2026-12-06).
    fn linear_forward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: Option<FloatTensor<Self>>,
        kernel: Kernel,
    ) -> FloatTensor<Self> {
        let Some(b) = b else {
            return Self::linear_product(x, w, Form::Forward, kernel);
        };
        let (out, _) = Form::Forward.shapes(&x.shape, &w.shape);
        let [y] =
            in_stream::<B, _, 3, 1>("linear", [x, w, b], [(out, DType::F32)], move |[x, w, b]| {
                [B::linear_forward(x, w, Some(b), kernel)]
            });
        y
    }

    /// The gradients asked for as one operation of fusion's stream, whose inputs are `dy` and
    /// the operands given (a tensor that is not read is not held for it).
    fn linear_grads(
        dy: FloatTensor<Self>,
        w: Option<FloatTensor<Self>>,
        x: Option<FloatTensor<Self>>,
        bias: bool,
        kernel: Kernel,
    ) -> [Option<FloatTensor<Self>>; 3] {
        let out = dy.shape.to_vec();
        let kept = Vec::new();
        grads_in_stream::<B, _>(
            "linear backward",
            &out,
            dy,
            kept,
            w,
            x,
            bias,
            move |dy, _, w, x| B::linear_grads(dy, w, x, bias, kernel),
        )
    }

    /// The layer and the residual as one operation of fusion's stream: 96 of the 0.6B step's
    /// operations were the residuals after a layer, and as many their backward
    /// (bench/RESULTS.md, 2026-12-07).
    fn linear_residual_forward(
        x: FloatTensor<Self>,
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
        rule: Rule,
        kernel: Kernel,
    ) -> FloatTensor<Self> {
        let out = [(x.shape.to_vec(), DType::F32)];
        let [y] = in_stream::<B, _, 4, 1>("linear residual", [x, h, w, b], out, move |inputs| {
            let [x, h, w, b] = inputs;
            [B::linear_residual_forward(x, h, w, b, rule, kernel)]
        });
        y
    }

    /// The layer, the residual and the next normalisation's forward as one operation of
    /// fusion's stream: 96 of the 0.6B step's operations were those normalisations' forwards
    /// (bench/RESULTS.md, 2026-12-07).
    fn linear_residual_norm_forward(
        x: FloatTensor<Self>,
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
        rule: Rule,
        kernel: Kernel,
        [gamma, beta]: [FloatTensor<Self>; 2],
        eps: f64,
    ) -> [FloatTensor<Self>; 3] {
        let dims = x.shape.to_vec();
        let (rows, _) = super::device_layer_norm::rows_and_width(&dims);
        let outs = [(dims.clone(), DType::F32), (dims, DType::F32), (vec![rows, 2], DType::F32)];
        in_stream::<B, _, 6, 3>(
            "linear residual norm",
            [x, h, w, b, gamma, beta],
            outs,
            move |[x, h, w, b, gamma, beta]| {
                B::linear_residual_norm_forward(x, h, w, b, rule, kernel, [gamma, beta], eps)
            },
        )
    }

    fn linear_residual_grads(
        dy: FloatTensor<Self>,
        w: Option<FloatTensor<Self>>,
        h: Option<FloatTensor<Self>>,
        bias: bool,
        rule: Rule,
        kernel: Kernel,
    ) -> [Option<FloatTensor<Self>>; 3] {
        let (out, kept) = (dy.shape.to_vec(), Vec::new());
        let name = "linear residual backward";
        grads_in_stream::<B, _>(name, &out, dy, kept, w, h, bias, move |dy, _, w, h| {
            B::linear_residual_grads(dy, w, h, bias, rule, kernel)
        })
    }

    /// The layer and the gate as one operation of fusion's stream, whose inputs are the mask's
    /// tensor too where there is one: 72 of the 0.6B step's operations were the gates after a
    /// layer, and as many their backward (bench/RESULTS.md, 2026-12-07).
    fn linear_gate_forward(
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
        gate: Gate,
        after: After<Self>,
        kernel: Kernel,
    ) -> [FloatTensor<Self>; 2] {
        let (x, _) = Form::Forward.shapes(&h.shape, &w.shape);
        let outputs = vec![(gate.output_dims(&x), DType::F32), (x, DType::F32)];
        let (rule, mask) = after_parts(after);
        let inputs = [Some(h), Some(w), Some(b), mask].into_iter().flatten().collect();
        let op = move |inputs: Vec<FloatTensor<B>>| {
            let mut inputs = inputs.into_iter();
            let (Some(h), Some(w), Some(b)) = (inputs.next(), inputs.next(), inputs.next()) else {
                unreachable!("linear gate: the layer's three inputs come first")
            };
            let after = inner_after::<B>(rule, inputs.next());
            B::linear_gate_forward(h, w, b, gate, after, kernel).into()
        };
        let mut ys = in_stream_vec::<B, _>("linear gate", inputs, outputs, op).into_iter();
        match (ys.next(), ys.next()) {
            (Some(y), Some(x)) => [y, x],
            _ => unreachable!("linear gate: two outputs were declared"),
        }
    }

    fn linear_gate_grads(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        w: Option<FloatTensor<Self>>,
        h: Option<FloatTensor<Self>>,
        bias: bool,
        gate: Gate,
        after: After<Self>,
        kernel: Kernel,
    ) -> [Option<FloatTensor<Self>>; 3] {
        let (rule, mask) = after_parts(after);
        let out = x.shape.to_vec();
        let kept = [Some(x), mask].into_iter().flatten().collect();
        let name = "linear gate backward";
        grads_in_stream::<B, _>(name, &out, dy, kept, w, h, bias, move |dy, kept, w, h| {
            let mut kept = kept.into_iter();
            let Some(x) = kept.next() else {
                unreachable!("linear gate backward: the gate's input comes after the gradient")
            };
            let after = inner_after::<B>(rule, kept.next());
            B::linear_gate_grads(dy, x, w, h, bias, gate, after, kernel)
        })
    }
}

/// A gate's mask under fusion as what its operation's closure keeps (a dropout's rule) and
/// what is an input of the operation (a mask tensor).
fn after_parts<B: FusionBackend>(
    after: After<Fusion<B>>,
) -> (Option<Rule>, Option<FloatTensor<Fusion<B>>>) {
    match after {
        After::Dropout(rule) => (Some(rule), None),
        After::Mask(mask) => (None, Some(mask)),
    }
}

/// [`after_parts`]' mask again, on the inner backend: the rule's, else the mask tensor.
fn inner_after<B: FusionBackend>(rule: Option<Rule>, mask: Option<FloatTensor<B>>) -> After<B> {
    match (rule, mask) {
        (Some(rule), _) => After::Dropout(rule),
        (None, Some(mask)) => After::Mask(mask),
        (None, None) => unreachable!("a gate's mask is a rule or a tensor"),
    }
}

/// A linear layer's gradients asked for (the input's where `w` is given, the weight's where
/// `x` is, the bias's where `bias`) from `dy` and what the operation `kept` (the gate's input
/// before the layer's backward, say) by `run` on the inner backend, as one operation of
/// fusion's stream whose inputs are `dy`, the kept tensors and the operands given (a tensor
/// that is not read is not held for it). `out` is the layer's output's shape (`dy`'s, but for
/// a gate after the layer).
#[allow(clippy::too_many_arguments)]
fn grads_in_stream<B, F>(
    name: &'static str,
    out: &[usize],
    dy: FloatTensor<Fusion<B>>,
    kept: Vec<FloatTensor<Fusion<B>>>,
    w: Option<FloatTensor<Fusion<B>>>,
    x: Option<FloatTensor<Fusion<B>>>,
    bias: bool,
    run: F,
) -> [Option<FloatTensor<Fusion<B>>>; 3]
where
    B: FusionBackend,
    F: Fn(
            FloatTensor<B>,
            Vec<FloatTensor<B>>,
            Option<FloatTensor<B>>,
            Option<FloatTensor<B>>,
        ) -> [Option<FloatTensor<B>>; 3]
        + Send
        + Sync
        + 'static,
{
    let asked = [w.is_some(), x.is_some(), bias];
    let mut outputs = Vec::with_capacity(3);
    if let Some(w) = &w {
        outputs.push((Form::InputGradient.shapes(out, &w.shape).0, DType::F32));
    }
    if let Some(x) = &x {
        outputs.push((Form::WeightGradient.shapes(&x.shape, out).0, DType::F32));
    }
    if bias {
        outputs.push((vec![out.last().copied().unwrap_or(1)], DType::F32));
    }
    if outputs.is_empty() {
        return [None, None, None];
    }
    let count = kept.len();
    let all = [Some(dy)].into_iter().chain(kept.into_iter().map(Some)).chain([w, x]);
    let op = move |inputs: Vec<FloatTensor<B>>| {
        let mut inputs = inputs.into_iter();
        let Some(dy) = inputs.next() else {
            unreachable!("linear backward: the output's gradient is the first input")
        };
        let kept = inputs.by_ref().take(count).collect();
        let w = if asked[0] { inputs.next() } else { None };
        let x = if asked[1] { inputs.next() } else { None };
        run(dy, kept, w, x).into_iter().flatten().collect()
    };
    let inputs = all.flatten().collect();
    let mut grads = in_stream_vec::<B, _>(name, inputs, outputs, op).into_iter();
    asked.map(|yes| if yes { grads.next() } else { None })
}

/// Every input's gradient from an operation that computes each only where asked.
fn every<B: Backend, O: DeviceBackward<B, N>, const N: usize>(
    op: &O,
    saved: O::Saved,
    dy: FloatTensor<B>,
) -> [FloatTensor<B>; N] {
    op.backward_tracked(saved, dy, [true; N]).map(|g| g.expect("every one asked for"))
}

/// A linear layer's product with one kernel, as a [`DeviceOp`] of the input `[.., in]` and the
/// weight.
#[derive(Debug, Clone, Copy)]
struct Product(Kernel);

impl<B: DeviceMatmul> DeviceBackward<B, 2> for Product {
    type Saved = (FloatTensor<B>, FloatTensor<B>);

    fn backward(&self, saved: Self::Saved, dy: FloatTensor<B>) -> [FloatTensor<B>; 2] {
        every::<B, Self, 2>(self, saved, dy)
    }

    fn backward_tracked(
        &self,
        (x, w): Self::Saved,
        dy: FloatTensor<B>,
        [want_x, want_w]: [bool; 2],
    ) -> [Option<FloatTensor<B>>; 2] {
        let [dx, dw, _] =
            B::linear_grads(dy, want_x.then_some(w), want_w.then_some(x), false, self.0);
        [dx, dw]
    }
}

impl<B: DeviceMatmul> DeviceOp<B, 2> for Product {
    fn forward(&self, [x, w]: [FloatTensor<B>; 2]) -> (FloatTensor<B>, Self::Saved) {
        (B::linear_forward(x.clone(), w.clone(), None, self.0), (x, w))
    }
}

/// A linear layer with its bias, as a [`DeviceOp`] of the input `[.., in]`, the weight and the
/// bias: one node, and under fusion one operation each way (the product, its two gradients,
/// the bias's addition and its gradient were five).
#[derive(Debug, Clone, Copy)]
struct BiasedProduct(Kernel);

impl<B: DeviceMatmul> DeviceBackward<B, 3> for BiasedProduct {
    type Saved = (FloatTensor<B>, FloatTensor<B>);

    fn backward(&self, saved: Self::Saved, dy: FloatTensor<B>) -> [FloatTensor<B>; 3] {
        every::<B, Self, 3>(self, saved, dy)
    }

    fn backward_tracked(
        &self,
        (x, w): Self::Saved,
        dy: FloatTensor<B>,
        [want_x, want_w, want_b]: [bool; 3],
    ) -> [Option<FloatTensor<B>>; 3] {
        B::linear_grads(dy, want_x.then_some(w), want_w.then_some(x), want_b, self.0)
    }
}

impl<B: DeviceMatmul> DeviceOp<B, 3> for BiasedProduct {
    fn forward(&self, [x, w, b]: [FloatTensor<B>; 3]) -> (FloatTensor<B>, Self::Saved) {
        (B::linear_forward(x.clone(), w.clone(), Some(b), self.0), (x, w))
    }
}

/// A linear layer with its bias and the residual after it, `x + (h · w + b)` times the rule's
/// mask, as a [`DeviceOp`] of `x`, `h`, `w` and `b`: one node, and under fusion one operation
/// each way, where the layer and the residual were two. `x`'s gradient is the output's,
/// handed to the operation reading `x` that claimed `handoff` (`handoff`: the layer
/// normalisation, or `device_residual_norm`'s node whose untracked output `x` is), tracked or
/// not, else registered where tracked.
#[derive(Debug, Clone)]
struct LinearResidual {
    kernel: Kernel,
    rule: Rule,
    handoff: Option<Handoff>,
}

impl<B: DeviceMatmul> DeviceBackward<B, 4> for LinearResidual {
    type Saved = (FloatTensor<B>, FloatTensor<B>);

    fn backward(&self, saved: Self::Saved, dy: FloatTensor<B>) -> [FloatTensor<B>; 4] {
        every::<B, Self, 4>(self, saved, dy)
    }

    fn backward_tracked(
        &self,
        (h, w): Self::Saved,
        dy: FloatTensor<B>,
        [want_x, want_h, want_w, want_b]: [bool; 4],
    ) -> [Option<FloatTensor<B>>; 4] {
        let dx = match &self.handoff {
            Some(handoff) => {
                handoff.give(dy.clone());
                None
            }
            None => want_x.then(|| dy.clone()),
        };
        let [dh, dw, db] = B::linear_residual_grads(
            dy,
            want_h.then_some(w),
            want_w.then_some(h),
            want_b,
            self.rule,
            self.kernel,
        );
        [dx, dh, dw, db]
    }
}

impl<B: DeviceMatmul> DeviceOp<B, 4> for LinearResidual {
    fn forward(&self, [x, h, w, b]: [FloatTensor<B>; 4]) -> (FloatTensor<B>, Self::Saved) {
        let y = B::linear_residual_forward(x, h.clone(), w.clone(), b, self.rule, self.kernel);
        (y, (h, w))
    }
}

/// A linear layer with its bias and a gate after it, `gate(h · w + b)` then its mask, as a
/// [`DeviceOp`] of `h`, `w` and `b` keeping `h`, `w` and the gate's input: one node, and under
/// fusion one operation each way, where the layer and the gate were two. A mask tensor is the
/// operation's own, not a parent.
#[derive(Debug)]
struct LinearGate<B: Backend> {
    kernel: Kernel,
    gate: Gate,
    after: After<B>,
}

impl<B: DeviceMatmul> DeviceBackward<B, 3> for LinearGate<B> {
    type Saved = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(&self, saved: Self::Saved, dy: FloatTensor<B>) -> [FloatTensor<B>; 3] {
        every::<B, Self, 3>(self, saved, dy)
    }

    fn backward_tracked(
        &self,
        (h, w, x): Self::Saved,
        dy: FloatTensor<B>,
        [want_h, want_w, want_b]: [bool; 3],
    ) -> [Option<FloatTensor<B>>; 3] {
        let (w, h) = (want_h.then_some(w), want_w.then_some(h));
        let (gate, after) = (self.gate, self.after.clone());
        B::linear_gate_grads(dy, x, w, h, want_b, gate, after, self.kernel)
    }
}

impl<B: DeviceMatmul> DeviceOp<B, 3> for LinearGate<B> {
    fn forward(&self, [h, w, b]: [FloatTensor<B>; 3]) -> (FloatTensor<B>, Self::Saved) {
        let (gate, after) = (self.gate, self.after.clone());
        let [y, x] = B::linear_gate_forward(h.clone(), w.clone(), b, gate, after, self.kernel);
        (y, (h, w, x))
    }
}

/// A stack of products `a · op(b)` with one kernel, as a [`DeviceOp`] of its two operands
/// (`op` transposing `b`'s last two axes where `transposed_b`).
#[derive(Debug, Clone, Copy)]
struct Stacked {
    kernel: Kernel,
    transposed_b: bool,
}

impl<B: DeviceMatmul> DeviceBackward<B, 2> for Stacked {
    type Saved = (FloatTensor<B>, FloatTensor<B>);

    fn backward(&self, saved: Self::Saved, dy: FloatTensor<B>) -> [FloatTensor<B>; 2] {
        every::<B, Self, 2>(self, saved, dy)
    }

    /// With `y = a · op(b)`: `a`'s gradient is `dy · op(b)ᵀ`; `op(b)`'s is `aᵀ · dy`, so `b`'s
    /// is that or, where `b` is read transposed, its transpose `dyᵀ · a`. Every transposition
    /// is a flag of the product.
    fn backward_tracked(
        &self,
        (a, b): Self::Saved,
        dy: FloatTensor<B>,
        [want_a, want_b]: [bool; 2],
    ) -> [Option<FloatTensor<B>>; 2] {
        // An operand of outer size 1 was read by every outer index: its gradient is the sum.
        let outer = dy.shape()[0];
        let summed = |t: &FloatTensor<B>| t.shape()[0] == 1 && outer > 1;
        let (sum_a, sum_b) = (summed(&a), summed(&b));
        let (tb, kernel) = (self.transposed_b, self.kernel);
        let da = want_a.then(|| {
            let form = "first operand's gradient";
            B::stack_product(dy.clone(), b, [false, !tb], sum_a, kernel, form)
        });
        let db = want_b.then(|| {
            let form = "second operand's gradient";
            let (first, second) = if tb { (dy, a) } else { (a, dy) };
            B::stack_product(first, second, [true, false], sum_b, kernel, form)
        });
        [da, db]
    }
}

impl<B: DeviceMatmul> DeviceOp<B, 2> for Stacked {
    fn forward(&self, [a, b]: [FloatTensor<B>; 2]) -> (FloatTensor<B>, Self::Saved) {
        let transposed = [false, self.transposed_b];
        let y = B::stack_product(a.clone(), b.clone(), transposed, false, self.kernel, "forward");
        (y, (a, b))
    }
}

/// Whether the attention's stacks of products take cuBLAS: `--matmul cublas` chosen and
/// `ASRT_CUBLAS_STACKS=1` (read once). Off by default: on an H200 the 0.6B step with the stacks
/// left to Burn's product was as fast or faster in each of three pairs of runs (0.170 against
/// 0.190 s, 0.153 against 0.166, 0.187 against 0.189; bench/RESULTS.md, 2026-11-30 evening),
/// although cuBLAS ran the five stack forms 1.36x faster alone: the step is bound by the
/// host's threads, and the position products' calls (one per utterance) add to them.
fn stacks_to_cublas() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    chosen() == Kernel::Cublas
        && *ON.get_or_init(|| std::env::var("ASRT_CUBLAS_STACKS").is_ok_and(|v| v == "1"))
}

/// The kernel of the attention's stacks of products: cuBLAS where [`stacks_to_cublas`], else
/// Burn's product.
pub(crate) fn stack_kernel() -> Kernel {
    if stacks_to_cublas() {
        Kernel::Cublas
    } else {
        Kernel::Burn
    }
}

/// `a [O, H, m, k] · b [O or 1, H, k, n]` (the attention's stacks of products, either's `O`
/// may be 1), or `· bᵀ` with `b` `[O or 1, H, n, k]` where `transposed_b`, as one operation
/// (the transposition inside it, forward and backward) where the backend is one of the
/// trainer's CubeCL types (bare or under autodiff) and the tensors f32: through cuBLAS where
/// `--matmul cublas` is chosen with `ASRT_CUBLAS_STACKS=1`, Burn's product otherwise; `None`
/// elsewhere, and the caller runs Burn's `matmul`.
pub fn stacked<B: Backend>(
    a: &Tensor<B, 4>,
    b: &Tensor<B, 4>,
    transposed_b: bool,
) -> Option<Tensor<B, 4>> {
    if a.dtype() != DType::F32 || b.dtype() != DType::F32 {
        return None;
    }
    stacked_with(a, b, transposed_b, stack_kernel())
}

/// [`stacked`] with `kernel` on the CubeCL types, `b` transposed where `transposed_b`, shapes
/// that chain (`O` equal or one of them 1, the same `H`); `None` elsewhere.
fn stacked_with<B: Backend>(
    a: &Tensor<B, 4>,
    b: &Tensor<B, 4>,
    transposed_b: bool,
    kernel: Kernel,
) -> Option<Tensor<B, 4>> {
    let ([oa, ha, _, k], [ob, hb, b2, b3]) = (a.dims(), b.dims());
    let kb = if transposed_b { b3 } else { b2 };
    if ha != hb || k != kb || (oa != ob && oa != 1 && ob != 1) {
        return None;
    }
    let op = Stacked { kernel, transposed_b };
    let transposed = [false, transposed_b];
    on_cube_types!(
        B,
        T,
        {
            let a = cast::<_, Tensor<Autodiff<T>, 4>>(a.clone())?;
            let b = cast::<_, Tensor<Autodiff<T>, 4>>(b.clone())?;
            let y = device_op::tracked(op, [float(a), float(b)]);
            cast(Tensor::<Autodiff<T>, 4>::from_primitive(TensorPrimitive::Float(y)))
        },
        {
            let (a, b) = (cast::<_, Tensor<T, 4>>(a.clone())?, cast::<_, Tensor<T, 4>>(b.clone())?);
            let y = T::stack_product(float(a), float(b), transposed, false, kernel, "forward");
            cast(Tensor::<T, 4>::from_primitive(TensorPrimitive::Float(y)))
        }
    );
    None
}

/// A linear layer in f32, `x [.., in] · w [in, out]` plus `b` `[out]` on every row where
/// given, `[.., out]`, with the [`chosen`] kernel (Burn's included), as one operation each way
/// ([`DeviceMatmul::linear_forward`], [`DeviceMatmul::linear_grads`]) where the backend is one
/// of the trainer's CubeCL types (bare or under autodiff) and the tensors f32; `None`
/// elsewhere, and the caller runs Burn's `linear` on the flattened rows.
pub fn linear<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    w: &Tensor<B, 2>,
    b: Option<&Tensor<B, 1>>,
) -> Option<Tensor<B, D>> {
    let f32s = x.dtype() == DType::F32 && w.dtype() == DType::F32;
    if D < 2 || !f32s || x.dims()[D - 1] != w.dims()[0] {
        return None;
    }
    if b.is_some_and(|b| b.dtype() != DType::F32 || b.dims()[0] != w.dims()[1]) {
        return None;
    }
    on_device(x, w, b, chosen())
}

/// `x + (h · w + b)` times `rule`'s mask, `h` `[.., in]`, `w` `[in, out]`, `b` `[out]` and `x`
/// `[.., out]`: a linear layer in f32 with the [`chosen`] kernel and the residual connection
/// after it, as one operation each way where the backend is one of the trainer's CubeCL types
/// under autodiff and the tensors f32 of those shapes (under `2^32` elements); `x` given back
/// elsewhere, and the caller runs the layer and the residual. `x` is taken, as
/// `device_dropout::residual_on_device` takes it.
pub fn linear_residual<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    h: &Tensor<B, D>,
    w: &Tensor<B, 2>,
    b: &Tensor<B, 1>,
    rule: Rule,
    handoff: Option<&Handoff>,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    if !residual_fits(&x, h, w, b) {
        return Err(x);
    }
    let op = LinearResidual { kernel: chosen(), rule, handoff: Handoff::offered(handoff) };
    on_cube_types!(
        B,
        T,
        {
            let x = float(same::<_, Tensor<Autodiff<T>, D>>(x));
            let h = float(same::<_, Tensor<Autodiff<T>, D>>(h.clone()));
            let w = float(same::<_, Tensor<Autodiff<T>, 2>>(w.clone()));
            let b = float(same::<_, Tensor<Autodiff<T>, 1>>(b.clone()));
            let y = device_op::tracked(op, [x, h, w, b]);
            Ok(same(Tensor::<Autodiff<T>, D>::from_primitive(TensorPrimitive::Float(y))))
        },
        { Err(x) }
    );
    Err(x)
}

/// [`linear_residual`], then the layer normalisation `next` of its output, that normalisation's
/// forward inside the residual's kernel (`DeviceLayerNorm::bias_residual_norm`): `[the
/// residual's output, the normalised]`, two nodes (the normalisation's made by
/// `device_layer_norm::tracked_from`, claiming `next.handoff`), where [`linear_residual`] would
/// run and `next`'s scale and shift are f32 `[out]`; `x` given back elsewhere.
pub fn linear_residual_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    h: &Tensor<B, D>,
    w: &Tensor<B, 2>,
    b: &Tensor<B, 1>,
    rule: Rule,
    handoff: Option<&Handoff>,
    next: NextNorm<'_, B>,
) -> Result<[Tensor<B, D>; 2], Tensor<B, D>> {
    if !residual_norm_fits(&x, h, w, b, &next) {
        return Err(x);
    }
    let op = LinearResidual { kernel: chosen(), rule, handoff: Handoff::offered(handoff) };
    on_cube_types!(
        B,
        T,
        {
            type A = Autodiff<T>;
            let x = float(same::<_, Tensor<A, D>>(x));
            let h = float(same::<_, Tensor<A, D>>(h.clone()));
            let w = float(same::<_, Tensor<A, 2>>(w.clone()));
            let b = float(same::<_, Tensor<A, 1>>(b.clone()));
            let gamma = same::<_, Tensor<A, 1>>(next.gamma);
            let beta = same::<_, Tensor<A, 1>>(next.beta);
            let norm = [float(gamma.clone().inner()), float(beta.clone().inner())];
            let eps = next.eps;
            let (y, normed) = device_op::tracked_with_more(op, [x, h, w, b], |op, [x, h, w, b]| {
                let (rule, kernel) = (op.rule, op.kernel);
                let [y, normed, stats] = T::linear_residual_norm_forward(
                    x,
                    h.clone(),
                    w.clone(),
                    b,
                    rule,
                    kernel,
                    norm,
                    eps,
                );
                (y, (h, w), [normed, stats])
            });
            let y = Tensor::<A, D>::from_primitive(TensorPrimitive::Float(y));
            let normed = super::device_layer_norm::tracked_from::<T, D>(
                y.clone(),
                gamma,
                beta,
                eps,
                next.handoff,
                normed,
            );
            Ok([same(y), same(normed)])
        },
        { Err(x) }
    );
    Err(x)
}

/// Whether [`linear_residual_norm`] takes these: what [`linear_residual`] takes, and `next`'s
/// scale and shift f32 `[out]`.
pub(crate) fn residual_norm_fits<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    h: &Tensor<B, D>,
    w: &Tensor<B, 2>,
    b: &Tensor<B, 1>,
    next: &NextNorm<'_, B>,
) -> bool {
    let [o] = b.dims();
    let norm_fits =
        [&next.gamma, &next.beta].iter().all(|t| t.dims() == [o] && t.dtype() == DType::F32);
    norm_fits && residual_fits(x, h, w, b)
}

/// Whether [`linear_residual`] takes these: f32, `h` `[.., in]`, `w` `[in, out]`, `b` `[out]`,
/// `x` `[.., out]` with `h`'s leading axes, under `2^32` elements.
fn residual_fits<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    h: &Tensor<B, D>,
    w: &Tensor<B, 2>,
    b: &Tensor<B, 1>,
) -> bool {
    let f32s = [x.dtype(), h.dtype(), w.dtype(), b.dtype()].iter().all(|&t| t == DType::F32);
    let ([i, o], [bo]) = (w.dims(), b.dims());
    let (xd, hd) = (x.dims(), h.dims());
    f32s && D >= 2
        && hd[D - 1] == i
        && o == bo
        && xd[D - 1] == o
        && xd[..D - 1] == hd[..D - 1]
        && x.shape().num_elements() <= u32::MAX as usize
}

/// What follows the gate of [`linear_gated`]: a dropout (drawn inside, where
/// `Dropout::forward` would draw it), or a mask tensor that is not tracked, broadcast as Burn's
/// product broadcasts (the convolution module's time mask `[B, T, 1]` after its GLU).
pub enum GateMask<'a, B: Backend, const D: usize> {
    /// The dropout after the gate.
    Dropout(&'a Dropout),
    /// The tensor the gate's output is multiplied by.
    Mask(&'a Tensor<B, D>),
}

/// `gate(h · w + b)` then `mask`, `h` `[.., in]`, `w` `[in, out]`, `b` `[out]` (the GLU's
/// `out` even): a linear layer in f32 with the [`chosen`] kernel and the Swish or the GLU after
/// it, as one operation each way where the backend is one of the trainer's CubeCL types under
/// autodiff, the tensors f32 of those shapes and a mask tensor untracked, of as many axes; the
/// same bits as the layer then `device_gates`' gate with its mask. `None` elsewhere, with no
/// dropout drawn, and the caller runs the layer and the gate.
pub fn linear_gated<B: Backend, const D: usize>(
    h: &Tensor<B, D>,
    w: &Tensor<B, 2>,
    b: &Tensor<B, 1>,
    gate: Gate,
    mask: GateMask<'_, B, D>,
) -> Option<Tensor<B, D>> {
    let f32s = [h.dtype(), w.dtype(), b.dtype()].iter().all(|&t| t == DType::F32);
    let ([i, o], [bo]) = (w.dims(), b.dims());
    let fits = D >= 2
        && h.dims()[D - 1] == i
        && o == bo
        && (gate != Gate::Glu || o.is_multiple_of(2))
        && h.shape().num_elements() / i.max(1) * o <= u32::MAX as usize;
    let mask_fits = match &mask {
        GateMask::Dropout(_) => gate == Gate::Swish,
        GateMask::Mask(m) => gate == Gate::Glu && m.dtype() == DType::F32 && !m.is_require_grad(),
    };
    if !f32s || !fits || !mask_fits {
        return None;
    }
    on_cube_types!(
        B,
        T,
        {
            let h: Tensor<Autodiff<T>, D> = cast(h.clone())?;
            let device = h.device();
            let h = float(h);
            let w = float(cast::<_, Tensor<Autodiff<T>, 2>>(w.clone())?);
            let b = float(cast::<_, Tensor<Autodiff<T>, 1>>(b.clone())?);
            let after = match mask {
                GateMask::Dropout(dropout) => After::Dropout(dropout.draw::<Autodiff<T>>(&device)?),
                GateMask::Mask(m) => {
                    After::Mask(float(cast::<_, Tensor<Autodiff<T>, D>>(m.clone())?.inner()))
                }
            };
            let op = LinearGate { kernel: chosen(), gate, after };
            let y = device_op::tracked(op, [h, w, b]);
            cast(Tensor::<Autodiff<T>, D>::from_primitive(TensorPrimitive::Float(y)))
        },
        { None }
    );
    None
}

/// The layer with `kernel` on the CubeCL types; `None` elsewhere.
fn on_device<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    w: &Tensor<B, 2>,
    b: Option<&Tensor<B, 1>>,
    kernel: Kernel,
) -> Option<Tensor<B, D>> {
    on_cube_types!(
        B,
        T,
        {
            let x = float(cast::<_, Tensor<Autodiff<T>, D>>(x.clone())?);
            let w = float(cast::<_, Tensor<Autodiff<T>, 2>>(w.clone())?);
            let y = match b {
                Some(b) => {
                    let b = float(cast::<_, Tensor<Autodiff<T>, 1>>(b.clone())?);
                    device_op::tracked(BiasedProduct(kernel), [x, w, b])
                }
                None => device_op::tracked(Product(kernel), [x, w]),
            };
            cast(Tensor::<Autodiff<T>, D>::from_primitive(TensorPrimitive::Float(y)))
        },
        {
            let (x, w) = (cast::<_, Tensor<T, D>>(x.clone())?, cast::<_, Tensor<T, 2>>(w.clone())?);
            let b = match b {
                Some(b) => Some(float(cast::<_, Tensor<T, 1>>(b.clone())?)),
                None => None,
            };
            let y = T::linear_forward(float(x), float(w), b, kernel);
            cast(Tensor::<T, D>::from_primitive(TensorPrimitive::Float(y)))
        }
    );
    None
}

/// `a [m, k] · b [k, n]` on a bare CubeCL type with `kernel`, or why it could not run (for
/// `asrt-bench matmul`, which times each kernel).
pub fn try_bare<B: Backend>(
    a: &Tensor<B, 2>,
    b: &Tensor<B, 2>,
    kernel: Kernel,
) -> Option<Result<Tensor<B, 2>, String>> {
    on_cube_types!(B, T, { None }, {
        let (a, b) = (cast::<_, Tensor<T, 2>>(a.clone())?, cast::<_, Tensor<T, 2>>(b.clone())?);
        let y = match T::try_product(float(a), float(b), kernel) {
            Ok(y) => y,
            Err(why) => return Some(Err(why)),
        };
        Some(Ok(cast(Tensor::<T, 2>::from_primitive(TensorPrimitive::Float(y)))?))
    });
    None
}

/// `a [O, H, m, k] · b [O or 1, H, k, n]` on a bare CubeCL type with `kernel`, summed over the
/// outer axis where `sum_outer`, or why it could not run (for `asrt-bench matmul --sizes
/// attention`): Burn's product (and sum) for [`Kernel::Burn`], cuBLAS's calls for
/// [`Kernel::Cublas`]; other kernels take no stacks.
pub fn try_stacked_bare<B: Backend>(
    a: &Tensor<B, 4>,
    b: &Tensor<B, 4>,
    kernel: Kernel,
    sum_outer: bool,
) -> Option<Result<Tensor<B, 4>, String>> {
    on_cube_types!(B, T, { None }, {
        let (a, b) = (cast::<_, Tensor<T, 4>>(a.clone())?, cast::<_, Tensor<T, 4>>(b.clone())?);
        let (a, b) = (float(a), float(b));
        let y = if kernel == Kernel::Burn {
            Ok(burn_stacked::<T>(a, b, sum_outer))
        } else {
            T::try_stacked(a, b, kernel, sum_outer)
        };
        Some(match y {
            Ok(y) => Ok(cast(Tensor::<T, 4>::from_primitive(TensorPrimitive::Float(y)))?),
            Err(why) => Err(why),
        })
    });
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    type W = burn::backend::Wgpu;

    fn host(t: &Tensor<impl Backend, 2>) -> (Vec<f64>, [usize; 2]) {
        let dims = t.dims();
        let v = t.clone().into_data().into_vec::<f32>().unwrap();
        (v.into_iter().map(f64::from).collect(), dims)
    }

    /// `a · b` in float64 and the sum of magnitudes of each output's terms (the error's scale).
    fn oracle(a: &Tensor<impl Backend, 2>, b: &Tensor<impl Backend, 2>) -> (Vec<f64>, Vec<f64>) {
        let ((a, [m, k]), (b, [_, n])) = (host(a), host(b));
        let mut y = vec![0.0; m * n];
        let mut s = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    y[i * n + j] += a[i * k + p] * b[p * n + j];
                    s[i * n + j] += (a[i * k + p] * b[p * n + j]).abs();
                }
            }
        }
        (y, s)
    }

    fn worst(got: &Tensor<impl Backend, 2>, want: &(Vec<f64>, Vec<f64>)) -> f64 {
        let (got, _) = host(got);
        got.iter()
            .zip(want.0.iter().zip(&want.1))
            .map(|(g, (w, s))| (g - w).abs() / s.max(1e-30))
            .fold(0.0, f64::max)
    }

    /// The product and both gradients with cubek's unit kernels (lavapipe has no tensor cores)
    /// against float64, plain and with a transposed operand, bare and fused; a CMMA kernel
    /// falls back to Burn's product there with the same results.
    #[test]
    fn product_and_gradients_match_float64_on_wgpu_with_and_without_fusion() {
        fn check<B: burn::tensor::backend::AutodiffBackend>() {
            let device = Default::default();
            let (m, k, n) = (67, 45, 33);
            for kernel in [Kernel::SimpleUnit, Kernel::DoubleUnit, Kernel::DoubleCyclicCmma] {
                let x = Tensor::<B, 2>::random([m, k], Distribution::Uniform(-1.0, 1.0), &device)
                    .require_grad();
                let w = Tensor::<B, 2>::random([k, n], Distribution::Uniform(-1.0, 1.0), &device)
                    .require_grad();
                let dy = Tensor::<B, 2>::random([m, n], Distribution::Uniform(-1.0, 1.0), &device);
                // (Not through `choose`: the process-wide choice would reach the tests running
                // beside this one.)
                let y = on_device(&x, &w, None, kernel).expect("wgpu is a CubeCL type");
                let grads = (y.clone() * dy.clone()).sum().backward();
                let (dx, dw) = (x.grad(&grads).unwrap(), w.grad(&grads).unwrap());
                let (x, w, dy) = (x.inner(), w.inner(), dy.inner());
                let e_y = worst(&y.inner(), &oracle(&x, &w));
                let e_dx = worst(&dx, &oracle(&dy, &w.clone().transpose()));
                let e_dw = worst(&dw, &oracle(&x.transpose(), &dy));
                eprintln!("{kernel:?}: y {e_y:.1e}, dx {e_dx:.1e}, dw {e_dw:.1e}");
                // Measured at most 1.9e-7 (operands with rows aligned, see `aligned_rows`).
                for e in [e_y, e_dx, e_dw] {
                    assert!(e < 9e-7, "{kernel:?}: {e:e}");
                }
            }
        }
        check::<Autodiff<W>>();
        check::<Autodiff<Fusion<W>>>();
    }

    /// A linear layer's input with leading axes, `[2, 19, k]`, and Burn's kernel (which the
    /// operation takes too): the product and both gradients against float64 over the
    /// flattened rows, bare, under autodiff and fused. (That fusion's stream then holds no
    /// reshape or transposition beside the products is counted by `bench/fusion_ops.sh`.)
    #[test]
    fn a_product_over_leading_axes_and_its_gradients_match_float64() {
        fn check<B: burn::tensor::backend::AutodiffBackend>() -> f64 {
            let device = Default::default();
            let (lead, k, n) = ([2, 19], 45, 33);
            let random = |dims: [usize; 3]| {
                Tensor::<B, 3>::random(dims, Distribution::Uniform(-1.0, 1.0), &device)
            };
            let x = random([lead[0], lead[1], k]).require_grad();
            let w = Tensor::<B, 2>::random([k, n], Distribution::Uniform(-1.0, 1.0), &device)
                .require_grad();
            let dy = random([lead[0], lead[1], n]);
            let y = on_device(&x, &w, None, Kernel::Burn).expect("wgpu is a CubeCL type");
            assert_eq!(y.dims(), [lead[0], lead[1], n]);
            let grads = (y.clone() * dy.clone()).sum().backward();
            let (dx, dw) = (x.grad(&grads).unwrap(), w.grad(&grads).unwrap());
            assert_eq!(dx.dims(), [lead[0], lead[1], k]);
            let flat = |t: Tensor<B::InnerBackend, 3>| {
                let [a, b, c] = t.dims();
                t.reshape([a * b, c])
            };
            let (x, w, dy) = (flat(x.inner()), w.inner(), flat(dy.inner()));
            let bare = on_device(&x.clone().reshape([lead[0], lead[1], k]), &w, None, Kernel::Burn)
                .expect("bare wgpu too");
            let errors = [
                worst(&flat(y.inner()), &oracle(&x, &w)),
                worst(&flat(bare), &oracle(&x, &w)),
                worst(&flat(dx), &oracle(&dy, &w.clone().transpose())),
                worst(&dw, &oracle(&x.transpose(), &dy)),
            ];
            errors.into_iter().fold(0.0, f64::max)
        }
        let errors = [check::<Autodiff<W>>(), check::<Autodiff<Fusion<W>>>()];
        eprintln!("largest errors: bare {:.1e}, fused {:.1e}", errors[0], errors[1]);
        // Measured at most 1.7e-7 (Burn's product on lavapipe).
        for e in errors {
            assert!(e < 6e-7, "{e:e}");
        }
    }

    /// A layer with its bias (one operation each way) gives the same bits as the product and
    /// then the bias's own operation (`device_bias`, tested against float64 there), whose
    /// kernels it runs: the output and each gradient, with every input tracked, with the input
    /// untracked (no input gradient asked for), with the bias alone tracked; bare, under
    /// autodiff and fused, over leading axes.
    #[test]
    fn a_layer_with_its_bias_is_the_product_then_the_bias_bit_for_bit() {
        type A<B> = Autodiff<B>;
        fn check<B: super::DeviceMatmul>() {
            let device = Default::default();
            let (lead, k, n) = ([2, 19], 45, 33);
            let uniform = Distribution::Uniform(-1.0, 1.0);
            let x = Tensor::<B, 3>::random([lead[0], lead[1], k], uniform, &device);
            let w = Tensor::<B, 2>::random([k, n], uniform, &device);
            let b = Tensor::<B, 1>::random([n], uniform, &device);
            let dy = Tensor::<B, 3>::random([lead[0], lead[1], n], uniform, &device);
            let bits = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
            let grad_bits =
                |g: Option<Tensor<B, 2>>| g.map(|g| g.into_data().to_vec::<f32>().unwrap());
            // [x, w, b] tracked as asked: the output's bits and each tracked input's gradient's.
            let run = |one_op: bool, tracked: [bool; 3]| {
                let xa = Tensor::<A<B>, 3>::from_inner(x.clone());
                let xa = if tracked[0] { xa.require_grad() } else { xa };
                let wa = Tensor::<A<B>, 2>::from_inner(w.clone());
                let wa = if tracked[1] { wa.require_grad() } else { wa };
                let ba = Tensor::<A<B>, 1>::from_inner(b.clone());
                let ba = if tracked[2] { ba.require_grad() } else { ba };
                let y = if one_op {
                    on_device(&xa, &wa, Some(&ba), Kernel::Burn).expect("a CubeCL type")
                } else {
                    let y = on_device(&xa, &wa, None, Kernel::Burn).expect("a CubeCL type");
                    super::super::device_bias::on_device(y, &ba).expect("f32 on a CubeCL type")
                };
                let grads = (y.clone() * Tensor::from_inner(dy.clone())).sum().backward();
                let dx = xa.grad(&grads).map(|g| g.reshape([lead[0] * lead[1], k]));
                let db = ba.grad(&grads).map(|g| g.reshape([1, n]));
                (bits(y.inner()), [grad_bits(dx), grad_bits(wa.grad(&grads)), grad_bits(db)])
            };
            for tracked in [[true; 3], [false, true, true], [false, false, true]] {
                let (y, grads) = run(true, tracked);
                let (y0, grads0) = run(false, tracked);
                assert_eq!(y, y0, "the output, {tracked:?}");
                for (i, (g, g0)) in grads.iter().zip(&grads0).enumerate() {
                    assert_eq!(g.is_some(), tracked[i], "gradient {i} given, {tracked:?}");
                    assert_eq!(g, g0, "gradient {i}, {tracked:?}");
                }
            }
            let bare = on_device(&x, &w, Some(&b), Kernel::Burn).expect("bare too");
            let parts = on_device(&x, &w, None, Kernel::Burn).expect("bare too");
            let parts = super::super::device_bias::on_device(parts, &b).expect("bare too");
            assert_eq!(bits(bare), bits(parts), "bare");
        }
        check::<W>();
        check::<Fusion<W>>();
    }

    /// A layer with the residual after it (one operation each way) gives the bits of the layer
    /// then the residual's operation: the output and each gradient, with every input tracked,
    /// the residual's input alone untracked, the layer's input and weight untracked; under
    /// autodiff and fused, over leading axes. A layer without bias, or mixed shapes, is left to
    /// the caller.
    #[test]
    fn a_layer_and_its_residual_are_the_layer_then_the_residual_bit_for_bit() {
        type A<B> = Autodiff<B>;
        fn check<B: super::DeviceMatmul>() {
            let device = Default::default();
            let (lead, k, n) = ([2, 19], 45, 33);
            let uniform = Distribution::Uniform(-1.0, 1.0);
            let x = Tensor::<B, 3>::random([lead[0], lead[1], n], uniform, &device);
            let h = Tensor::<B, 3>::random([lead[0], lead[1], k], uniform, &device);
            let w = Tensor::<B, 2>::random([k, n], uniform, &device);
            let b = Tensor::<B, 1>::random([n], uniform, &device);
            let dy = Tensor::<B, 3>::random([lead[0], lead[1], n], uniform, &device);
            let rule = Rule::new(0x5eed, 0.8).times(0.5);
            let bits = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
            let flat = |t: Tensor<B, 3>| {
                let [a, b, c] = t.dims();
                t.reshape([a * b, c])
            };
            let grad_bits =
                |g: Option<Tensor<B, 2>>| g.map(|g| g.into_data().to_vec::<f32>().unwrap());
            // [x, h, w, b] tracked as asked: the output's bits and each tracked input's
            // gradient's.
            let run = |one_op: bool, tracked: [bool; 4]| {
                let track = |t: Tensor<A<B>, 3>, yes: bool| if yes { t.require_grad() } else { t };
                let xa = track(Tensor::from_inner(x.clone()), tracked[0]);
                let ha = track(Tensor::from_inner(h.clone()), tracked[1]);
                let wa = Tensor::<A<B>, 2>::from_inner(w.clone());
                let wa = if tracked[2] { wa.require_grad() } else { wa };
                let ba = Tensor::<A<B>, 1>::from_inner(b.clone());
                let ba = if tracked[3] { ba.require_grad() } else { ba };
                let y = if one_op {
                    let op = linear_residual(xa.clone(), &ha, &wa, &ba, rule, None);
                    op.expect("a CubeCL type")
                } else {
                    let f = on_device(&ha, &wa, Some(&ba), chosen()).expect("a CubeCL type");
                    let y = super::super::device_dropout::residual_on_device(xa.clone(), f, rule);
                    y.expect("f32 on a CubeCL type")
                };
                let grads = (y.clone() * Tensor::from_inner(dy.clone())).sum().backward();
                let dx = xa.grad(&grads).map(flat);
                let dh = ha.grad(&grads).map(flat);
                let db = ba.grad(&grads).map(|g| g.reshape([1, n]));
                let dw = wa.grad(&grads);
                (bits(y.inner()), [dx, dh, dw, db].map(grad_bits))
            };
            for tracked in [[true; 4], [false, true, true, true], [true, false, false, true]] {
                let (y, grads) = run(true, tracked);
                let (y0, grads0) = run(false, tracked);
                assert!(y.iter().zip(&bits(x.clone())).any(|(y, x)| y == x), "elements dropped");
                assert_eq!(y, y0, "the output, {tracked:?}");
                for (i, (g, g0)) in grads.iter().zip(&grads0).enumerate() {
                    assert_eq!(g.is_some(), tracked[i], "gradient {i} given, {tracked:?}");
                    assert_eq!(g, g0, "gradient {i}, {tracked:?}");
                }
            }
            let wide = Tensor::<A<B>, 3>::from_inner(x.clone().repeat_dim(2, 2));
            let (ha, wa, ba) =
                (Tensor::from_inner(h), Tensor::from_inner(w), Tensor::from_inner(b));
            let refused = linear_residual(wide, &ha, &wa, &ba, rule, None);
            assert!(refused.is_err(), "x of another width");
        }
        check::<W>();
        check::<Fusion<W>>();
    }

    /// A layer with its bias and the Swish with its dropout, or the GLU with a row mask, as one
    /// operation against the layer then the gate's operation (the same dropout seed): the
    /// output and each gradient bit for bit, with every input tracked, the layer's input
    /// alone, and the bias alone; under autodiff and fused, over leading axes. A tracked mask,
    /// a dropout after the GLU and an odd GLU width are left to the caller.
    #[test]
    fn a_layer_and_its_gate_are_the_layer_then_the_gate_bit_for_bit() {
        use super::super::device_gates::{on_device_dropped, on_device_masked};
        use super::super::dropout::seed_stream;
        type A<B> = Autodiff<B>;
        fn check<B: super::DeviceMatmul>(gate: Gate) {
            let device = Default::default();
            let (lead, k, n) = ([2, 19], 45, 34);
            let uniform = Distribution::Uniform(-1.0, 1.0);
            let h = Tensor::<B, 3>::random([lead[0], lead[1], k], uniform, &device);
            let w = Tensor::<B, 2>::random([k, n], uniform, &device);
            let b = Tensor::<B, 1>::random([n], uniform, &device);
            let out = if gate == Gate::Glu { n / 2 } else { n };
            let dy = Tensor::<B, 3>::random([lead[0], lead[1], out], uniform, &device);
            // A row mask with some rows off (the convolution module's padded frames).
            let rows = Tensor::<B, 3>::random([lead[0], lead[1], 1], uniform, &device);
            let keep = rows.greater_elem(-0.5).float();
            let dropout = Dropout::new(0.2);
            let bits = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
            let flat = |t: Tensor<B, 3>| {
                let [a, b, c] = t.dims();
                t.reshape([a * b, c])
            };
            let grad_bits =
                |g: Option<Tensor<B, 2>>| g.map(|g| g.into_data().to_vec::<f32>().unwrap());
            // [h, w, b] tracked as asked: the output's bits and each tracked input's gradient's.
            let run = |one_op: bool, tracked: [bool; 3]| {
                seed_stream(0x5eed);
                let ha = Tensor::<A<B>, 3>::from_inner(h.clone());
                let ha = if tracked[0] { ha.require_grad() } else { ha };
                let wa = Tensor::<A<B>, 2>::from_inner(w.clone());
                let wa = if tracked[1] { wa.require_grad() } else { wa };
                let ba = Tensor::<A<B>, 1>::from_inner(b.clone());
                let ba = if tracked[2] { ba.require_grad() } else { ba };
                let keep = Tensor::<A<B>, 3>::from_inner(keep.clone());
                let y = if one_op {
                    let mask = match gate {
                        Gate::Glu => GateMask::Mask(&keep),
                        _ => GateMask::Dropout(&dropout),
                    };
                    linear_gated(&ha, &wa, &ba, gate, mask).expect("a CubeCL type")
                } else {
                    let f = on_device(&ha, &wa, Some(&ba), chosen()).expect("a CubeCL type");
                    match gate {
                        Gate::Glu => on_device_masked(gate, &f, &keep),
                        _ => on_device_dropped(gate, &f, &dropout),
                    }
                    .expect("f32 on a CubeCL type")
                };
                let grads = (y.clone() * Tensor::from_inner(dy.clone())).sum().backward();
                let dh = ha.grad(&grads).map(flat);
                let db = ba.grad(&grads).map(|g| g.reshape([1, n]));
                let dw = wa.grad(&grads);
                (bits(y.inner()), [dh, dw, db].map(grad_bits))
            };
            for tracked in [[true; 3], [true, false, false], [false, false, true]] {
                let (y, grads) = run(true, tracked);
                let (y0, grads0) = run(false, tracked);
                assert!(y.contains(&0.0), "{gate:?}: the mask drops elements");
                assert_eq!(y, y0, "{gate:?}: the output, {tracked:?}");
                for (i, (g, g0)) in grads.iter().zip(&grads0).enumerate() {
                    assert_eq!(g.is_some(), tracked[i], "{gate:?}: gradient {i}, {tracked:?}");
                    assert_eq!(g, g0, "{gate:?}: gradient {i}, {tracked:?}");
                }
            }
            let ha = Tensor::<A<B>, 3>::from_inner(h.clone());
            let (wa, ba) = (Tensor::from_inner(w.clone()), Tensor::from_inner(b.clone()));
            let plain = Tensor::<A<B>, 3>::from_inner(keep);
            let tracked = plain.clone().require_grad();
            let tracked_mask = linear_gated(&ha, &wa, &ba, Gate::Glu, GateMask::Mask(&tracked));
            assert!(tracked_mask.is_none(), "a tracked mask");
            let glu_dropped = linear_gated(&ha, &wa, &ba, Gate::Glu, GateMask::Dropout(&dropout));
            assert!(glu_dropped.is_none(), "a dropout after the GLU");
            let odd = Tensor::<A<B>, 2>::from_inner(w.slice([0..k, 0..n - 1]));
            let odd_b = Tensor::<A<B>, 1>::from_inner(b.slice(0..n - 1));
            let mask = GateMask::Mask(&plain);
            assert!(linear_gated(&ha, &odd, &odd_b, Gate::Glu, mask).is_none(), "odd width");
        }
        for gate in [Gate::Swish, Gate::Glu] {
            check::<W>(gate);
            check::<Fusion<W>>(gate);
        }
    }

    /// Mixed precision's operands (f16 here: lavapipe has no bfloat16), plain and transposed,
    /// through a chosen kernel give float64's product of the rounded values in f32; a kernel
    /// lavapipe cannot run (CMMA) declines, and the caller runs its own product.
    #[test]
    fn half_operands_through_a_chosen_kernel_match_float64() {
        let device = Default::default();
        let (m, k, n) = (37, 29, 23);
        let half = |t: Tensor<W, 2>| t.cast(burn::tensor::FloatDType::F16);
        let a32 = Tensor::<W, 2>::random([m, k], Distribution::Uniform(-1.0, 1.0), &device);
        let b32 = Tensor::<W, 2>::random([n, k], Distribution::Uniform(-1.0, 1.0), &device);
        // `b` as the transposed view of a rounded [n, k] tensor, as a gradient's product reads
        // a weight.
        let (a, b) = (half(a32), half(b32).transpose());
        let rounded = |t: &Tensor<W, 2>| t.clone().cast(burn::tensor::FloatDType::F32);
        let want = oracle(&rounded(&a), &rounded(&b));
        let (pa, pb) = (float(a.clone()), float(b.clone()));
        for kernel in [Kernel::SimpleUnit, Kernel::DoubleUnit] {
            let y = product_with::<W>(&pa, &pb, kernel).expect("unit kernels run on lavapipe");
            assert_eq!(y.dtype, DType::F32, "{kernel:?}");
            let y = Tensor::<W, 2>::from_primitive(TensorPrimitive::Float(y));
            let e = worst(&y, &want);
            eprintln!("{kernel:?}: {e:.1e}");
            // Products of f16 values are exact in f32; the f32 sums' rounding is left
            // (measured 1.5e-7 for both; 9.4e-8 before `aligned_rows` copied both operands,
            // the transposed one row-major: the kernel's order of sums follows the layout).
            assert!(e < 4.5e-7, "{kernel:?}: {e:e}");
        }
        assert!(product_with::<W>(&pa, &pb, Kernel::DoubleCyclicCmma).is_none());
        assert!(product_with::<W>(&pa, &pb, Kernel::Burn).is_none());
    }

    /// An operand whose rows are not 16 bytes apart (f32 and f16, plain and transposed) is
    /// copied into one whose rows are, with the same values; one whose rows are is left as it
    /// is. (The products in the tests above read such operands through it: 45, 33, 29 and 23
    /// values a row.)
    #[test]
    fn operands_get_rows_16_bytes_apart() {
        let device = Default::default();
        let f16 = |t: Tensor<W, 2>| t.cast(burn::tensor::FloatDType::F16);
        let random = |dims: [usize; 2]| {
            Tensor::<W, 2>::random(dims, Distribution::Uniform(-1.0, 1.0), &device)
        };
        let cases = [
            random([7, 13]),
            random([13, 7]).transpose(),
            f16(random([5, 12])),
            f16(random([12, 5])).transpose(),
            random([3, 1]),
        ];
        for t in cases {
            let before = t.clone().cast(burn::tensor::FloatDType::F32).into_data();
            let p = float(t.clone());
            let (size, strides) = (p.dtype.size(), p.meta.strides().to_vec());
            assert!(!(outer_stride(&strides) * size).is_multiple_of(ROW_ALIGN), "{strides:?}");
            let q = aligned_rows(p);
            let outer = outer_stride(q.meta.strides());
            assert_eq!(q.meta.strides()[1], 1, "row-major after the copy");
            assert!((outer * size).is_multiple_of(ROW_ALIGN), "{:?}", q.meta.strides());
            assert!(outer * size < q.meta.shape()[1] * size + ROW_ALIGN, "padded no further");
            let after = Tensor::<W, 2>::from_primitive(TensorPrimitive::Float(q));
            let after = after.cast(burn::tensor::FloatDType::F32).into_data();
            assert_eq!(before, after);
        }
        let kept = float(random([4, 8]).transpose());
        let strides = kept.meta.strides().to_vec();
        assert_eq!(aligned_rows(kept).meta.strides().to_vec(), strides);
    }

    /// `a [Oa, H, m, k] · b [Ob, H, k, n]` in float64 (an outer size of 1 read by every outer
    /// index), and each output's sum of its terms' magnitudes.
    fn stack_oracle(
        a: &Tensor<impl Backend, 4>,
        b: &Tensor<impl Backend, 4>,
    ) -> (Vec<f64>, Vec<f64>) {
        let ([oa, h, m, k], [ob, _, _, n]) = (a.dims(), b.dims());
        let (av, bv) = (values4(a), values4(b));
        let outer = oa.max(ob);
        let (mut y, mut s) = (vec![0.0; outer * h * m * n], vec![0.0; outer * h * m * n]);
        for o in 0..outer {
            let (xa, xb) = (if oa == 1 { 0 } else { o }, if ob == 1 { 0 } else { o });
            for g in 0..h {
                for i in 0..m {
                    for j in 0..n {
                        let at = ((o * h + g) * m + i) * n + j;
                        for p in 0..k {
                            let t = av[((xa * h + g) * m + i) * k + p]
                                * bv[((xb * h + g) * k + p) * n + j];
                            y[at] += t;
                            s[at] += t.abs();
                        }
                    }
                }
            }
        }
        (y, s)
    }

    fn values4(t: &Tensor<impl Backend, 4>) -> Vec<f64> {
        t.clone().into_data().into_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
    }

    fn stack_worst(got: &Tensor<impl Backend, 4>, want: &(Vec<f64>, Vec<f64>)) -> f64 {
        let got = got.clone().into_data().into_vec::<f32>().unwrap();
        assert_eq!(got.len(), want.0.len());
        got.iter()
            .zip(want.0.iter().zip(&want.1))
            .map(|(&g, (w, s))| (f64::from(g) - w).abs() / s.max(1e-30))
            .fold(0.0, f64::max)
    }

    /// The attention's stacks of products as one operation, with Burn's kernel and under
    /// `--matmul cublas` (on lavapipe cuBLAS declines, and the operation runs Burn's product):
    /// the product and both gradients against float64, with the second operand read by every
    /// outer index (its gradient summed over them), and the first; the second transposed as a
    /// view, as the scores took the keys, and by the operation's flag, as they take them now;
    /// bare, under autodiff, and fused.
    #[test]
    fn stacks_of_products_and_their_gradients_match_float64_on_wgpu() {
        fn check<B: burn::tensor::backend::AutodiffBackend>() -> f64 {
            let device = Default::default();
            let random = |dims: [usize; 4]| {
                Tensor::<B, 4>::random(dims, Distribution::Uniform(-1.0, 1.0), &device)
            };
            // (a's shape, b's shape as stored, b transposed: by a view, by the flag)
            let cases: [([usize; 4], [usize; 4], [bool; 2]); 5] = [
                ([3, 2, 5, 4], [3, 2, 4, 6], [false, false]),
                ([3, 2, 5, 4], [1, 2, 6, 4], [true, false]),
                ([3, 2, 5, 4], [1, 2, 6, 4], [false, true]),
                ([3, 2, 5, 4], [3, 2, 6, 4], [false, true]),
                ([1, 2, 5, 4], [3, 2, 4, 6], [false, false]),
            ];
            let mut largest = 0.0f64;
            for kernel in [Kernel::Burn, Kernel::Cublas] {
                for (da, db, [view, flag]) in cases {
                    let a = random(da).require_grad();
                    let b = random(db).require_grad();
                    let operand = if view { b.clone().swap_dims(2, 3) } else { b.clone() };
                    let y = stacked_with(&a, &operand, flag, kernel).expect("a CubeCL type");
                    let dy = random(y.dims());
                    let grads = (y.clone() * dy.clone()).sum().backward();
                    let (ga, gb) = (a.grad(&grads).unwrap(), b.grad(&grads).unwrap());
                    // bt: the second factor as the product reads it.
                    let bt = if view || flag { b.inner().swap_dims(2, 3) } else { b.inner() };
                    let (a, dy) = (a.inner(), dy.inner());
                    let e_y = stack_worst(&y.inner(), &stack_oracle(&a, &bt));
                    // da = dy · btᵀ, summed over the outer axis where a has one; likewise db.
                    let want_a = stack_oracle(&dy, &bt.clone().swap_dims(2, 3));
                    let want_b = stack_oracle(&a.clone().swap_dims(2, 3), &dy);
                    // The outer sums in float64, over the oracle's values and magnitudes.
                    let fold = |(y, s): (Vec<f64>, Vec<f64>), outer: usize, len: usize| {
                        if outer != 1 || y.len() == len {
                            return (y, s);
                        }
                        let mut f = (vec![0.0; len], vec![0.0; len]);
                        for (i, (v, m)) in y.iter().zip(&s).enumerate() {
                            f.0[i % len] += v;
                            f.1[i % len] += m;
                        }
                        f
                    };
                    let e_a = stack_worst(&ga, &fold(want_a, da[0], da.iter().product()));
                    let gbt = if view || flag { gb.swap_dims(2, 3) } else { gb };
                    let e_b = stack_worst(&gbt, &fold(want_b, db[0], db.iter().product()));
                    eprintln!(
                        "{kernel:?} {da:?} · {db:?} (view {view}, flag {flag}): y {e_y:.1e}, \
                         da {e_a:.1e}, db {e_b:.1e}"
                    );
                    largest = largest.max(e_y).max(e_a).max(e_b);
                }
            }
            largest
        }
        // Measured at most 1.6e-7 (Burn's product on lavapipe, either kernel).
        for e in [check::<Autodiff<W>>(), check::<Autodiff<Fusion<W>>>()] {
            assert!(e < 6e-7, "{e:e}");
        }
        // Bare: the forward alone.
        let device = Default::default();
        let a = Tensor::<W, 4>::random([2, 3, 4, 5], Distribution::Uniform(-1.0, 1.0), &device);
        let b = Tensor::<W, 4>::random([1, 3, 5, 2], Distribution::Uniform(-1.0, 1.0), &device);
        for kernel in [Kernel::Burn, Kernel::Cublas] {
            let y = stacked_with(&a, &b, false, kernel).expect("a CubeCL type");
            assert!(stack_worst(&y, &stack_oracle(&a, &b)) < 6e-7);
            let bt = b.clone().swap_dims(2, 3);
            let y = stacked_with(&a, &bt, true, kernel).expect("a CubeCL type");
            assert!(stack_worst(&y, &stack_oracle(&a, &b)) < 6e-7);
        }
        // Shapes that do not chain are left to the caller.
        let c = Tensor::<W, 4>::random([2, 2, 5, 2], Distribution::Uniform(-1.0, 1.0), &device);
        assert!(stacked_with(&a, &c, false, Kernel::Cublas).is_none());
        assert!(stacked_with(&a, &b, true, Kernel::Burn).is_none());
    }

    /// Every kernel either runs (and gives float64's product) or says why not; none panics.
    #[test]
    fn every_kernel_runs_or_says_why() {
        let device = Default::default();
        let a = Tensor::<W, 2>::random([40, 24], Distribution::Uniform(-1.0, 1.0), &device);
        let b = Tensor::<W, 2>::random([24, 16], Distribution::Uniform(-1.0, 1.0), &device);
        let want = oracle(&a, &b);
        for &kernel in Kernel::all() {
            match try_bare(&a, &b, kernel).expect("wgpu is a CubeCL type") {
                Ok(y) => assert!(worst(&y, &want) < 9e-7, "{kernel:?}"),
                Err(why) => assert!(!why.is_empty(), "{kernel:?}"),
            }
        }
    }
}
