//! Gradient helpers over a module's parameters: global norm, scaling, dropping a sub-module's
//! gradients (to freeze it), and finiteness.

use burn::module::{ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

/// Sums the squares of every gradient of the visited parameters, on the host in f64.
struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    sum: f64,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let s: f32 = g.powf_scalar(2.0).sum().into_scalar().elem();
            self.sum += f64::from(s);
        }
    }
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
            self.grads.register::<B::InnerBackend, D>(param.id, g.mul_scalar(self.factor));
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
