//! The loss on burn-flex, Burn's current CPU backend, which stores f32, f16 and bf16 tensors
//! (lavapipe, the wgpu adapter here, has no bf16; only CUDA runs the kernels' bf16 path).
//!
//! Flex runs the host path: the logits are read as f32, the float64 recursions run, and costs
//! and gradients come back in the logits' own type, as the kernels return them. So the values
//! are exactly the float64 path's on the same (rounded) logits, rounded to that type: the tests
//! compare bit for bit, and print the error that rounding leaves against float64.

use crate::cases::{reference, rounded, sized, Case};
use asr_tdt::op::{TdtBackend, TdtLoss};
use asr_tdt::{Reduction, TdtOptions};
use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};

/// `values` rounded to `dtype` and read back.
fn to_dtype<T: burn::tensor::Element>(values: Vec<T>, dtype: DType) -> Vec<f32> {
    let n = values.len();
    TensorData::new(values, [n]).convert_dtype(dtype).convert::<f32>().to_vec().unwrap()
}

/// Logits of `c` stored as `dtype` on Flex.
fn logits<B: burn::tensor::backend::Backend>(c: &Case, dtype: DType) -> Tensor<B, 4> {
    let data = TensorData::new(c.logits.clone(), c.dims).convert_dtype(dtype);
    Tensor::from_data(data, (&Default::default(), dtype))
}

/// Parakeet-TDT-0.6B's widths (1024 tokens + blank, 5 durations: 1030 wide) on 200 x 60
/// lattices, in each type Flex stores.
#[test]
fn flex_returns_the_f64_path_rounded_to_the_logits_type_at_parakeet_widths() {
    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let mut c = sized(17, [3, 200, 60], 1025, &options, false);
    assert_eq!(c.dims, [3, 200, 61, 1030]);
    c.problem.frame_lens[1] = 143;
    c.problem.target_lens[1] = 41;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let (want_c, want_g) = reference(&c, &rounded(&c.logits, c.dims, dtype));
        let x = logits::<Flex>(&c, dtype).into_primitive().tensor();
        let (costs, grads) = Flex::tdt_forward(x, &c.problem, true).unwrap();
        let costs = Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(costs));
        let grads = Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(grads.unwrap()));
        assert_eq!((costs.dtype(), grads.dtype()), (dtype, dtype));
        let got_c: Vec<f32> = costs.into_data().convert::<f32>().to_vec().unwrap();
        let got_g: Vec<f32> = grads.into_data().convert::<f32>().to_vec().unwrap();
        // The host path's f32 costs and gradients, then the logits' type.
        let f32_costs: Vec<f32> = want_c.iter().map(|&w| w as f32).collect();
        assert_eq!(got_c, to_dtype(f32_costs, dtype), "{dtype:?}: costs");
        let expected_g = to_dtype(want_g.clone(), dtype);
        let mismatch = got_g.iter().zip(&expected_g).position(|(g, w)| g.to_bits() != w.to_bits());
        assert_eq!(mismatch, None, "{dtype:?}: first differing gradient entry");

        let cost_rel = got_c
            .iter()
            .zip(&want_c)
            .map(|(&g, w)| (f64::from(g) - w).abs() / w.abs())
            .fold(0.0, f64::max);
        let grad_abs = crate::cases::max_abs(&got_g, &want_g);
        eprintln!(
            "{dtype:?} on Flex: costs {want_c:.2?}: max relative cost error {cost_rel:.3e}, \
             max |gradient difference| {grad_abs:.3e} (the type's rounding)"
        );
    }
}

/// Through the autodiff operation and `TdtLoss` as the trainer calls it: bf16 logits give a
/// bf16 gradient; the loss is reduced in f32.
#[test]
fn bf16_logits_train_through_autodiff_on_flex() {
    type Ad = Autodiff<Flex>;
    let options =
        TdtOptions { omega: 0.0, reduction: Reduction::MeanVolume, ..TdtOptions::default() };
    let c = sized(23, [4, 40, 12], 129, &options, false);
    let p = &c.problem;
    let x = logits::<Ad>(&c, DType::BF16).require_grad();
    let mut loss = TdtLoss::new(options.clone(), 3).unwrap();
    let out = loss.forward(x.clone(), &p.targets, &p.frame_lens, &p.target_lens).unwrap();
    assert_eq!(out.loss.dtype(), DType::F32);
    let grads = out.loss.backward();
    let g = x.grad(&grads).unwrap();
    assert_eq!(g.dtype(), DType::BF16);
    let got_g: Vec<f32> = g.into_data().convert::<f32>().to_vec().unwrap();

    let (want_c, want_g) = reference(&c, &rounded(&c.logits, c.dims, DType::BF16));
    let (want_loss, factors) =
        asr_tdt::batch::reduce(&want_c, &p.target_lens, Reduction::MeanVolume);
    // The loss: f32 sums of bf16 costs, so the costs' rounding bounds it (2^-8 relative).
    let got_loss = f64::from(out.loss.into_data().to_vec::<f32>().unwrap()[0]);
    let loss_rel = (got_loss - want_loss).abs() / want_loss;
    // The gradient: each utterance's bf16 gradient times its bf16 factor, rounded to bf16.
    let block = c.dims[1] * c.dims[2] * c.dims[3];
    let factor_bf16 = to_dtype(factors.clone(), DType::BF16);
    let scaled: Vec<f32> = to_dtype(want_g.clone(), DType::BF16)
        .iter()
        .enumerate()
        .map(|(i, g)| g * factor_bf16[i / block])
        .collect();
    let expected_g = to_dtype(scaled, DType::BF16);
    let mismatch = got_g.iter().zip(&expected_g).position(|(g, w)| g.to_bits() != w.to_bits());
    let exact: Vec<f32> = want_g
        .iter()
        .enumerate()
        .map(|(i, g)| (f64::from(*g) * factors[i / block]) as f32)
        .collect();
    eprintln!(
        "bf16 through autodiff on Flex: loss {got_loss:.4} vs {want_loss:.4} (relative {loss_rel:.2e}), \
         max |gradient difference| against float64 {:.3e}",
        crate::cases::max_abs(&got_g, &exact)
    );
    assert!(loss_rel <= 1.0 / 256.0, "loss {got_loss} vs {want_loss}");
    assert_eq!(mismatch, None, "first differing gradient entry");
}
