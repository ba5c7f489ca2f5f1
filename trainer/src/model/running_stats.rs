//! A batch normalisation's running statistics, set by its training forward.
//!
//! Burn 0.21's `RunningState::update` keeps the new value in a map per thread, and only the
//! next `value_sync` (or a record) divides the map's sum by its count into the value. Two faults
//! follow for the trainer:
//! - the module's visitor (`Module::visit`) reads the value without that fold, so the ranks'
//!   averaging of the running statistics after a step (`train::parallel::sync_buffers`) averaged
//!   the values from before each rank's last micro-batch, and the next forward's fold then put
//!   the rank's own last value back over the average;
//! - each fold is a division and a dropped tensor per statistic, two operations in fusion's
//!   stream each (48 divisions and 48 drops a step of the 0.6B preset's 24 layers,
//!   bench/RESULTS.md, 2026-12-01, "The old parameters released").
//!
//! Here the training forward replaces the value at once ([`replace`]), and Burn's own forward
//! (the fallback) is folded at once after it ([`settle`]).
//!
//! Invariant: after any training forward of the model's batch normalisations, their per-thread
//! maps are empty, so the visitor, the records and the next forward read the same value.

use burn::module::{Module, ModuleMapper, Param, RunningState};
use burn::nn::BatchNorm;
use burn::prelude::*;
use burn::tensor::TensorPrimitive;

/// Swaps the one float value a `RunningState` maps for `new`, keeping the old one.
struct Swap<B: Backend> {
    new: Option<TensorPrimitive<B>>,
    old: Option<TensorPrimitive<B>>,
}

impl<B: Backend> ModuleMapper<B> for Swap<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, old, mapper) = param.consume();
        match self.new.take() {
            Some(new) => {
                self.old = Some(old.into_primitive());
                Param::from_mapped_value(id, Tensor::from_primitive(new), mapper)
            }
            None => Param::from_mapped_value(id, old, mapper),
        }
    }
}

/// Replaces `state`'s value with `value` (shared by every clone of the module) and returns the
/// value it held. Under fusion the returned handle is the old value's last one once the forward
/// that read it has been queued: where it ends decides whether fusion records a drop for it.
pub fn replace<B: Backend>(
    state: &RunningState<Tensor<B, 1>>,
    value: Tensor<B, 1>,
) -> Tensor<B, 1> {
    let mut swap = Swap { new: Some(value.into_primitive()), old: None };
    // `map` sets the value behind the state's shared lock; the returned clone is not needed.
    let _ = state.clone().map(&mut swap);
    match swap.old {
        Some(old) => Tensor::from_primitive(old),
        // `RunningState::map` maps its one value, so this is not reached; the value is still the
        // new one's clone then, never lost.
        None => state.value(),
    }
}

/// Folds what Burn's own training forward left in `norm`'s per-thread maps into its values
/// (nothing where the map is empty: evaluation, or a forward that set the values itself).
pub fn settle<B: Backend>(norm: &BatchNorm<B>) {
    let _ = norm.running_mean.value_sync();
    let _ = norm.running_var.value_sync();
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::ModuleVisitor;
    use burn::nn::BatchNormConfig;

    type A = burn::backend::Autodiff<burn::backend::NdArray>;

    /// The running mean and variance as the module's visitor reads them (what the ranks
    /// average), without any fold.
    fn visited(norm: &BatchNorm<A>) -> Vec<f32> {
        struct Collect(Vec<f32>);
        impl ModuleVisitor<A> for Collect {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<A, D>>) {
                if !p.val().is_require_grad() {
                    self.0.extend(p.val().into_data().to_vec::<f32>().unwrap());
                }
            }
        }
        let mut c = Collect(Vec::new());
        norm.visit(&mut c);
        c.0
    }

    fn forward(norm: &BatchNorm<A>, x: &[f32]) {
        let device = Default::default();
        let x =
            Tensor::<A, 3>::from_data(TensorData::new(x.to_vec(), [1, x.len() / 2, 2]), &device);
        let y = crate::model::host_batch_norm::train_on_host(norm, &x.require_grad())
            .expect("NdArray under autodiff takes the host form");
        let _ = y.sum().backward();
    }

    #[test]
    fn the_visitor_reads_the_last_forward_s_statistics() {
        let device = Default::default();
        let norm = BatchNormConfig::new(2).with_momentum(0.5).init::<A>(&device);
        forward(&norm, &[1.0, 10.0, 3.0, 14.0]);
        // Batch means 2 and 12, biased variances 1 and 4; blended by half with 0 and 1.
        assert_eq!(visited(&norm), vec![1.0, 6.0, 1.0, 2.5]);
        forward(&norm, &[5.0, 6.0, 5.0, 6.0]);
        assert_eq!(visited(&norm), vec![3.0, 6.0, 0.5, 1.25]);
        // Nothing is left to fold: the synced read is the same.
        let synced = [norm.running_mean.value_sync(), norm.running_var.value_sync()]
            .map(|t| t.into_data().to_vec::<f32>().unwrap())
            .concat();
        assert_eq!(synced, vec![3.0, 6.0, 0.5, 1.25]);
    }

    #[test]
    fn replace_returns_the_old_value_and_every_clone_sees_the_new() {
        let device = Default::default();
        let norm = BatchNormConfig::new(3).init::<A>(&device);
        let clone = norm.clone();
        let old = replace(&norm.running_mean, Tensor::from_floats([1.0, 2.0, 3.0], &device));
        assert_eq!(old.into_data().to_vec::<f32>().unwrap(), vec![0.0; 3]);
        assert_eq!(
            clone.running_mean.value().into_data().to_vec::<f32>().unwrap(),
            vec![1.0, 2.0, 3.0]
        );
    }

    #[test]
    fn settle_folds_burn_s_own_update() {
        let device = Default::default();
        let norm = BatchNormConfig::new(2).with_momentum(0.5).init::<A>(&device);
        let x = Tensor::<A, 3>::from_floats([[[1.0, 3.0], [10.0, 14.0]]], &device);
        let _ = norm.forward(x);
        settle(&norm);
        assert_eq!(visited(&norm), vec![1.0, 6.0, 1.0, 2.5]);
    }
}
