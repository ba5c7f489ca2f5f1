//! Which AdamW a trainer runs, by where its backend keeps tensors: on the CPU backends Burn's
//! adaptor over [`HostAdamW`] (one host pass per parameter, in place), on the device backends
//! [`FlatAdamW`] (all parameters at once: a step costs the host a few operations per parameter
//! instead of about eighteen). Both are Burn's AdamW with the same record, so a checkpoint of
//! either resumes on the other.

use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;

use super::adamw::{AdamWSettings, HostAdamW};
use super::flat_adamw::{AdamWRecord, FlatAdamW, Retired};
use super::grads;
use crate::model::TdtModel;

/// AdamW as the trainer's backend runs it (see the module).
#[derive(Clone)]
pub enum Optim<B: AutodiffBackend> {
    /// Burn's adaptor, one update per parameter (the CPU backends).
    PerParameter(OptimizerAdaptor<HostAdamW, TdtModel<B>, B>),
    /// All parameters at once (the device backends).
    Flat(FlatAdamW<B>),
}

impl<B: AutodiffBackend> Optim<B> {
    /// AdamW with `settings`; `host`: the backend keeps its tensors on the host.
    pub fn new(settings: AdamWSettings, host: bool) -> Self {
        if host {
            Optim::PerParameter(OptimizerAdaptor::from(HostAdamW::new(settings, true)))
        } else {
            Optim::Flat(FlatAdamW::new(settings))
        }
    }

    /// Takes the global norm of `grads`, then, if `decide` (given the norm) gives a learning rate
    /// and a factor, updates `model` by the gradients times the factor (`None`: the model stays
    /// as it is). Returns the model, the norm and the parameters' old values, to release once
    /// the caller's copy of the model, if it kept one, is gone ([`Retired`]).
    pub fn apply(
        &mut self,
        model: TdtModel<B>,
        grads: GradientsParams,
        device: &B::Device,
        decide: impl FnOnce(f64) -> Option<(f64, f64)>,
    ) -> (TdtModel<B>, f64, Retired<B::InnerBackend>) {
        match self {
            Optim::PerParameter(o) => {
                let mut grads = grads;
                let norm = grads::global_norm(&model, &grads);
                let Some((lr, factor)) = decide(norm) else {
                    return (model, norm, Retired::none());
                };
                if factor != 1.0 {
                    grads::scale(&model, &mut grads, factor);
                }
                (o.step(lr, model, grads), norm, Retired::none())
            }
            Optim::Flat(o) => {
                let grads = o.gradients(&model, grads, device);
                let norm = grads.norm();
                let Some((lr, factor)) = decide(norm) else {
                    return (model, norm, Retired::none());
                };
                let (model, retired) = o.step(lr, model, grads, factor);
                (model, norm, retired)
            }
        }
    }

    /// The optimizer's state, per parameter of `model` (Burn's adaptor record either way).
    pub fn to_record(&self, model: &TdtModel<B>) -> AdamWRecord<B> {
        match self {
            Optim::PerParameter(o) => o.to_record(),
            Optim::Flat(o) => o.to_record(model),
        }
    }

    /// Takes `record` as the optimizer's state.
    pub fn load_record(self, record: AdamWRecord<B>) -> Self {
        match self {
            Optim::PerParameter(o) => Optim::PerParameter(o.load_record(record)),
            Optim::Flat(o) => Optim::Flat(o.load_record(record)),
        }
    }
}
