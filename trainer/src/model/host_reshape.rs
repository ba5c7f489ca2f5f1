//! Reshapes that share the storage on the CPU backend.
//!
//! Burn 0.21's NdArray copies every reshape, even of a contiguous array: its `reshape` takes
//! `to_shape`'s borrowed view and turns it into an owned array (`into_shared` on a `CowArray`
//! view is `to_owned`). Each linear layer reshapes its input to rank 2 and its output back; in
//! a profile of the 0.6B-width encoder's forward these copies were 36 % of the calling
//! thread's samples, most of it the kernel zeroing the copies' fresh pages (bench/RESULTS.md,
//! "Reshapes without copies"), and their backward copies the gradients once more. Here a
//! row-major array takes the new shape over the same storage, forward and backward; any other
//! layout is copied as NdArray does.
//!
//! Which backend: NdArray bare or under autodiff, f32 tensors (as `host_depthwise`, whose
//! helpers this shares); Burn's `reshape` elsewhere and for other element types.
//!
//! Invariant: the values and gradients are exactly Burn's `reshape`'s (tested); a shape with
//! another element count panics as Burn's does.

use super::host_depthwise::{cast, float};
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::{Autodiff, NdArray};
use burn::prelude::*;
use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{Shape, TensorMetadata, TensorPrimitive};

/// `reshaped`, as a method, so that it reads in a chain like Burn's `reshape`.
pub trait Reshaped<B: Backend> {
    /// Burn's `reshape` to `shape`, over the same storage where the backend is NdArray and the
    /// tensor a row-major f32 one.
    fn reshaped<const D2: usize>(self, shape: [usize; D2]) -> Tensor<B, D2>;
}

impl<B: Backend, const D: usize> Reshaped<B> for Tensor<B, D> {
    fn reshaped<const D2: usize>(self, shape: [usize; D2]) -> Tensor<B, D2> {
        if self.shape().num_elements() != shape.iter().product::<usize>() {
            // Burn's own error for a shape of another size.
            return self.reshape(shape);
        }
        let id = std::any::TypeId::of::<B>();
        if id == std::any::TypeId::of::<Autodiff<NdArray>>() {
            if let Some(x) = cast::<_, Tensor<Autodiff<NdArray>, D>>(self.clone()) {
                if let Some(y) = cast(tracked::<D, D2>(x, shape)) {
                    return y;
                }
            }
        } else if id == std::any::TypeId::of::<NdArray>() {
            if let Some(x) = cast::<_, Tensor<NdArray, D>>(self.clone()) {
                let y = Tensor::<NdArray, D2>::from_primitive(TensorPrimitive::Float(primitive(
                    float(x),
                    &shape,
                )));
                if let Some(y) = cast(y) {
                    return y;
                }
            }
        }
        self.reshape(shape)
    }
}

/// `t` in `shape`: a new view of the same storage when `t` is a row-major f32 array, NdArray's
/// own (copying) reshape otherwise. The element counts agree (checked by the caller).
fn primitive(t: NdArrayTensor, shape: &[usize]) -> NdArrayTensor {
    match t {
        NdArrayTensor::F32(storage) if storage.view().is_standard_layout() => {
            let array = storage.into_shared();
            // A row-major array of the same size always takes the shape; the clone is of the
            // reference, kept for the copying path should it not.
            match array.clone().into_shape_with_order(shape) {
                Ok(view) => NdArrayTensor::from(view),
                Err(_) => <NdArray as FloatTensorOps<NdArray>>::float_reshape(
                    NdArrayTensor::from(array),
                    Shape::from(shape.to_vec()),
                ),
            }
        }
        other => {
            <NdArray as FloatTensorOps<NdArray>>::float_reshape(other, Shape::from(shape.to_vec()))
        }
    }
}

/// The reshape on `Autodiff<NdArray>`: the backward step reshapes the gradient back.
fn tracked<const D: usize, const D2: usize>(
    x: Tensor<Autodiff<NdArray>, D>,
    shape: [usize; D2],
) -> Tensor<Autodiff<NdArray>, D2> {
    let from = x.dims().to_vec();
    let x = float(x);
    let out = primitive(x.primitive, &shape);
    let out = match ReshapeBackward
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(from, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

#[derive(Debug)]
struct ReshapeBackward;

impl Backward<NdArray, 1> for ReshapeBackward {
    /// The input's shape.
    type State = Vec<usize>;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let upstream = grads.consume::<NdArray>(&ops.node);
        if let [Some(p)] = &ops.parents {
            debug_assert_eq!(upstream.shape().num_elements(), ops.state.iter().product::<usize>());
            grads.register::<NdArray>(p.id, primitive(upstream, &ops.state));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Train = Autodiff<NdArray>;

    #[test]
    fn matches_burn_s_reshape_and_shares_the_storage() {
        let device = Default::default();
        let values: Vec<f32> = (0..2 * 3 * 20).map(|i| (i as f32 * 0.37).sin()).collect();
        let mix: Vec<f32> = (0..2 * 3 * 20).map(|i| 1.0 + (i % 7) as f32).collect();
        let weights = Tensor::<Train, 2>::from_data(TensorData::new(mix, [6, 20]), &device);
        // Row-major (shared) and a transposed view (copied), each through a product so that the
        // gradient that comes back is not all ones. One leaf per side: a backward pass consumes
        // the graph it reaches.
        for transpose in [false, true] {
            let leaf = || {
                Tensor::<Train, 3>::from_data(TensorData::new(values.clone(), [2, 3, 20]), &device)
                    .require_grad()
            };
            let (xo, xb) = (leaf(), leaf());
            let input = |x: &Tensor<Train, 3>| {
                if transpose {
                    x.clone().swap_dims(1, 2)
                } else {
                    x.clone()
                }
            };
            let ours = input(&xo).reshaped([6, 20]);
            let burn = input(&xb).reshape([6, 20]);
            assert_eq!(
                ours.clone().into_data().to_vec::<f32>().unwrap(),
                burn.clone().into_data().to_vec::<f32>().unwrap(),
                "values, transpose {transpose}"
            );
            let go = (ours * weights.clone()).sum().backward();
            let gb = (burn * weights.clone()).sum().backward();
            assert_eq!(
                xo.grad(&go).unwrap().into_data().to_vec::<f32>().unwrap(),
                xb.grad(&gb).unwrap().into_data().to_vec::<f32>().unwrap(),
                "gradients, transpose {transpose}"
            );
        }
        // The row-major case is a view: the new tensor's values live where the old ones do.
        let bare = Tensor::<NdArray, 3>::from_data(TensorData::new(values, [2, 3, 20]), &device);
        let address = |t: &NdArrayTensor| match t {
            NdArrayTensor::F32(s) => s.view().as_ptr() as usize,
            _ => panic!("f32"),
        };
        let before = address(&float(bare.clone()));
        let after = address(&float(bare.clone().reshaped([120])));
        assert_eq!(before, after, "a row-major reshape shares the storage");
        let copied = address(&float(bare.reshape([120])));
        assert_ne!(before, copied, "NdArray's own reshape copies (if not, this module can go)");
    }

    #[test]
    #[should_panic]
    fn a_shape_of_another_size_panics_as_burn_s_does() {
        let x = Tensor::<NdArray, 1>::zeros([6], &Default::default());
        let _ = x.reshaped([4]);
    }
}
