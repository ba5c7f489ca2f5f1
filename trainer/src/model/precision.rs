//! Mixed precision: which floating-point type the model's products run in (`train.precision`).
//!
//! Burn 0.21 has no autocast, but its tensors carry their type at run time and `Tensor::cast`
//! is differentiable (its backward casts the gradient back to the input's type). So the wrappers
//! here cast a product's input and the f32 parameters to the compute type, run the product
//! there, and return f32: each parameter's gradient arrives in f32, master weights and the
//! optimizer state never leave it. What runs in which type is written in ARCHITECTURE.md
//! ("Mixed precision").

use std::fmt;
use std::str::FromStr;

use super::host_reshape::Reshaped;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::{DType, FloatDType};
use serde::{Deserialize, Serialize};

/// The type of the model's matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Precision {
    /// Everything in f32 (on CUDA, f32 matrix products may use TF32).
    #[default]
    #[serde(rename = "f32")]
    F32,
    /// Products in bfloat16, the rest in f32 (NeMo's `bf16-mixed`).
    #[serde(rename = "bf16-mixed")]
    Bf16Mixed,
    /// Products in float16, the rest in f32, the loss scaled dynamically (`crate::loss_scale`).
    #[serde(rename = "f16-mixed")]
    F16Mixed,
}

/// The names `train.precision` and `--precision` take.
pub const KNOWN: &str = "f32, bf16-mixed, f16-mixed";

/// Why a precision cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrecisionError {
    /// Not a precision's name.
    #[error("unknown precision {0:?} (known: {KNOWN})")]
    Unknown(String),
    /// The backend cannot compute in the precision's type on this device.
    #[error("precision {precision} needs {dtype} arithmetic, which {device} does not have{hint}")]
    Unsupported {
        /// The precision asked for.
        precision: Precision,
        /// Its compute type.
        dtype: &'static str,
        /// The device, as the command line names it.
        device: String,
        /// What to use instead, when there is something.
        hint: &'static str,
    },
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Bf16Mixed => "bf16-mixed",
            Precision::F16Mixed => "f16-mixed",
        })
    }
}

impl FromStr for Precision {
    type Err = PrecisionError;

    fn from_str(s: &str) -> Result<Precision, PrecisionError> {
        match s.trim() {
            "f32" => Ok(Precision::F32),
            "bf16-mixed" => Ok(Precision::Bf16Mixed),
            "f16-mixed" => Ok(Precision::F16Mixed),
            other => Err(PrecisionError::Unknown(other.to_owned())),
        }
    }
}

impl Precision {
    /// The type products run in, or `None` for f32 (no cast at all).
    pub fn compute(self) -> Option<FloatDType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16Mixed => Some(FloatDType::BF16),
            Precision::F16Mixed => Some(FloatDType::F16),
        }
    }

    /// Whether the loss is scaled dynamically (f16's narrow exponent range).
    pub fn scales_loss(self) -> bool {
        self == Precision::F16Mixed
    }

    /// Refuses a precision whose compute type backend `B` cannot do arithmetic in on `device`
    /// (named `name` in the error), before anything runs.
    pub fn check<B: Backend>(self, device: &B::Device, name: &str) -> Result<(), PrecisionError> {
        let Some(dtype) = self.compute() else {
            return Ok(());
        };
        if B::supports_dtype(device, DType::from(dtype)) {
            return Ok(());
        }
        let dtype = if dtype == FloatDType::BF16 { "bfloat16" } else { "float16" };
        let hint = if name == "cpu" {
            ": `--device flex` runs it on the CPU (burn-flex)"
        } else if self == Precision::Bf16Mixed {
            ": try f16-mixed, or f32"
        } else {
            ": use f32"
        };
        Err(PrecisionError::Unsupported { precision: self, dtype, device: name.to_owned(), hint })
    }

    /// `x` in the compute type (unchanged in f32).
    pub fn down<B: Backend, const D: usize>(self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self.compute() {
            Some(dtype) => x.cast(dtype),
            None => x,
        }
    }

    /// `x` back in f32 (unchanged when it is).
    pub fn up<B: Backend, const D: usize>(self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self.compute() {
            Some(_) => x.cast(FloatDType::F32),
            None => x,
        }
    }

    /// `layer(x)` computed in the compute type, the output left in it.
    ///
    /// The leading axes are flattened first: Burn's `linear` on `[B, T, in]` runs `B` products
    /// against a broadcast weight, and its weight gradient is `B` weight-sized products summed
    /// afterwards; over `[B * T, in]` each is one product (the feed-forward's weight backward
    /// at the 0.6B width, bench/RESULTS.md, "The LSTM recurrence on the host"). In f32 on the
    /// CubeCL backends the product's operation flattens them itself ([`Self::linear_device`]).
    pub fn linear_low<B: Backend, const D: usize>(
        self,
        layer: &Linear<B>,
        x: Tensor<B, D>,
    ) -> Tensor<B, D> {
        if D < 2 {
            return match self.compute() {
                None => layer.forward(x),
                Some(_) => self.linear_down(layer, x),
            };
        }
        if self.compute().is_none() {
            if let Some(y) = self.linear_device(layer, &x, true) {
                return y;
            }
        }
        on_rows(x, |x| self.linear_2d(layer, x))
    }

    /// [`Self::linear_low`] on `[rows, in]` where [`Self::linear_device`] does not take it;
    /// in f32 on NdArray, one host operation (`host_linear`).
    fn linear_2d<B: Backend>(self, layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
        if self.compute().is_none() {
            let bias = layer.bias.as_ref().map(|b| b.val());
            if let Some(y) = super::host_linear::on_host(&x, &layer.weight.val(), bias.as_ref()) {
                return y;
            }
            return layer.forward(x);
        }
        self.linear_down(layer, x)
    }

    /// Burn's `linear` on the input, weight and bias cast down to the compute type.
    fn linear_down<B: Backend, const D: usize>(
        self,
        layer: &Linear<B>,
        x: Tensor<B, D>,
    ) -> Tensor<B, D> {
        let weight = self.down(layer.weight.val());
        let bias = layer.bias.as_ref().map(|b| self.down(b.val()));
        burn::tensor::module::linear(self.down(x), weight, bias)
    }

    /// `x` times `layer`'s weight, plus its bias when `bias`, on the CubeCL backends, returned
    /// in f32; `None` on other backends, or where the operations do not take the operands.
    /// - In f32: one operation on `[.., in]`, the bias's addition included, and one for its
    ///   gradients (`device_matmul::linear`: the rows are viewed as a matrix inside it, so
    ///   fusion's stream holds no reshape).
    /// - Mixed: one mixed product (`device_mixed`: the operands rounded to the compute type,
    ///   the product written in f32; the bias added in f32), the leading axes flattened.
    #[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(unused_variables))]
    fn linear_device<B: Backend, const D: usize>(
        self,
        layer: &Linear<B>,
        x: &Tensor<B, D>,
        bias: bool,
    ) -> Option<Tensor<B, D>> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if D >= 2 {
            let w = layer.weight.val();
            let b = layer.bias.as_ref().filter(|_| bias).map(|b| b.val());
            let Some(dtype) = self.compute() else {
                return super::device_matmul::linear(x, &w, b.as_ref());
            };
            let dims = x.dims();
            let rows = x.clone().reshaped([dims[..D - 1].iter().product(), dims[D - 1]]);
            let y = super::device_mixed::product(&rows, &w, dtype)?;
            let y = match b {
                Some(b) => match super::device_bias::on_device(y, &b) {
                    Ok(y) => y,
                    Err(y) => y + b.unsqueeze_dim::<2>(0),
                },
                None => y,
            };
            return Some(from_rows(y, dims));
        }
        None
    }

    /// `x` times `layer`'s weight, without its bias, computed in the compute type (the leading
    /// axes flattened, as [`Self::linear_low`]), returned in f32: for an operation that adds
    /// the bias itself (`encoder::split_heads` on the CubeCL backends).
    pub fn linear_unbiased<B: Backend, const D: usize>(
        self,
        layer: &Linear<B>,
        x: Tensor<B, D>,
    ) -> Tensor<B, D> {
        if let Some(y) = self.linear_device(layer, &x, false) {
            return y;
        }
        on_rows(x, |x| {
            self.up(burn::tensor::module::linear(self.down(x), self.down(layer.weight.val()), None))
        })
    }

    /// `layer(x)` computed in the compute type, returned in f32 (on the CubeCL backends the
    /// product is written in f32 without being rounded to the compute type, `device_mixed`).
    pub fn linear<B: Backend, const D: usize>(
        self,
        layer: &Linear<B>,
        x: Tensor<B, D>,
    ) -> Tensor<B, D> {
        // In f32, `linear_low` takes the device path itself.
        if self.compute().is_some() {
            if let Some(y) = self.linear_device(layer, &x, true) {
                return y;
            }
        }
        self.up(self.linear_low(layer, x))
    }

    /// `a.matmul(b)` computed in the compute type, returned in f32 (on the CubeCL backends as
    /// `device_mixed`'s one operation, the product not rounded to the compute type). In f32 on
    /// the CubeCL backends, a stack of four axes is one operation (`device_matmul::stacked`:
    /// through cuBLAS under `--matmul cublas` with `ASRT_CUBLAS_STACKS=1`, else Burn's
    /// product).
    pub fn matmul<B: Backend, const D: usize>(
        self,
        a: Tensor<B, D>,
        b: Tensor<B, D>,
    ) -> Tensor<B, D> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if let Some(y) =
            self.compute().and_then(|dtype| super::device_mixed::product(&a, &b, dtype))
        {
            return y;
        }
        if let Some(y) = self.stack_f32(&a, &b, false) {
            return y;
        }
        self.up(self.down(a).matmul(self.down(b)))
    }

    /// `a · bᵀ` (`b`'s last two axes swapped) as [`Self::matmul`]; in f32 on the CubeCL
    /// backends a stack of four axes is one operation that reads `b` transposed itself, so
    /// fusion's stream holds no swap of axes for it, forward or backward (the attention's
    /// scores against the keys and the positions).
    pub fn matmul_transposed<B: Backend, const D: usize>(
        self,
        a: Tensor<B, D>,
        b: Tensor<B, D>,
    ) -> Tensor<B, D> {
        if let Some(y) = self.stack_f32(&a, &b, true) {
            return y;
        }
        self.matmul(a, b.swap_dims(D - 2, D - 1))
    }

    /// In f32 on the CubeCL backends, the stack `a · b` (`· bᵀ` where `transposed_b`) of four
    /// axes as one operation (`device_matmul::stacked`); `None` elsewhere.
    #[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(unused_variables))]
    fn stack_f32<B: Backend, const D: usize>(
        self,
        a: &Tensor<B, D>,
        b: &Tensor<B, D>,
        transposed_b: bool,
    ) -> Option<Tensor<B, D>> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if self.compute().is_none() && D == 4 {
            use super::host_depthwise::cast;
            let four = |t: &Tensor<B, D>| cast::<_, Tensor<B, 4>>(t.clone());
            return four(a)
                .zip(four(b))
                .and_then(|(a, b)| super::device_matmul::stacked(&a, &b, transposed_b))
                .and_then(cast::<_, Tensor<B, D>>);
        }
        None
    }
}

/// `f` of `x` `[.., in]` with its leading axes flattened, `[rows, in]`, and the result's
/// `[rows, out]` shaped back to `[.., out]`.
fn on_rows<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    f: impl FnOnce(Tensor<B, 2>) -> Tensor<B, 2>,
) -> Tensor<B, D> {
    let dims = x.dims();
    let rows = dims[..D - 1].iter().product::<usize>();
    from_rows(f(x.reshaped([rows, dims[D - 1]])), dims)
}

/// `y` `[rows, out]` shaped as `dims` `[.., in]` with its last axis `out`.
fn from_rows<B: Backend, const D: usize>(y: Tensor<B, 2>, mut dims: [usize; D]) -> Tensor<B, D> {
    dims[D - 1] = y.dims()[1];
    y.reshaped(dims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex, NdArray};
    use burn::module::AutodiffModule;
    use burn::nn::LinearConfig;

    #[test]
    fn names_round_trip_and_unknown_ones_list_the_known() {
        for p in [Precision::F32, Precision::Bf16Mixed, Precision::F16Mixed] {
            assert_eq!(p.to_string().parse::<Precision>(), Ok(p));
        }
        let e = "bf16".parse::<Precision>().unwrap_err();
        assert_eq!(e.to_string(), "unknown precision \"bf16\" (known: f32, bf16-mixed, f16-mixed)");
    }

    #[test]
    fn ndarray_is_refused_with_the_device_named_and_flex_accepted() {
        let e = Precision::Bf16Mixed.check::<NdArray>(&Default::default(), "cpu").unwrap_err();
        assert_eq!(
            e.to_string(),
            "precision bf16-mixed needs bfloat16 arithmetic, which cpu does not have: \
             `--device flex` runs it on the CPU (burn-flex)"
        );
        assert!(Precision::F32.check::<NdArray>(&Default::default(), "cpu").is_ok());
        for p in [Precision::Bf16Mixed, Precision::F16Mixed] {
            assert!(p.check::<Flex>(&Default::default(), "flex").is_ok());
        }
    }

    /// The product is rounded to the compute type and the weight's gradient comes back in f32,
    /// equal to the f32 gradient within the type's rounding.
    #[test]
    fn linear_rounds_the_product_and_keeps_f32_gradients() {
        type B = Autodiff<Flex>;
        let device = Default::default();
        let layer = LinearConfig::new(16, 8).init::<B>(&device);
        let x = Tensor::<B, 2>::random([4, 16], burn::tensor::Distribution::Default, &device);
        let f32_out = layer.forward(x.clone());
        let want = f32_out.clone().into_data().to_vec::<f32>().unwrap();
        let grad_f32 = f32_out.sum().backward();
        let gw_f32 = layer.weight.grad(&grad_f32).unwrap().into_data().to_vec::<f32>().unwrap();
        for (p, rel) in
            [(Precision::Bf16Mixed, 2f32.powi(-8)), (Precision::F16Mixed, 2f32.powi(-11))]
        {
            let out = p.linear(&layer, x.clone());
            assert_eq!(out.dtype(), DType::F32);
            let got = out.clone().into_data().to_vec::<f32>().unwrap();
            // Inputs and weights rounded (two relative errors of `rel`), the sum of 16 products
            // accumulated in f32 and rounded once more. Measured: 0.83 (bf16) and 1.0 (f16)
            // `rel` of the largest output; gradients (sums of 4 inputs rounded) 1.8 and 2.3 `rel`.
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = got.iter().zip(&want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
            eprintln!("{p}: output error {err:.3e} (scale {scale:.2}, rel {rel:.2e})");
            assert!(err > 0.0, "{p}: no rounding at all, so no cast happened");
            assert!(err < 4.0 * rel * scale.max(1.0), "{p}: error {err} (scale {scale})");
            let grads = out.sum().backward();
            let gw = layer.weight.grad(&grads).unwrap();
            assert_eq!(gw.dtype(), DType::F32);
            let gw = gw.into_data().to_vec::<f32>().unwrap();
            let gerr = gw.iter().zip(&gw_f32).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
            eprintln!("{p}: weight gradient error {gerr:.3e}");
            assert!(gerr < 8.0 * rel, "{p}: weight gradient off by {gerr}");
        }
    }

    /// Rank 3 through the flattened product, which on NdArray is the host operation
    /// (`host_linear`), equals Burn's broadcast `Linear` on rank 3: the output and the input's,
    /// weight's and bias's gradients, with and without a bias (measured on the host: 1.1e-7 of
    /// the largest value at most over two runs); the bare backend gives the tracked values.
    #[test]
    fn the_unbiased_product_plus_the_bias_is_the_linear_layer() {
        let device = Default::default();
        let layer = LinearConfig::new(16, 8).init::<NdArray>(&device);
        let normal = burn::tensor::Distribution::Normal(0.0, 1.0);
        let x = Tensor::<NdArray, 3>::random([3, 5, 16], normal, &device);
        let bias = layer.bias.as_ref().expect("a bias").val().reshape([1, 1, 8]);
        let got = Precision::F32.linear_unbiased(&layer, x.clone()) + bias;
        // One f32 sum after the same product: the same bits.
        let want = burn::tensor::module::linear(x, layer.weight.val(), layer.bias.map(|b| b.val()));
        assert_eq!(got.into_data(), want.into_data());
    }

    #[test]
    fn a_rank_3_input_is_flattened_with_the_same_results() {
        type B = Autodiff<NdArray>;
        let device = Default::default();
        // The largest difference relative to the largest value of the reference.
        let diff = |a: Vec<f32>, b: Vec<f32>| {
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            a.iter().zip(&b).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / scale
        };
        for bias in [true, false] {
            let layer = LinearConfig::new(16, 8).with_bias(bias).init::<B>(&device);
            let normal = burn::tensor::Distribution::Normal(0.0, 1.0);
            let x = Tensor::<B, 3>::random([3, 5, 16], normal, &device).require_grad();
            let mix = Tensor::<B, 3>::random([3, 5, 8], normal, &device);
            let want = layer.forward(x.clone());
            let got = Precision::F32.linear(&layer, x.clone());
            assert_eq!(got.dims(), [3, 5, 8]);
            let bare = Precision::F32.linear(&layer.valid(), x.clone().inner());
            assert_eq!(bare.into_data(), got.clone().inner().into_data());
            let gw = (want.clone() * mix.clone()).sum().backward();
            let gg = (got.clone() * mix).sum().backward();
            let out = diff(got.into_data().to_vec().unwrap(), want.into_data().to_vec().unwrap());
            let dw = diff(
                layer.weight.grad(&gg).unwrap().into_data().to_vec().unwrap(),
                layer.weight.grad(&gw).unwrap().into_data().to_vec().unwrap(),
            );
            let dx = diff(
                x.grad(&gg).unwrap().into_data().to_vec().unwrap(),
                x.grad(&gw).unwrap().into_data().to_vec().unwrap(),
            );
            let db = match &layer.bias {
                Some(b) => diff(
                    b.grad(&gg).unwrap().into_data().to_vec().unwrap(),
                    b.grad(&gw).unwrap().into_data().to_vec().unwrap(),
                ),
                None => 0.0,
            };
            eprintln!(
                "host linear (bias {bias}): output {out:.2e}, weight gradient {dw:.2e}, \
                 input {dx:.2e}, bias {db:.2e}"
            );
            assert!(out < 5e-7 && dw < 5e-7 && dx < 5e-7 && db < 5e-7, "{out} {dw} {dx} {db}");
        }
    }
}
