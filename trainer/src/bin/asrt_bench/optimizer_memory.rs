//! `optimizer-memory`: what an AdamW update holds beyond the model and its moments, for
//! `FlatAdamW` (in chunks of a given size, or the device's) against Burn's per-parameter
//! `OptimizerAdaptor<AdamW>`, on one device.
//!
//! The model is a preset with its encoder's layers and width overridden; the gradients are
//! made up (every element 1e-3, one tensor per parameter, as backward leaves them), so the
//! figure is the update's alone. Step 1 creates the moments; the peak is taken over the later
//! steps, from the resident set after step 1: on the CPU backends and on wgpu over Mesa's
//! software Vulkan, device memory is host memory, so the process's peak resident set (VmHWM,
//! reset by `clear_refs`) counts it. On a real GPU the figure is not the device's. On wgpu and
//! CUDA the bench also reads CubeCL's memory pool after each step (`pool_usage`): the bytes
//! in live buffers and the bytes the pool keeps reserved, a device's own figures.

use std::time::Instant;

use anyhow::Context;
use asr_trainer::{
    pool_usage, AdamWSettings, DeviceAllReduce, FlatAdamW, HostAdamW, ModelConfig, OnBackend,
    TdtModel,
};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use serde_json::json;

use super::{median, memory, reset_peak};

/// Which optimizer to measure.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Which {
    /// Burn's `OptimizerAdaptor<AdamW>`, one update per parameter.
    Burn,
    /// `FlatAdamW`, all parameters at once, in chunks.
    Flat,
}

/// The measurement (see the module), as work for `dispatch`.
pub struct OptimizerMemory {
    pub name: String,
    pub model: ModelConfig,
    pub vocab: usize,
    pub which: Which,
    /// Elements per chunk of `FlatAdamW` (`None`: the device's).
    pub chunk: Option<usize>,
    pub steps: usize,
}

/// Every trainable parameter's made-up gradient.
fn gradients<B: AutodiffBackend, M: Module<B>>(model: &M) -> GradientsParams {
    struct Make(GradientsParams);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Make {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let value = p.val();
            if value.is_require_grad() {
                let g = Tensor::<B::InnerBackend, D>::full(value.shape(), 1e-3, &value.device());
                self.0.register::<B::InnerBackend, D>(p.id, g);
            }
        }
    }
    let mut make = Make(GradientsParams::new());
    model.visit(&mut make);
    make.0
}

impl OnBackend for OptimizerMemory {
    type Output = anyhow::Result<serde_json::Value>;

    fn run<B>(self, devices: Vec<B::Device>) -> Self::Output
    where
        B: AutodiffBackend + asr_tdt::op::TdtBackend,
        B::InnerBackend: DeviceAllReduce,
    {
        let device = devices.into_iter().next().context("no device")?;
        let sync = || B::sync(&device).map_err(|e| anyhow::anyhow!("the device failed: {e:?}"));
        let mut model = TdtModel::<B>::new(&self.model, self.vocab, 0, &device);
        let params = model.num_params();
        let param_mib = (params * 4) as f64 / 1048576.0;
        let settings =
            AdamWSettings { beta_1: 0.9, beta_2: 0.98, epsilon: 1e-9, weight_decay: 1e-3 };
        let mut burn = OptimizerAdaptor::<AdamW, TdtModel<B>, B>::from(HostAdamW::burn(settings));
        let mut flat = FlatAdamW::<B>::new(settings);
        if let Some(n) = self.chunk {
            flat = flat.with_chunk(n);
        }
        // Each step's time, and for the flat update the gradients' norm's part of it (the
        // clipping's; Burn's adaptor here takes none, so the two compare without it).
        let (mut times, mut norm_times) = (Vec::new(), Vec::new());
        let (mut after_first, mut peak) = (f64::NAN, f64::NAN);
        // The pool after each step: bytes in use, the largest reserved.
        let (mut pool_in_use, mut pool_reserved) = (None, None::<u64>);
        for step in 1..=self.steps.max(2) {
            let t = Instant::now();
            let grads = gradients(&model);
            model = match self.which {
                Which::Burn => burn.step(1e-4, model, grads),
                Which::Flat => {
                    let g = flat.gradients(&model, grads, &device);
                    // The layout done, so that the norm's time is its own.
                    sync()?;
                    let n = Instant::now();
                    let norm = g.norm();
                    norm_times.push(n.elapsed().as_secs_f64());
                    anyhow::ensure!(norm.is_finite(), "the gradients' norm is {norm}");
                    let (model, retired) = flat.step(1e-4, model, g, 1.0);
                    retired.release();
                    model
                }
            };
            sync()?;
            times
                .push(t.elapsed().as_secs_f64() - norm_times.get(step - 1).copied().unwrap_or(0.0));
            if let Some((in_use, reserved)) = pool_usage(&device) {
                pool_in_use = Some(in_use);
                pool_reserved = Some(pool_reserved.map_or(reserved, |r| r.max(reserved)));
            }
            if step == 1 {
                after_first = memory().0;
                reset_peak()?;
            } else {
                peak = memory().3;
            }
        }
        // The updates left finite parameters (the first one's first element, read).
        struct First(Option<f32>);
        impl<B: AutodiffBackend> ModuleVisitor<B> for First {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
                if self.0.is_none() {
                    let v = p.val().inner();
                    let n = v.shape().num_elements();
                    self.0 = Some(v.reshape([n]).slice(0..1).into_scalar().elem());
                }
            }
        }
        let mut first = First(None);
        model.visit(&mut first);
        let probe = first.0.unwrap_or(f32::NAN);
        anyhow::ensure!(probe.is_finite(), "a parameter is {probe} after the updates");
        Ok(json!({
            "bench": "optimizer-memory", "device": self.name,
            "optimizer": format!("{:?}", self.which).to_lowercase(),
            "chunk_elements": self.chunk, "parameters": params, "parameter_mib": param_mib,
            "steps": self.steps.max(2),
            "rss_after_step_1_mib": after_first, "peak_rss_mib": peak,
            "peak_growth_mib": peak - after_first,
            "peak_growth_in_parameters": (peak - after_first) / param_mib,
            "pool_in_use_mib": pool_in_use.map(|b| b as f64 / 1048576.0),
            "pool_reserved_mib": pool_reserved.map(|b| b as f64 / 1048576.0),
            "step_seconds_median": median(times[1..].to_vec()),
            "norm_seconds_median": (norm_times.len() > 1).then(|| median(norm_times[1..].to_vec())),
        }))
    }
}
