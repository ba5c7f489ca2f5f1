//! Frees what a forward pass left in Burn's autodiff graph when no backward pass follows it.
//!
//! Burn 0.21's autodiff keeps every tracked operation's backward step, with the tensors it saved
//! for the backward, until a backward pass runs over that graph. That backward's clean-up then
//! drops every node no live tensor refers to. Dropping the outputs of a forward frees nothing.
//!
//! So a forward with no backward after it keeps its graph:
//! - in training, a micro-batch whose loss is not finite is not run backward. Its activations
//!   would stay while the next micro-batch's forward allocates its own;
//! - a benchmark's forward-only steps would keep every step's graph, about 230 MB a step at
//!   the 0.6B width with 2 layers (bench/RESULTS.md).
//!
//! [`release`] runs the cheapest backward that reaches every graph the module's parameters are
//! in: from the sum of one element of each trainable parameter. Its gradients are dropped.
//! Parameters are live tensors, so their nodes stay; everything else no tensor refers to goes.
//! The caller drops the forward's tensors first: a live tensor keeps itself and its ancestors.
//!
//! Cost: each parameter's gradient is a tensor of its shape (zeros, one element set), as in
//! any backward, so the peak is no higher than a training step's backward. On the CPU the
//! forward-only steps got faster with it (bench/RESULTS.md, "A forward's graph freed").

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;

/// Frees the autodiff graph that `module`'s parameters are in, apart from the nodes live
/// tensors refer to. A module with no trainable parameter has nothing tracked to free.
pub fn release<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) {
    let mut anchors = Anchors::<B> { sum: None };
    module.visit(&mut anchors);
    if let Some(sum) = anchors.sum {
        drop(sum.sum().backward());
    }
}

/// The sum of one element of each trainable parameter: one root joining the graphs of all.
struct Anchors<B: AutodiffBackend> {
    sum: Option<Tensor<B, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Anchors<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        // A frozen parameter has no node to start a backward from, and an empty one no element.
        if !value.is_require_grad() || value.shape().num_elements() == 0 {
            return;
        }
        let first: [core::ops::Range<usize>; D] = core::array::from_fn(|_| 0..1);
        let one = value.slice(first).reshape([1]);
        self.sum = Some(match self.sum.take() {
            Some(sum) => sum + one,
            None => one,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::{Autodiff, NdArray};
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::GradientsParams;
    use burn::tensor::TensorPrimitive;
    use std::sync::Arc;

    type B = Autodiff<NdArray>;

    /// The identity, whose backward state is a token: the token's count says whether the
    /// graph still holds the step.
    #[derive(Debug)]
    struct Hold;

    impl Backward<NdArray, 1> for Hold {
        type State = Arc<()>;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let upstream = grads.consume::<NdArray>(&ops.node);
            if let [Some(parent)] = &ops.parents {
                grads.register::<NdArray>(parent.id, upstream);
            }
        }
    }

    fn hold(x: Tensor<B, 2>, token: &Arc<()>) -> Tensor<B, 2> {
        let x = x.into_primitive().tensor();
        let out = match Hold.prepare::<NoCheckpointing>([x.node.clone()]).compute_bound().stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(token.clone(), x.primitive),
            OpsKind::UnTracked(prep) => prep.finish(x.primitive),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }

    #[derive(Module, Debug)]
    struct Two<B: burn::tensor::backend::Backend> {
        a: Linear<B>,
        b: Linear<B>,
    }

    /// A forward through `layer` whose outputs are dropped without a backward.
    fn forward_only(layer: &Linear<B>, token: &Arc<()>) {
        let x = Tensor::<B, 2>::ones([2, 4], &Default::default());
        let loss = hold(layer.forward(x), token).sum();
        let _value: f32 = loss.into_scalar();
    }

    #[test]
    fn frees_the_steps_of_every_graph_the_parameters_are_in() {
        let device = Default::default();
        let model = Two::<B> {
            a: LinearConfig::new(4, 3).init(&device),
            b: LinearConfig::new(4, 3).init(&device),
        };
        // Two forwards that share no operation: two graphs.
        let (ta, tb) = (Arc::new(()), Arc::new(()));
        forward_only(&model.a, &ta);
        forward_only(&model.b, &tb);
        // Burn keeps both steps (and their states) after the outputs are dropped; if this
        // fails, Burn frees graphs by itself and the module can go.
        assert_eq!((Arc::strong_count(&ta), Arc::strong_count(&tb)), (2, 2));
        release(&model);
        assert_eq!((Arc::strong_count(&ta), Arc::strong_count(&tb)), (1, 1));
    }

    #[test]
    fn keeps_what_live_tensors_need_and_training_goes_on() {
        let device = Default::default();
        let layer: Linear<B> = LinearConfig::new(4, 3).init(&device);
        let token = Arc::new(());
        let x = Tensor::<B, 2>::ones([2, 4], &device);
        let live = hold(layer.forward(x.clone()), &token);
        release(&layer);
        // `live`'s step is still reachable from a live tensor: kept, and its backward works.
        assert_eq!(Arc::strong_count(&token), 2);
        let grads = GradientsParams::from_grads(live.sum().backward(), &layer);
        let expected = GradientsParams::from_grads(layer.forward(x).sum().backward(), &layer);
        let got = grads.get::<NdArray, 2>(layer.weight.id).expect("the weight's gradient");
        let want = expected.get::<NdArray, 2>(layer.weight.id).expect("the weight's gradient");
        assert_eq!(got.into_data(), want.into_data());
        assert_eq!(Arc::strong_count(&token), 1);
    }
}
