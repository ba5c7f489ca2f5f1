//! Puts every trainable parameter in one autodiff graph before a forward pass, so that the
//! forward's operations do not merge graphs.
//!
//! Burn 0.21's autodiff gives each tensor marked `require_grad` (each parameter) a graph of its
//! own, and an operation whose parents lie in several graphs merges them
//! (`GraphLocator::merge`). The merge keeps whichever graph a hash map's drain yields first
//! and moves every node of the others into it: when that is a parameter's one-node graph, the
//! whole forward graph so far is moved. A forward meets each parameter once, so about half of
//! its few hundred parameter uses moved a graph of thousands of nodes. perf put 59 % of the
//! training thread's own work (not its waiting) in `GraphLocator::select` on the 0.6B preset's
//! structure (bench/RESULTS.md, 2026-11-30), where that thread's rate of operations may bound a
//! GPU step.
//!
//! [`join`] runs, before the forward, one no-op node whose parents are all the parameters
//! ([`PARENTS`] of them at most; a model with more gets a tree of such nodes). Its merge moves
//! graphs of one node each into one of them, and once the forward's first operation meets a
//! parameter every later one finds its parents in that graph. A join node's value is its first
//! parent's (the same buffer, no launch), nothing reads it, and it is dropped at once: no
//! backward reaches it, and the backward's clean-up frees it with the other nodes no live
//! tensor refers to (`graph_release`'s module doc). `ASRT_GRAPH_JOIN=0` turns it off (for A/B
//! runs; read once per process).
//!
//! Why one node and not a tree of small ones (as before): a merge points a merged graph's
//! origin at the graph it joined, but not the nodes the merged graph had absorbed in an
//! earlier merge. After a tree's second level, each parameter outside the root's own graph
//! still pointed at its first-level graph, emptied by the second merge, so its first use in
//! the forward met two graphs again and, in about half the cases, moved the whole forward graph
//! into the emptied one. perf on the 0.6B preset's structure still put 37 % of the training
//! thread's own work in those merges with the tree (bench/RESULTS.md, 2026-11-30, night).
//!
//! Invariants: the gradients are the same bits with and without it (tested); a module without
//! a trainable parameter is left alone.

use std::any::Any;
use std::marker::PhantomData;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::Tensor;

/// Parents of one join node: more than the 0.6B preset's forward's parameters (985), so that its
/// parameters are joined in one merge (the module's doc says why a tree is worse). Unused
/// parents repeat the first, which adds no graph; the arrays cost 16 KiB for a node that lives
/// until the forward's first operation.
pub const PARENTS: usize = 2048;

/// Joins the graphs of `module`'s trainable parameters into one (see the module), unless
/// `ASRT_GRAPH_JOIN=0`. On an autodiff backend other than the trainer's it does nothing.
pub fn join<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) {
    join_visited::<B>(|params| module.visit(params));
}

/// [`join`] over the trainable parameters that `visit` shows to [`Params`]: those of the part
/// of a model whose forward one backward will cover.
///
/// Why not always the whole model: a parameter used only after a detach, in a graph that a
/// backward of its own consumes (the joint's output layer, run in parts of a micro-batch by
/// `fused::joint_in_parts`), must not be joined to the forward before the detach. Joined, a
/// part's backward took part of that forward's graph with it, and the later backward through
/// the forward found no steps left: the prediction network got no gradient at all, in about one
/// run in ten (tests/it/fused_joint.rs, 4 failures in 40; which graph a merge keeps follows a
/// hash map's order).
pub fn join_visited<B: AutodiffBackend>(visit: impl FnOnce(&mut Params<B>)) {
    if !enabled() {
        return;
    }
    let mut params = Params::<B> { tensors: Vec::new() };
    visit(&mut params);
    if params.tensors.len() < 2 {
        return;
    }
    let tensors = params.tensors;
    macro_rules! try_backend {
        ($inner:ty) => {
            if std::any::TypeId::of::<B>() == std::any::TypeId::of::<Autodiff<$inner>>() {
                let tensors: Vec<FloatTensor<Autodiff<$inner>>> =
                    tensors.into_iter().filter_map(|t| downcast(t)).collect();
                join_on::<$inner, (), PARENTS>(tensors, ());
                return;
            }
        };
    }
    try_backend!(burn::backend::NdArray);
    try_backend!(burn::backend::Flex);
    #[cfg(feature = "wgpu")]
    {
        try_backend!(burn::backend::Wgpu);
        try_backend!(burn_fusion::Fusion<burn::backend::Wgpu>);
    }
    #[cfg(feature = "cuda")]
    {
        try_backend!(burn::backend::Cuda);
        try_backend!(burn_fusion::Fusion<burn::backend::Cuda>);
    }
}

/// Whether [`join`] runs: unless `ASRT_GRAPH_JOIN` is `0`, read once per process.
pub fn enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("ASRT_GRAPH_JOIN").as_deref() != Ok("0"))
}

fn downcast<P: 'static, T: 'static>(p: P) -> Option<T> {
    (Box::new(p) as Box<dyn Any>).downcast::<T>().ok().map(|b| *b)
}

/// The join nodes over `tensors`, `N` parents each: one node for at most `N` tensors, else a
/// tree, level by level, each node's output dropped once the level above holds it as a parent.
/// Each node keeps a clone of `state` (`()`; the tests count a token's clones to see the nodes
/// freed).
fn join_on<X: Backend, S: JoinState, const N: usize>(
    mut tensors: Vec<FloatTensor<Autodiff<X>>>,
    state: S,
) {
    while tensors.len() > 1 {
        tensors =
            tensors.chunks(N).map(|chunk| join_node::<X, S, N>(chunk, state.clone())).collect();
    }
}

/// What a join node keeps.
trait JoinState: Clone + Send + std::fmt::Debug + 'static {}
impl<S: Clone + Send + std::fmt::Debug + 'static> JoinState for S {}

/// One join node over `chunk` (at most `N` tensors; a shorter chunk repeats its first as the
/// missing parents, which adds no graph).
fn join_node<X: Backend, S: JoinState, const N: usize>(
    chunk: &[FloatTensor<Autodiff<X>>],
    state: S,
) -> FloatTensor<Autodiff<X>> {
    let parents: [_; N] = std::array::from_fn(|i| chunk.get(i).unwrap_or(&chunk[0]).node.clone());
    let value: FloatTensor<X> = chunk[0].primitive.clone();
    match Join::<S>(PhantomData).prepare::<NoCheckpointing>(parents).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, value),
        OpsKind::UnTracked(prep) => prep.finish(value),
    }
}

/// A join node: its value is its first parent's, so a backward that reached it (none does)
/// would pass its gradient to that parent alone.
#[derive(Debug)]
struct Join<S>(PhantomData<S>);

impl<X: Backend, S: JoinState, const N: usize> Backward<X, N> for Join<S> {
    type State = S;

    fn backward(self, ops: Ops<S, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<X>(&ops.node);
        if let Some(first) = &ops.parents[0] {
            grads.register::<X>(first.id, dy);
        }
    }
}

/// The primitives of the trainable parameters a module visit shows, in its order
/// ([`join_visited`]).
pub struct Params<B: AutodiffBackend> {
    tensors: Vec<FloatTensor<B>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Params<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if value.is_require_grad() {
            self.tensors.push(value.into_primitive().tensor());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::GradientsParams;

    type B = Autodiff<NdArray>;

    #[derive(Module, Debug)]
    struct Net<B: Backend> {
        layers: Vec<Linear<B>>,
    }

    fn net() -> Net<B> {
        let device = Default::default();
        // 11 layers, 22 parameters: three levels of join nodes, the last chunk short.
        let layers = (0..11).map(|_| LinearConfig::new(5, 5).init(&device)).collect();
        Net { layers }
    }

    fn gradients(model: &Net<B>, joined: bool) -> Vec<Vec<u32>> {
        if joined {
            join(model);
        }
        let mut x = Tensor::<B, 2>::from_floats([[0.5, -1.0, 2.0, 0.25, 1.5]], &Default::default());
        for layer in &model.layers {
            x = layer.forward(x).tanh();
        }
        let grads = GradientsParams::from_grads(x.sum().backward(), model);
        model
            .layers
            .iter()
            .flat_map(|l| {
                let w = grads.get::<NdArray, 2>(l.weight.id).expect("a weight's gradient");
                let b = grads
                    .get::<NdArray, 1>(l.bias.as_ref().expect("a bias").id)
                    .expect("a bias's gradient");
                [w.into_data().to_vec::<f32>().unwrap(), b.into_data().to_vec::<f32>().unwrap()]
            })
            .map(|v| v.into_iter().map(f32::to_bits).collect())
            .collect()
    }

    /// Clones of a token the join nodes keep over [`net`]'s 22 parameters, `N` to a node:
    /// after the join, and after a forward's backward (its clean-up frees them).
    fn tokens_held<const N: usize>() -> (usize, usize) {
        let model = net();
        let token = std::sync::Arc::new(());
        let mut params = Params::<B> { tensors: Vec::new() };
        model.visit(&mut params);
        join_on::<NdArray, _, N>(params.tensors, token.clone());
        let joined = std::sync::Arc::strong_count(&token) - 1;
        let mut x = Tensor::<B, 2>::ones([1, 5], &Default::default());
        for layer in &model.layers {
            x = layer.forward(x);
        }
        drop(x.sum().backward());
        (joined, std::sync::Arc::strong_count(&token) - 1)
    }

    #[test]
    fn the_backward_frees_the_join_nodes() {
        // 22 parameters, 8 to a node: 3 + 1 join nodes, each keeping a clone until the
        // backward's clean-up.
        assert_eq!(tokens_held::<8>(), (4, 0));
    }

    #[test]
    fn joins_a_model_s_parameters_in_one_node() {
        assert_eq!(tokens_held::<PARENTS>(), (1, 0));
    }

    #[test]
    fn gives_the_same_gradients_bit_for_bit() {
        let model = net();
        let plain = gradients(&model, false);
        let joined = gradients(&model, true);
        assert_eq!(plain.len(), 22);
        assert_eq!(plain, joined);
        // Again on the same parameters, whose graphs the first backward left (as the next
        // micro-batch of a step finds them), and twice before one backward.
        assert_eq!(gradients(&model, true), plain);
        join(&model);
        assert_eq!(gradients(&model, true), plain);
    }
}
