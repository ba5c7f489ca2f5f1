//! The FastConformer-TDT model: mel front end, encoder, prediction network, joint.

pub mod augment;
#[cfg(any(feature = "cuda", test))]
pub mod column_major;
pub mod config;
pub mod conv;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod cublas_product;
pub mod decoder;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_attention;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_attention_module;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_batch_norm;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_bias;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_context;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_conv_module;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_conv_residual;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_depthwise;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_dropout;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_feed_forward;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_gates;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_heads;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_layer_norm;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_lstm;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_matmul;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_mixed;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_op;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_qkv;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_rel_shift;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_residual_norm;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_self_attention;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_strided;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_sum;
pub mod dropout;
pub mod encoder;
pub mod greedy;
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
pub mod handoff;
pub mod host_batch_norm;
pub mod host_depthwise;
pub mod host_layer_norm;
pub mod host_linear;
pub mod host_lstm;
// `gemm` takes raw pointers and strides; the module checks the shapes and says why at its one
// call.
pub mod host_mel;
#[allow(unsafe_code)]
pub mod host_product;
pub mod host_rel_shift;
pub mod host_reshape;
pub mod host_silu;
pub mod mask;
pub mod matmul_kernel;
pub mod mel;
pub mod precision;
pub mod running_stats;

use burn::prelude::*;

pub use config::ModelConfig;
use decoder::{Joint, Prediction};
use encoder::{encoded_len, Encoder};

/// The trainable model. The front end has no parameters and lives beside it
/// ([`mel::MelFrontend`]).
#[derive(Module, Debug)]
pub struct TdtModel<B: Backend> {
    /// FastConformer encoder.
    pub encoder: Encoder<B>,
    /// Prediction network.
    pub prediction: Prediction<B>,
    /// Joint network.
    pub joint: Joint<B>,
}

/// Held while a model is built (seed, then every initial draw) and while the generator is
/// reseeded: Burn's backend generator is global to the process.
static BACKEND_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Seeds the calling thread's dropout stream ([`dropout::seed_stream`]) and the backend's
/// process-global generator (Burn's draws, where dropout falls back to them), the latter
/// without landing between another thread's seeding and drawing of a model's initial weights.
pub fn seed_backend<B: Backend>(device: &B::Device, seed: u64) {
    dropout::seed_stream(seed);
    let _guard = BACKEND_RNG.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    B::seed(device, seed);
}

/// Runs `draw` right after seeding the backend's generator with `seed`, under the lock that
/// model building takes: what `draw` takes from the generator is a pure function of `seed` even
/// while other threads use the generator (ranks that are threads of one process).
pub fn draw_seeded<B: Backend, T>(device: &B::Device, seed: u64, draw: impl FnOnce() -> T) -> T {
    let _guard = BACKEND_RNG.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    B::seed(device, seed);
    draw()
}

impl<B: Backend> TdtModel<B> {
    /// A freshly initialised model for `vocab` tokens (blank is `vocab`), its weights drawn
    /// from `seed` on the host ([`InitBackend`]) and copied to `device`: one seed is one model on
    /// every backend. Burn's initialisers draw from the backend's generator, which is global to
    /// the process: the draws happen under one lock, right after seeding, so two models built at
    /// once (tests, several devices) cannot take each other's draws.
    pub fn new(cfg: &ModelConfig, vocab: usize, seed: u64, device: &B::Device) -> Self {
        let (values, unset) = {
            let _guard = BACKEND_RNG.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let host = Default::default();
            InitBackend::seed(&host, seed);
            // Burn initialises parameters lazily, on first use: visiting draws them, in the
            // module's order, under the lock.
            let mut drawn = Drawn(Vec::new());
            TdtModel::<InitBackend>::unset(cfg, vocab, &host).visit(&mut drawn);
            // The device's structure is built under the lock too: what a constructor draws
            // eagerly comes from the backend's generator, which on the CPU is the host's, and
            // another thread's model would take those draws from the middle of its own.
            (drawn.0, Self::unset(cfg, vocab, device))
        };
        let mut place = Place { values: values.into_iter(), device: device.clone() };
        let model = unset.map(&mut place);
        // Both are built by `unset` from the same configuration: the same parameters, in the
        // same order, so every drawn value found its place.
        debug_assert_eq!(place.values.len(), 0);
        model
    }

    /// This model with its products in `precision`'s type (ARCHITECTURE.md, "Mixed precision").
    /// Not part of the record: the parameters stay f32 and a checkpoint is the same whatever
    /// the precision it was trained in.
    pub fn with_precision(self, precision: precision::Precision) -> Self {
        TdtModel {
            encoder: self.encoder.with_precision(precision),
            prediction: self.prediction,
            joint: self.joint.with_precision(precision),
        }
    }

    /// The model's structure with its parameters not yet drawn (Burn's lazy initialisation).
    fn unset(cfg: &ModelConfig, vocab: usize, device: &B::Device) -> Self {
        let outputs = vocab + 1 + cfg.durations.len();
        TdtModel {
            encoder: Encoder::new(&cfg.encoder, cfg.preprocessor.features, device),
            prediction: Prediction::new(&cfg.decoder, vocab, device),
            joint: Joint::new(
                &cfg.joint,
                cfg.encoder.d_model,
                cfg.decoder.pred_hidden,
                outputs,
                device,
            ),
        }
    }

    /// Encodes features `[B, T, F]` with `frame_lens` valid frames: `[B, T', d]` and valid
    /// encoder frames.
    pub fn encode(
        &self,
        cfg: &ModelConfig,
        features: Tensor<B, 3>,
        frame_lens: &[usize],
    ) -> (Tensor<B, 3>, Vec<usize>) {
        let enc_lens: Vec<usize> =
            frame_lens.iter().map(|&n| encoded_len(&cfg.encoder, n)).collect();
        let enc = self.encoder.forward(features, frame_lens, &enc_lens);
        let t = enc.dims()[1];
        (enc, enc_lens.into_iter().map(|n| n.min(t)).collect())
    }

    /// Joint logits `[B, T', U + 1, V + 1 + D]` for encodings and targets `[B, U]`.
    pub fn logits(&self, enc: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 4> {
        let pred = self.prediction.forward(targets);
        self.joint.forward(enc, pred)
    }
}

/// The backend initial weights are drawn on, whatever the model trains on. Each backend has its
/// own generator, so the same seed gave another model on CUDA than on the CPU (the GPU kit's
/// first run, bench/RESULTS.md); drawn here and copied, it gives one. NdArray is the CPU training
/// backend, so CPU runs draw what they drew before.
pub type InitBackend = burn::backend::NdArray;

/// Draws every (lazily initialised) float parameter and keeps its values, in the module's order.
struct Drawn(Vec<TensorData>);

impl burn::module::ModuleVisitor<InitBackend> for Drawn {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<InitBackend, D>>) {
        self.0.push(param.val().into_data());
    }
}

/// Gives each float parameter the next drawn values, on `device`, without drawing its own.
struct Place<B: Backend> {
    values: std::vec::IntoIter<TensorData>,
    device: B::Device,
}

impl<B: Backend> burn::module::ModuleMapper<B> for Place<B> {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<B, D>>,
    ) -> burn::module::Param<Tensor<B, D>> {
        match self.values.next() {
            Some(data) => {
                let value = Tensor::from_data(data, &self.device).require_grad();
                burn::module::Param::initialized(param.id, value)
            }
            None => param,
        }
    }
}
