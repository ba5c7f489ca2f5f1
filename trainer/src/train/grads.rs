//! Gradient helpers over a module's parameters: global norm, scaling, dropping a sub-module's
//! gradients (to freeze it), and finiteness. On NdArray the norm and the scaling are host passes
//! over rayon's pool (`squared_sum_on_host`, `scaled_on_host`).

use burn::backend::ndarray::NdArrayTensor;
use burn::backend::NdArray;
use burn::module::{ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use rayon::prelude::*;

use crate::model::host_depthwise::{cast, float, with_values};

/// Sums the squares of every gradient of the visited parameters, on the host in f64.
struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    sum: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            self.sum += squared_sum_on_host(&g).unwrap_or_else(|| {
                let s: f32 = g.powf_scalar(2.0).sum().into_scalar().elem();
                f64::from(s)
            });
        }
    }
}

/// Elements per parallel task of the host passes below.
const CHUNK: usize = 1 << 16;

/// `t`'s NdArray primitive (an `Arc` clone, no copy) when the backend is NdArray and the tensor
/// f32; `None` elsewhere.
fn ndarray_f32<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Option<NdArrayTensor> {
    let t = float(cast::<_, Tensor<NdArray, D>>(t.clone())?);
    matches!(t, NdArrayTensor::F32(_)).then_some(t)
}

/// The sum of `t`'s squares in f64, read in place and split over rayon's pool, where the
/// backend is NdArray and the tensor f32; `None` elsewhere. On NdArray the square and the sum
/// were two single-threaded passes of the calling thread over every gradient (3 % of its
/// samples in a 0.6B-width release step). The chunks' sums are added in order: the same bits at
/// any thread count.
pub(crate) fn squared_sum_on_host<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Option<f64> {
    with_values(&ndarray_f32(t)?, |v| {
        let parts: Vec<f64> = v
            .par_chunks(CHUNK)
            .map(|c| c.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>())
            .collect();
        parts.iter().sum()
    })
}

/// `t` times `factor` as Burn's `mul_scalar` computes it (the factor rounded to f32, one f32
/// product per element), read in place and split over rayon's pool, where the backend is
/// NdArray and the tensor f32; `None` elsewhere.
pub(crate) fn scaled_on_host<B: Backend, const D: usize>(
    t: &Tensor<B, D>,
    factor: f64,
) -> Option<Vec<f32>> {
    let f = factor as f32;
    // Collected in place over the pool: zeroing the output first on the calling thread cost as
    // much as the product.
    with_values(&ndarray_f32(t)?, |v| v.par_iter().with_min_len(CHUNK).map(|&v| v * f).collect())
}

/// Global L2 norm of the gradients of `module`'s parameters (NaN or inf if any is).
pub fn global_norm<B: AutodiffBackend, M: Module<B>>(module: &M, grads: &GradientsParams) -> f64 {
    let mut v = SquaredNorm { grads, sum: 0.0 };
    module.visit(&mut v);
    v.sum.sqrt()
}

/// Multiplies every gradient of the visited parameters by a factor.
struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let scaled = match scaled_on_host(&g, self.factor) {
                Some(values) => Tensor::from_data(TensorData::new(values, g.shape()), &g.device()),
                None => g.mul_scalar(self.factor),
            };
            self.grads.register::<B::InnerBackend, D>(param.id, scaled);
        }
    }
}

/// Scales `module`'s gradients by `factor`.
pub fn scale<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &mut GradientsParams,
    factor: f64,
) {
    module.visit(&mut Scale { grads, factor });
}

/// Removes the gradients of `module`'s parameters (the optimizer then leaves them alone).
pub fn drop_grads<B: AutodiffBackend, M: Module<B>>(module: &M, grads: &mut GradientsParams) {
    struct Drop<'a>(&'a mut GradientsParams);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Drop<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = self.0.remove::<B::InnerBackend, D>(param.id);
        }
    }
    module.visit(&mut Drop(grads));
}

/// A tensor's values as f32 on the host; NaNs (read as non-finite downstream) if they cannot be
/// read.
pub fn host_values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    let n = t.shape().num_elements();
    match t.into_data().convert::<f32>().into_vec::<f32>() {
        Ok(v) if v.len() == n => v,
        _ => vec![f32::NAN; n],
    }
}

/// Every float parameter's gradient in module order, as one host array: per parameter a presence
/// flag (1 if `grads` holds its gradient, else 0) and its values (zeros when absent). (Tests
/// compare gradients with it; a data-parallel step sums `flat_grads::FlatGrads`.)
pub fn flatten<B: AutodiffBackend, M: Module<B>>(module: &M, grads: &GradientsParams) -> Vec<f32> {
    struct Flatten<'a> {
        grads: &'a GradientsParams,
        out: Vec<f32>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let n = param.val().shape().num_elements();
            match self.grads.get::<B::InnerBackend, D>(param.id) {
                Some(g) => {
                    self.out.push(1.0);
                    self.out.extend(host_values(g));
                }
                None => {
                    self.out.push(0.0);
                    self.out.extend(std::iter::repeat_n(0.0, n));
                }
            }
        }
    }
    let mut v = Flatten { grads, out: Vec::new() };
    module.visit(&mut v);
    v.out
}
