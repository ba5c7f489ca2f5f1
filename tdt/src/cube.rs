//! [`TdtBackend`] for Burn's CubeCL backends (wgpu, CUDA): the kernels of `kernels.rs` on the
//! logits where they are, with only the targets and lengths uploaded (a few KiB).
//!
//! Memory: besides the logits, a call allocates the node table (`(6 + D)` f32 per node),
//! alphas and betas (one f32 per node each) and the costs. The gradient is written over the
//! logits when nobody else holds them (the usual case: the joint's backward needs its input,
//! not its output); otherwise over a copy.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::{CubeCount, CubeDim};

use super::batch::BatchInput;
use super::kernels::{tdt_grad, tdt_lattice, tdt_node_probs, FIELDS};
use super::op::{TdtBackend, TdtProblem};
use super::TdtError;

/// Units per cube for the row kernels (a power of two, within every runtime's limit).
const ROW_CUBE: u32 = 256;
/// Units per cube for the lattice: one anti-diagonal's nodes are spread over them.
const LATTICE_CUBE: u32 = 256;
/// wgpu's limit on cubes per dimension.
const MAX_CUBES_X: usize = 65_535;

/// A grid of at least `rows` cubes (the kernels skip the extra ones).
fn row_grid(rows: usize) -> CubeCount {
    let x = rows.clamp(1, MAX_CUBES_X);
    let y = rows.div_ceil(x).max(1);
    CubeCount::Static(x as u32, y as u32, 1)
}

/// A copy of `t` in a new dense buffer (row-major, no padding), whatever the runtime's layout
/// for new tensors (CUDA's is pitched).
fn dense_copy<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let (client, device, dtype) = (t.client.clone(), t.device.clone(), t.dtype);
    let out = cubecl::std::tensor::into_contiguous(&client, t.binding(), dtype.into());
    CubeTensor::new(client, out.handle, *out.metadata, device, dtype)
}

/// Checks a u32 kernel argument.
fn as_u32(what: &'static str, v: usize) -> Result<u32, TdtError> {
    u32::try_from(v).map_err(|_| TdtError::TooLargeForKernel { what, value: v })
}

impl<R, F, I, BT> TdtBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn tdt_forward(
        logits: FloatTensor<Self>,
        problem: &TdtProblem,
        want_grad: bool,
    ) -> Result<(FloatTensor<Self>, Option<FloatTensor<Self>>), TdtError> {
        let dtype = logits.dtype();
        if !<Self as burn::tensor::backend::Backend>::supports_dtype(&logits.device, dtype) {
            return Err(TdtError::DTypeNotOnDevice(dtype));
        }
        match dtype {
            DType::F32 => forward::<R, f32>(logits, problem, want_grad),
            DType::F16 => forward::<R, burn::tensor::f16>(logits, problem, want_grad),
            DType::BF16 => forward::<R, burn::tensor::bf16>(logits, problem, want_grad),
            other => Err(TdtError::DTypeNotRead(other)),
        }
    }
}

/// The three kernels on logits of element type `E`.
fn forward<R: CubeRuntime, E: Float + CubeElement>(
    logits: CubeTensor<R>,
    problem: &TdtProblem,
    want_grad: bool,
) -> Result<(CubeTensor<R>, Option<CubeTensor<R>>), TdtError> {
    let [b, t_max, u1, width] = logits.shape().dims::<4>();
    let n_dur = problem.options.durations.len();
    if u1 != problem.u_max + 1 || width <= n_dur {
        return Err(TdtError::LogitsShape {
            dims: [b, t_max, u1, width],
            u_max: problem.u_max,
            durations: n_dur,
        });
    }
    let vocab = width - n_dur;
    problem.options.validate()?;
    // Everything the kernels index with is checked here, on the host: a bad length or target
    // is an error, never an out-of-bounds read on the device.
    BatchInput {
        logits: &[],
        batch: b,
        t_max,
        u_max: problem.u_max,
        vocab,
        n_dur,
        targets: &problem.targets,
        frame_lens: &problem.frame_lens,
        target_lens: &problem.target_lens,
    }
    .validate_problem(&problem.options)?;
    let rows = b * t_max * u1;
    let (rows_u32, t_u32, u1_u32, umax_u32) = (
        as_u32("lattice nodes", rows)?,
        as_u32("frames", t_max)?,
        as_u32("targets", u1)?,
        as_u32("targets", problem.u_max)?,
    );
    let (v_u32, d_u32) = (as_u32("vocabulary", vocab)?, as_u32("durations", n_dur)?);
    as_u32("logits", rows * width)?;

    let logits = burn_cubecl::kernel::into_contiguous(logits);
    // Asked before any launch takes a reference to the buffer.
    let in_place = logits.can_mut();
    let client = logits.client.clone();
    let device = logits.device.clone();
    let dtype = logits.dtype;
    let upload = |v: &[u32]| {
        // Zero-sized buffers are not allowed everywhere: pad to one element.
        let v: Vec<u32> = if v.is_empty() { vec![0] } else { v.to_vec() };
        let len = v.len();
        (client.create_from_slice(u32::as_bytes(&v)), len)
    };
    let lens = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<u32>>();
    let (targets, targets_len) = upload(&problem.targets);
    let (frame_lens, _) = upload(&lens(&problem.frame_lens));
    let (target_lens, _) = upload(&lens(&problem.target_lens));
    let (durations, _) = upload(&lens(&problem.options.durations));

    let stride = FIELDS + n_dur;
    let f32_bytes = std::mem::size_of::<f32>();
    let table = client.empty(rows * stride * f32_bytes);
    let alpha = client.empty(rows * f32_bytes);
    let beta = client.empty(if want_grad { rows } else { 1 } * f32_bytes);
    let costs = client.empty(b * std::mem::size_of::<E>());
    let arr = |h: &cubecl::server::Handle, len: usize| {
        // SAFETY: every buffer passed through here was allocated above with at least `len`
        // elements of the kernel argument's type.
        unsafe { ArrayArg::from_raw_parts(h.clone(), len) }
    };

    // SAFETY: every index the kernels compute is bounded by the shapes and lengths validated
    // above (node indices < rows, logits indices < rows x width, targets < vocab - 1, lengths
    // within the padded sizes), and each buffer has the length passed with it.
    unsafe {
        tdt_node_probs::launch_unchecked::<E, R>(
            &client,
            row_grid(rows),
            CubeDim::new_1d(ROW_CUBE),
            logits.clone().into_array_arg(),
            arr(&targets, targets_len),
            arr(&frame_lens, b),
            arr(&target_lens, b),
            arr(&table, rows * stride),
            t_u32,
            u1_u32,
            umax_u32,
            v_u32,
            d_u32,
            rows_u32,
            ROW_CUBE as usize,
            !problem.rnnt,
        );
        tdt_lattice::launch_unchecked::<E, R>(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(LATTICE_CUBE),
            arr(&table, rows * stride),
            arr(&alpha, rows),
            arr(&beta, if want_grad { rows } else { 1 }),
            arr(&costs, b),
            arr(&durations, n_dur),
            arr(&frame_lens, b),
            arr(&target_lens, b),
            t_u32,
            u1_u32,
            d_u32,
            problem.options.sigma as f32,
            problem.options.fastemit_lambda as f32,
            u32::from(problem.options.zero_infinity),
            problem.rnnt,
            want_grad,
        );
    }
    let costs =
        CubeTensor::new_contiguous(client.clone(), device.clone(), Shape::new([b]), costs, dtype);
    if !want_grad {
        return Ok((costs, None));
    }
    // The gradient overwrites the logits: in place when this is their only reference, else in
    // a dense copy (not `CubeTensor::copy`, whose buffer CUDA pitches: rows of 1030 values in
    // 1152, which the kernel, indexing densely, would write at the wrong places).
    let grad = if in_place { logits } else { dense_copy(logits) };
    // SAFETY: as above; `grad` is contiguous with rows x width elements.
    unsafe {
        tdt_grad::launch_unchecked::<E, R>(
            &client,
            row_grid(rows),
            CubeDim::new_1d(ROW_CUBE),
            grad.clone().into_array_arg(),
            arr(&table, rows * stride),
            arr(&targets, targets_len),
            arr(&frame_lens, b),
            arr(&target_lens, b),
            t_u32,
            u1_u32,
            umax_u32,
            v_u32,
            d_u32,
            rows_u32,
            problem.options.clamp as f32,
            problem.rnnt,
        );
    }
    Ok((costs, Some(grad)))
}
