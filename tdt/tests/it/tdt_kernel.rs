//! The CubeCL TDT kernels (`asr_tdt::kernels`) on Burn's wgpu backend, against the
//! float64 CPU recursions. On a machine without a GPU, wgpu runs on Mesa's software Vulkan
//! driver (lavapipe, `mesa-vulkan-drivers`), which `scripts/setup.sh` installs.
//!
//! Tolerances: the kernels accumulate in f32 (as NeMo's CUDA kernels do) and the reference in
//! f64. Costs agree to 2e-5 relative (plus 1e-4 absolute); gradients, whose entries are
//! differences of probabilities, to 2e-5 absolute. Half-precision inputs are compared with the
//! f64 path on the same (rounded) values: the kernel still computes in f32, only the gradient
//! is rounded on output, so the bound is that rounding (2^-8 relative for bf16, 2^-11 for f16).

use crate::cases::{case, max_abs, reference, rounded, sized, Case};
use asr_tdt::op::TdtBackend;
use asr_tdt::{TdtError, TdtOptions};
use burn::backend::wgpu::WgpuDevice;
use burn::backend::Wgpu;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};

type W = Wgpu<f32, i32, u32>;

/// The same backend through Burn's fusion (`asr_tdt::fusion`).
#[cfg(feature = "fusion")]
type Fused = burn_fusion::Fusion<W>;

/// Costs and gradients from the kernels, logits stored as `dtype`.
fn kernel(c: &Case, dtype: DType) -> Result<(Vec<f64>, Vec<f32>), TdtError> {
    kernel_on::<W>(c, dtype)
}

/// [`kernel`] on backend `X` (wgpu's default device, fused or not).
fn kernel_on<X: TdtBackend<Device = WgpuDevice>>(
    c: &Case,
    dtype: DType,
) -> Result<(Vec<f64>, Vec<f32>), TdtError> {
    let device = WgpuDevice::default();
    let x = Tensor::<X, 4>::from_data(
        TensorData::new(c.logits.clone(), c.dims).convert_dtype(dtype),
        (&device, dtype),
    );
    // Queued work before the loss, as in training (the fused backend launches it on resolve).
    let x = x.mul_scalar(1.0).add_scalar(0.0);
    let (costs, grads) = X::tdt_forward(x.into_primitive().tensor(), &c.problem, true)?;
    let costs = Tensor::<X, 1>::from_primitive(TensorPrimitive::Float(costs));
    let grads = Tensor::<X, 4>::from_primitive(TensorPrimitive::Float(grads.unwrap()));
    let costs: Vec<f64> = costs.into_data().convert::<f64>().to_vec().unwrap();
    let grads: Vec<f32> = grads.into_data().convert::<f32>().to_vec().unwrap();
    Ok((costs, grads))
}

fn check(label: &str, c: &Case) {
    let (want_c, want_g) = reference(c, &c.logits);
    let (got_c, got_g) = kernel(c, DType::F32).unwrap();
    for (b, (g, w)) in got_c.iter().zip(&want_c).enumerate() {
        assert!(
            (g - w).abs() <= 2e-5 * w.abs() + 1e-4 || (w.is_infinite() && g == w),
            "{label}: utterance {b}: cost {g} vs {w}"
        );
    }
    let dg = max_abs(&got_g, &want_g);
    assert!(dg <= 2e-5, "{label}: gradients differ by {dg:.3e}");
}

#[test]
fn kernel_matches_the_f64_cpu_path_on_ragged_batches() {
    let base = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let variants: Vec<(&str, TdtOptions, bool)> = vec![
        ("parakeet", base.clone(), false),
        ("no sigma", TdtOptions { sigma: 0.0, ..base.clone() }, false),
        ("durations 1,2", TdtOptions { durations: vec![1, 2], ..base.clone() }, false),
        ("durations 0,2,5", TdtOptions { durations: vec![0, 2, 5], ..base.clone() }, false),
        ("fastemit", TdtOptions { fastemit_lambda: 0.01, ..base.clone() }, false),
        ("clamp", TdtOptions { clamp: 0.05, ..base.clone() }, false),
        ("rnnt branch", base.clone(), true),
    ];
    for (i, (label, options, rnnt)) in variants.iter().enumerate() {
        for (j, vocab) in [7usize, 40, 700].into_iter().enumerate() {
            let seed = 100 + 10 * i as u64 + j as u64;
            check(&format!("{label}, vocab {vocab}"), &case(seed, 4, vocab, options, *rnnt));
        }
    }
}

#[test]
fn long_lattices_match() {
    // Diagonals longer than a cube (256 units) and frames past wgpu's 65535 cubes per
    // dimension in the row kernels.
    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let mut c = sized(7, [2, 300, 260], 12, &options, false);
    c.problem.frame_lens[1] = 211;
    c.problem.target_lens[1] = 97;
    let (want_c, want_g) = reference(&c, &c.logits);
    let (got_c, got_g) = kernel(&c, DType::F32).unwrap();
    for (g, w) in got_c.iter().zip(&want_c) {
        // ~156,000 nodes per utterance in f32: the log-domain sums keep ~1e-6 relative.
        assert!((g - w).abs() <= 2e-5 * w.abs(), "cost {g} vs {w}");
    }
    // Occupancies are exp(alpha + beta - log P) with each term near -760 here: an f32 ulp of
    // 760 is 6e-5, and a few of them in the exponent bound the gradient's error (measured:
    // 5e-4; NeMo's CUDA kernels accumulate in f32 too).
    let dg = max_abs(&got_g, &want_g);
    eprintln!("long lattices: max |gradient difference| {dg:.3e}");
    assert!(dg <= 2e-3, "gradients differ by {dg:.3e}");
}

#[test]
fn half_precision_logits_are_read_and_accumulated_in_f32() {
    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let device = WgpuDevice::default();
    for (dtype, rel) in [(DType::F16, 1.0 / 2048.0), (DType::BF16, 1.0 / 256.0)] {
        let supported = <W as burn::tensor::backend::Backend>::supports_dtype(&device, dtype);
        let c = case(55, 3, 30, &options, false);
        if !supported {
            // lavapipe has f16 but not bf16 (wgpu exposes no bf16 shader type); CUDA has both.
            assert_eq!(dtype, DType::BF16, "{dtype:?} unsupported");
            eprintln!("{dtype:?}: not supported by this wgpu adapter");
            continue;
        }
        // The reference sees the same rounded logits.
        let (want_c, want_g) = reference(&c, &rounded(&c.logits, c.dims, dtype));
        let (got_c, got_g) = kernel(&c, dtype).unwrap();
        for (g, w) in got_c.iter().zip(&want_c) {
            assert!((g - w).abs() <= rel * w.abs() + 1e-3, "{dtype:?}: cost {g} vs {w}");
        }
        for (i, (g, w)) in got_g.iter().zip(&want_g).enumerate() {
            assert!(
                f64::from((g - w).abs()) <= rel * f64::from(w.abs()) + 2e-5,
                "{dtype:?}: gradient {i}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn impossible_alignments_and_non_finite_logits() {
    // Durations 2 and 4 cannot end a 1-frame utterance: +inf, or 0 with zero_infinity; the
    // gradient is zero either way, never NaN.
    for zero_infinity in [false, true] {
        let options = TdtOptions {
            durations: vec![2, 4],
            omega: 0.0,
            zero_infinity,
            ..TdtOptions::default()
        };
        let mut c = sized(3, [2, 6, 2], 9, &options, false);
        c.problem.frame_lens[1] = 1;
        let (want_c, _) = reference(&c, &c.logits);
        let (got_c, got_g) = kernel(&c, DType::F32).unwrap();
        assert_eq!(got_c[1], want_c[1], "zero_infinity {zero_infinity}");
        assert!(got_g.iter().all(|g| g.is_finite()));
        check("impossible", &c);
    }
    // A NaN logit makes that utterance's cost NaN (the trainer counts a skipped step); the
    // kernel finishes and the other utterances are unaffected.
    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let mut c = sized(4, [2, 6, 3], 9, &options, false);
    c.problem.frame_lens[1] = 6;
    let (want_c, _) = reference(&c, &c.logits);
    let width = c.dims[3];
    let per_b = c.dims[1] * c.dims[2] * width;
    c.logits[per_b + 3] = f32::NAN;
    let (got_c, _) = kernel(&c, DType::F32).unwrap();
    assert!((got_c[0] - want_c[0]).abs() <= 2e-5 * want_c[0].abs() + 1e-4);
    assert!(got_c[1].is_nan(), "cost {}", got_c[1]);
}

#[test]
fn bad_lengths_and_targets_are_errors_before_any_launch() {
    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let c = case(5, 2, 9, &options, false);
    let mut long = case(5, 2, 9, &options, false);
    long.problem.frame_lens[0] = c.dims[1] + 1;
    let err = kernel(&long, DType::F32).unwrap_err();
    assert!(matches!(err, TdtError::UtteranceLengths { utterance: 0, .. }), "{err}");
    let mut bad_target = sized(5, [2, 4, 3], 9, &options, false);
    bad_target.problem.targets[0] = 8; // the blank id
    let err = kernel(&bad_target, DType::F32).unwrap_err();
    assert_eq!(err, TdtError::Target { utterance: 0, position: 0, id: 8, blank: 8 });
    let mut short = case(5, 2, 9, &options, false);
    short.problem.frame_lens.pop();
    let err = kernel(&short, DType::F32).unwrap_err();
    assert!(matches!(err, TdtError::LengthCounts { batch: 2, frame_lens: 1, .. }), "{err}");
}

#[test]
fn autodiff_backward_on_wgpu_is_the_closed_form_gradient_times_the_reduction() {
    crate::tdt::check_backward::<burn::backend::Autodiff<W>>(&WgpuDevice::default());
}

/// f16 logits at Parakeet-TDT-0.6B's widths (1024 tokens + blank, 5 durations: 1030 wide) on a
/// 300 x 80 lattice, against the float64 CPU path on the same rounded logits.
#[test]
fn f16_logits_at_parakeet_widths() {
    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let device = WgpuDevice::default();
    assert!(<W as burn::tensor::backend::Backend>::supports_dtype(&device, DType::F16));
    let c = sized(91, [2, 300, 80], 1025, &options, false);
    assert_eq!(c.dims, [2, 300, 81, 1030]);
    let (want_c, want_g) = reference(&c, &rounded(&c.logits, c.dims, DType::F16));
    let (got_c, got_g) = kernel(&c, DType::F16).unwrap();
    let cost_rel =
        got_c.iter().zip(&want_c).map(|(g, w)| (g - w).abs() / w.abs()).fold(0.0, f64::max);
    let grad_abs = max_abs(&got_g, &want_g);
    eprintln!(
        "f16 at Parakeet widths: costs {want_c:?}, max relative cost error {cost_rel:.3e}, \
         max |gradient difference| {grad_abs:.3e}"
    );
    assert!(cost_rel <= F16_PARAKEET_COST_REL, "relative cost error {cost_rel:.3e}");
    assert!(grad_abs <= F16_PARAKEET_GRAD_ABS, "gradient error {grad_abs:.3e}");
}

// Measured on lavapipe: 3.135e-4 relative on the costs (679 and 556), 4.269e-4 on the gradient.
// Both are f16's rounding of the outputs, not the f32 accumulation: the kernels write costs and
// gradients in the logits' type (f16's spacing is 0.5 between 512 and 1024, about 1e-3 near 1).
// The bounds are 3.2x and 4.7x the measurement.
const F16_PARAKEET_COST_REL: f64 = 1e-3;
const F16_PARAKEET_GRAD_ABS: f64 = 2e-3;

/// Through Burn's fusion the loss runs the same kernels on the same values: results equal the
/// unfused backend's bit for bit, checks stay errors, and autodiff's backward is unchanged.
#[cfg(feature = "fusion")]
#[test]
fn the_fused_backend_runs_the_same_kernels() {
    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    for (seed, rnnt) in [(301, false), (302, true)] {
        let c = case(seed, 4, 40, &options, rnnt);
        let plain = kernel_on::<W>(&c, DType::F32).unwrap();
        let fused = kernel_on::<Fused>(&c, DType::F32).unwrap();
        assert_eq!(plain, fused, "seed {seed}");
        let (want_c, want_g) = reference(&c, &c.logits);
        for (g, w) in fused.0.iter().zip(&want_c) {
            assert!((g - w).abs() <= 2e-5 * w.abs() + 1e-4, "cost {g} vs {w}");
        }
        assert!(max_abs(&fused.1, &want_g) <= 2e-5);
    }
    let mut bad_target = sized(5, [2, 4, 3], 9, &options, false);
    bad_target.problem.targets[0] = 8;
    let err = kernel_on::<Fused>(&bad_target, DType::F32).unwrap_err();
    assert_eq!(err, TdtError::Target { utterance: 0, position: 0, id: 8, blank: 8 });
    crate::tdt::check_backward::<burn::backend::Autodiff<Fused>>(&WgpuDevice::default());
}
