//! Benchmarks of the data feed (results and commands in bench/RESULTS.md):
//!
//! - `plan`: build an epoch plan for N synthetic utterances; median time and peak memory.
//! - `startup CORPUS`: open a corpus and plan it; time and resident memory (anonymous vs mapped).
//! - `batches CORPUS`: assemble every padded batch of an epoch on one thread from a page-cached
//!   corpus; audio-seconds per second.
//!
//! - `train-step CORPUS`: optimizer steps of the `tiny` model on the CPU backend; median step
//!   time and audio-seconds per second.
//! - `tdt-memory`: peak memory of one TDT loss forward + backward, CPU path or CubeCL kernels
//!   (wgpu).
//! - `model-shape`: parameter count of a preset and the time of one forward pass (front end,
//!   encoder, prediction network, joint) on the CPU backend.
//! - `matmul`: each matmul kernel of `--matmul` at the 0.6B preset's linear products on a
//!   device (wgpu, cuda:N): time, TFLOP/s, error against float64.
//! - `optimizer-memory`: what an AdamW update holds beyond the model and its moments, chunked
//!   `FlatAdamW` against Burn's per-parameter adaptor, on a device (wgpu, cpu).
//! - `tdt-check`: the loss on a device (cpu: burn-flex, wgpu, cuda:N) against the float64 CPU
//!   path per logits type, timed against a log-softmax (the GPU kit's first step).
//!
//! Each prints one JSON object. Run one measurement per process so peak-memory figures are not
//! mixed up.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use asr_corpus::Corpus;
use asr_trainer::lognormal_zipf;
use asr_trainer::Devices;
use asr_trainer::ShapePolicy;
use asr_trainer::{assemble, AudioFormat};
use asr_trainer::{Durations, EpochPlan, SamplerConfig, SamplerMode, IDLE};
use clap::{Parser, Subcommand};
use serde_json::json;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod matmul;
mod optimizer_memory;
mod tdt_check;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Plan N synthetic utterances (log-normal durations, median 5 s, log-sd 0.6, clipped to
    /// [0.5, 20] s; 12 languages with Zipf(1.1) shares).
    Plan {
        #[arg(long, default_value_t = 20_000_000)]
        utterances: usize,
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        #[arg(long, default_value_t = 8)]
        world_size: u32,
        /// Also write the inputs as DIR/durations.f64 and DIR/languages.u16 for the Python peer.
        #[arg(long)]
        write_inputs: Option<PathBuf>,
        /// Sampler mode.
        #[arg(long, value_enum, default_value_t = SamplerMode::Temperature)]
        mode: SamplerMode,
        /// Split the utterances into this many contiguous corpora of a training set, weights
        /// alternating 1 and 2 (temperature mode).
        #[arg(long, default_value_t = 1)]
        corpora: u32,
        /// Give each utterance one of 8 sources (Zipf-like shares) and balance them with this
        /// source temperature.
        #[arg(long)]
        source_temperature: Option<f64>,
    },
    /// Open a corpus and plan it.
    Startup { corpus: PathBuf },
    /// TDT loss forward + backward against one log-softmax pass over the same logits, on the
    /// CPU backend (NdArray).
    Tdt {
        #[arg(long, default_value_t = 8)]
        batch: usize,
        #[arg(long, default_value_t = 200)]
        frames: usize,
        #[arg(long, default_value_t = 60)]
        targets: usize,
        /// Token classes including blank.
        #[arg(long, default_value_t = 1025)]
        vocab: usize,
        #[arg(long, default_value_t = 3)]
        repeats: usize,
    },
    /// Peak memory of one TDT loss forward + backward (autodiff) over logits of the given
    /// shape (default: one 90 s utterance of Parakeet-TDT-0.6B: 1125 encoder frames, 300
    /// tokens, 1024 tokens + blank, 5 durations), beyond the logits themselves: the growth of
    /// this process's peak resident memory, which on the CPU backend and on wgpu over Mesa's
    /// software Vulkan (device memory is host memory there) counts the same bytes.
    TdtMemory {
        /// `cpu`: the float64 host path (full-size f32 gradient); `wgpu`: the CubeCL kernels
        /// (lavapipe binds at most 128 MiB per buffer: about 25 s of the 0.6B shape).
        #[arg(long, default_value = "cpu")]
        backend: String,
        #[arg(long, default_value_t = 1)]
        batch: usize,
        #[arg(long, default_value_t = 1125)]
        frames: usize,
        #[arg(long, default_value_t = 300)]
        targets: usize,
        /// Token classes including blank.
        #[arg(long, default_value_t = 1025)]
        vocab: usize,
    },
    /// Peak memory and time of Parakeet-TDT-0.6B's joint + TDT loss, forward and backward, on
    /// the CPU backend, for a micro-batch of `--batch` utterances of `--seconds` each (80 ms
    /// encoder frames, `--tokens-per-second` targets): from encoder output `[B, T, 1024]` and
    /// prediction output `[B, U + 1, 640]` to the gradients of the joint's parameters and of
    /// both inputs. `--unfused` materialises the log-softmax over the tokens and over the
    /// durations before the loss, as a loss that reads log-probabilities needs (the memory-heavy
    /// path); otherwise the loss reads the logits and writes its gradient over them.
    /// `--part K` runs the joint on K utterances at a time (`train.fused_batch_size`).
    JointMemory {
        #[arg(long, default_value_t = 1)]
        batch: usize,
        #[arg(long, default_value_t = 90.0)]
        seconds: f64,
        #[arg(long, default_value_t = 3.3)]
        tokens_per_second: f64,
        /// Utterances per joint call (0: the whole micro-batch).
        #[arg(long, default_value_t = 0)]
        part: usize,
        #[arg(long)]
        unfused: bool,
    },
    /// Optimizer steps of the tiny model on a corpus (a CPU backend).
    TrainStep {
        corpus: PathBuf,
        #[arg(long, default_value_t = 10)]
        steps: u64,
        #[arg(long, default_value_t = 20.0)]
        max_batch_seconds: f64,
        /// The CPU backend: ndarray or flex.
        #[arg(long, default_value = "ndarray")]
        backend: String,
        /// The model preset (its vocabulary is the corpus's).
        #[arg(long, default_value = "tiny")]
        preset: String,
        /// Encoder layers instead of the preset's (the 0.6B shape at full width with fewer
        /// layers fits a CPU's time).
        #[arg(long)]
        layers: Option<usize>,
        /// Dropout instead of the preset's (bench/peer_step.py's 0.6B shape uses 0.1).
        #[arg(long)]
        dropout: Option<f64>,
        /// f32, bf16-mixed or f16-mixed (not on ndarray).
        #[arg(long, default_value = "f32")]
        precision: asr_trainer::Precision,
        /// Time the forward pass and loss of each batch only (no backward, no update).
        #[arg(long)]
        forward_only: bool,
        /// `model`: the whole step; `encoder`: the mel front end and the encoder with a
        /// surrogate loss (the mean square of its output), forward and backward, no update
        /// (bench/peer_step.py's `--part encoder` is the same on PyTorch).
        #[arg(long, default_value = "model")]
        part: String,
        /// `train.fused_batch_size`: utterances per joint call (0: the whole micro-batch).
        #[arg(long, default_value_t = 0)]
        fused_batch_size: usize,
        /// `train.joint`: auto (on the host on this CPU backend in f32) or graph.
        #[arg(long, default_value = "auto")]
        joint: String,
    },
    /// Parameter count and one forward pass of a preset (CPU backend).
    ModelShape {
        #[arg(long, default_value = "parakeet-tdt-0.6b")]
        preset: String,
        /// Audio seconds of the one utterance.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Target tokens.
        #[arg(long, default_value_t = 20)]
        tokens: usize,
        /// Vocabulary (Parakeet: 1024).
        #[arg(long, default_value_t = 1024)]
        vocab: usize,
        #[arg(long, default_value_t = 2)]
        repeats: usize,
    },
    /// The TDT loss on a device against the float64 CPU path, for each logits type, at
    /// Parakeet-TDT-0.6B's sizes (batch 8, up to 750 frames and 150 tokens, 1024 tokens +
    /// blank, 5 durations) and edge sizes; costs' largest relative error, gradients' largest
    /// absolute error, and the loss's forward + backward time over one log-softmax's.
    TdtCheck {
        /// `cpu` (burn-flex, which stores f32, f16 and bf16), `wgpu` or `cuda:N`.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Logits types, comma-separated (a type the device lacks is reported unsupported).
        #[arg(long, value_delimiter = ',', default_value = "f32,f16,bf16")]
        dtypes: Vec<String>,
        /// `parakeet`, `small` (seconds on a CPU, for dry runs) or `peer` (only the case
        /// `--dump` writes: batch 4, 300 frames, 80 tokens, 1024 tokens + blank).
        #[arg(long, default_value = "parakeet")]
        sizes: String,
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Also write one case's inputs and float64 costs and gradients as .npy files here
        /// (for bench/tdt_peer.py).
        #[arg(long)]
        dump: Option<PathBuf>,
        /// Also write the JSON result to this file.
        #[arg(long)]
        json_out: Option<PathBuf>,
    },
    /// Each matmul kernel `asrt train --matmul` takes, at the 0.6B preset's linear products
    /// (forward, and the input's and the weight's gradients, whose operands are transposed
    /// views): median time per product, TFLOP/s, the largest error against float64 on sampled
    /// outputs, and the fastest kernel that ran every case right. A kernel the device cannot run
    /// is listed with the reason.
    Matmul {
        /// `wgpu` or `cuda:N`.
        #[arg(long, default_value = "wgpu")]
        device: String,
        /// Kernels, comma-separated (default: all).
        #[arg(long, value_enum, value_delimiter = ',')]
        kernels: Option<Vec<asr_trainer::MatmulKernel>>,
        /// `parakeet` or `small` (for dry runs); `attention` or `attention-small`: the attention's
        /// stacks of products (`burn` and `cublas` only).
        #[arg(long, default_value = "parakeet")]
        sizes: String,
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// The operands' type: `f32`, or `bf16`/`f16` as mixed precision's products take them
        /// (rounded, the product written in f32; lavapipe has f16, not bf16).
        #[arg(long, value_enum, default_value = "f32")]
        operands: Operands,
    },
    /// What an AdamW update holds beyond the model and its moments: the growth of the peak
    /// resident set over steps 2.. from after step 1 (device memory on `cpu`, `flex`, and `wgpu`
    /// over Mesa's software Vulkan; not on a real GPU), with made-up gradients, for the preset
    /// with its encoder's layers and width overridden; in MiB and in parameter sizes. On wgpu
    /// (and CUDA) also CubeCL's pool: bytes in use after the steps, and the most it reserved.
    /// The step's time leaves out the flat update's gradient norm (the clipping's, which Burn's
    /// adaptor does not take here), timed apart.
    OptimizerMemory {
        /// `cpu`, `flex` or `wgpu` (fused unless `--fusion off`).
        #[arg(long, default_value = "wgpu")]
        device: String,
        #[arg(long, value_enum, default_value = "on")]
        fusion: asr_trainer::Fusion,
        #[arg(long, value_enum, default_value = "flat")]
        optimizer: optimizer_memory::Which,
        /// `FlatAdamW`'s chunk in MiB (default: 256 MiB, or a sixteenth of the device's largest
        /// buffer if smaller).
        #[arg(long)]
        chunk_mib: Option<f64>,
        #[arg(long, default_value = "parakeet-tdt-0.6b")]
        preset: String,
        #[arg(long)]
        layers: Option<usize>,
        #[arg(long)]
        d_model: Option<usize>,
        /// Vocabulary (Parakeet: 1024).
        #[arg(long, default_value_t = 1024)]
        vocab: usize,
        #[arg(long, default_value_t = 4)]
        steps: usize,
    },
    /// NCCL at world size 1 on `cuda:N`: the in-process all-reduce (CubeCL's client) and the
    /// between-processes communicator (cudarc), each summing a known vector; a build without
    /// CUDA says so.
    NcclCheck {
        #[arg(long, default_value = "cuda:0")]
        device: String,
    },
    /// Assemble every batch of an epoch from a corpus on this thread.
    Batches {
        corpus: PathBuf,
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// f32 instead of i16 audio.
        #[arg(long)]
        f32: bool,
    },
}

/// Resident memory of this process from /proc/self/status, in MiB: (total, anonymous, file
/// mapped, peak).
fn memory() -> (f64, f64, f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("RssAnon:"), field("RssFile:"), field("VmHWM:"))
}

/// `matmul`'s operands' type (here, not in `matmul`: the flag parses in every build).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Operands {
    /// f32, as f32 training multiplies them.
    F32,
    /// bfloat16 in, f32 out, as bf16-mixed multiplies them.
    Bf16,
    /// float16 in, f32 out, as f16-mixed multiplies them.
    F16,
}

#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
impl Operands {
    /// `x` as this type holds it.
    fn round(self, x: f32) -> f32 {
        match self {
            Operands::F32 => x,
            Operands::Bf16 => burn::tensor::bf16::from_f32(x).to_f32(),
            Operands::F16 => burn::tensor::f16::from_f32(x).to_f32(),
        }
    }

    /// The half type a tensor is cast to, if any.
    fn dtype(self) -> Option<burn::tensor::FloatDType> {
        match self {
            Operands::F32 => None,
            Operands::Bf16 => Some(burn::tensor::FloatDType::BF16),
            Operands::F16 => Some(burn::tensor::FloatDType::F16),
        }
    }

    /// The name `--operands` takes.
    fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self).map_or_else(String::new, |v| v.get_name().into())
    }
}

/// `matmul` on the device named (bare, unfused: the kernels as launched).
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(unused_variables))]
fn matmul_bench(
    device: &str,
    kernels: Option<&[asr_trainer::MatmulKernel]>,
    sizes: &str,
    repeats: usize,
    operands: Operands,
) -> anyhow::Result<serde_json::Value> {
    let kernels = kernels.map_or_else(|| asr_trainer::MatmulKernel::all().to_vec(), <[_]>::to_vec);
    let devices: Devices = device.parse()?;
    devices.prepare(&kernel_cache(), false)?;
    let name = device;
    match devices {
        #[cfg(feature = "wgpu")]
        Devices::Wgpu(..) => {
            let device = Default::default();
            matmul::run::<burn::backend::Wgpu>(&device, name, &kernels, sizes, repeats, operands)
        }
        #[cfg(feature = "cuda")]
        Devices::Cuda(ordinals, _) => matmul::run::<burn::backend::Cuda>(
            &burn::backend::cuda::CudaDevice::new(ordinals[0]),
            name,
            &kernels,
            sizes,
            repeats,
            operands,
        ),
        _ => anyhow::bail!("matmul runs on wgpu or cuda:N, not {device}"),
    }
}

/// Waits for the device, failing with what it reported: a failed sync, or queued work that
/// failed after its caller went on (a cuBLAS product: `device_failure::defer`).
fn sync<B: burn::tensor::backend::Backend>(device: &B::Device) -> anyhow::Result<()> {
    asr_trainer::device_failure::check::<B>(device).map_err(|e| anyhow::anyhow!("{e}"))
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

// The allocator `asrt` trains with, set up as it sets it up (trainer/src/main.rs): until
// 2026-11-27 the benchmarks ran on glibc's malloc, whose freed blocks are unmapped and
// page-faulted in again by the next operation, so their step times were not `asrt train`'s
// (bench/RESULTS.md, "Allocator" and "The encoder alone against PyTorch's").
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<ExitCode> {
    #[cfg(not(feature = "system-allocator"))]
    asr_trainer::allocator::configure_for_training();
    // Started under the name `asrt` (a link), this binary is `asrt`: the GPU kit carries one
    // binary for both, as they share most of their code and the device tool carries 64 MiB a
    // call (scripts/gpu/bundle.sh).
    let name = std::env::args_os().next().map(PathBuf::from);
    if name.as_deref().and_then(|p| p.file_stem()).is_some_and(|stem| stem == "asrt") {
        return Ok(asr_trainer::cli_main());
    }
    let out = match Args::parse().bench {
        Bench::TrainStep {
            corpus,
            steps,
            max_batch_seconds,
            backend,
            preset,
            layers,
            dropout,
            precision,
            forward_only,
            part,
            fused_batch_size,
            joint,
        } => {
            let encoder_only = match part.as_str() {
                "model" => false,
                "encoder" => true,
                other => anyhow::bail!("--part {other:?}: expected model or encoder"),
            };
            let mut cfg = asr_trainer::TrainConfig::for_preset(&preset)
                .with_context(|| format!("unknown preset {preset}"))?;
            if let Some(n) = layers {
                cfg.model.encoder.n_layers = n;
            }
            if let Some(d) = dropout {
                cfg.model.encoder.dropout = d;
            }
            cfg.train.precision = precision;
            cfg.train.fused_batch_size = fused_batch_size;
            cfg.train.joint = match joint.as_str() {
                "auto" => asr_trainer::JointPath::Auto,
                "graph" => asr_trainer::JointPath::Graph,
                other => anyhow::bail!("--joint {other:?}: expected auto or graph"),
            };
            cfg.train.grad_accum = 1;
            cfg.train.max_steps = steps + 2;
            cfg.sampler.max_batch_seconds = max_batch_seconds;
            let run = StepRun {
                path: &corpus,
                steps,
                cfg,
                backend: &backend,
                forward_only,
                encoder_only,
            };
            match backend.as_str() {
                "ndarray" => {
                    train_step_bench::<burn::backend::Autodiff<burn::backend::NdArray>>(run)?
                }
                "flex" => train_step_bench::<burn::backend::Autodiff<burn::backend::Flex>>(run)?,
                other => anyhow::bail!("--backend {other:?}: expected ndarray or flex"),
            }
        }
        Bench::OptimizerMemory {
            device,
            fusion,
            optimizer,
            chunk_mib,
            preset,
            layers,
            d_model,
            vocab,
            steps,
        } => {
            let mut model = asr_trainer::ModelConfig::preset(&preset)
                .with_context(|| format!("unknown preset {preset}"))?;
            if let Some(n) = layers {
                model.encoder.n_layers = n;
            }
            if let Some(d) = d_model {
                model.encoder.d_model = d;
                model.encoder.ff_dim = 4 * d;
            }
            let devices = device.parse::<Devices>()?.with_fusion(fusion);
            devices.prepare(&kernel_cache(), false)?;
            let chunk = chunk_mib.map(|m| (m * 1048576.0 / 4.0) as usize);
            let work = optimizer_memory::OptimizerMemory {
                name: device,
                model,
                vocab,
                which: optimizer,
                chunk,
                steps,
            };
            asr_trainer::dispatch(&devices, work)?
        }
        Bench::ModelShape { preset, seconds, tokens, vocab, repeats } => {
            model_shape_bench(&preset, seconds, tokens, vocab, repeats)?
        }
        Bench::Plan {
            utterances,
            repeats,
            world_size,
            write_inputs,
            mode,
            corpora,
            source_temperature,
        } => {
            let (d, l) = lognormal_zipf(utterances, 12, 7, 5.0);
            let k = corpora.max(1) as usize;
            let ends: Vec<u32> = if k > 1 {
                (1..=k).map(|c| (utterances * c / k) as u32).collect()
            } else {
                Vec::new()
            };
            let weights: Vec<f64> = if k > 1 {
                (0..k).map(|c| if c % 2 == 0 { 1.0 } else { 2.0 }).collect()
            } else {
                Vec::new()
            };
            // Sources reuse the language generator: 8 "languages" with Zipf shares.
            let sources = if source_temperature.is_some() {
                lognormal_zipf(utterances, 8, 8, 5.0).1
            } else {
                Vec::new()
            };
            let mix = asr_trainer::Mix { corpus_ends: &ends, weights: &weights, sources: &sources };
            let (_, _, _, before) = memory();
            let cfg = SamplerConfig { mode, source_temperature, ..SamplerConfig::default() };
            let mut times = Vec::new();
            let mut batches = 0;
            for _ in 0..repeats.max(1) {
                let t = Instant::now();
                let plan = EpochPlan::build_mixed(
                    Durations::Seconds(&d),
                    &l,
                    &mix,
                    &cfg,
                    0,
                    world_size,
                    4,
                )?;
                times.push(t.elapsed().as_secs_f64());
                batches = plan.len();
            }
            let (_, _, _, peak) = memory();
            // Written after measuring, so the serialisation buffers do not count as the planner's.
            if let Some(dir) = write_inputs {
                std::fs::create_dir_all(&dir)?;
                let bytes: Vec<u8> = d.iter().flat_map(|x| x.to_le_bytes()).collect();
                std::fs::write(dir.join("durations.f64"), bytes)?;
                let bytes: Vec<u8> = l.iter().flat_map(|x| x.to_le_bytes()).collect();
                std::fs::write(dir.join("languages.u16"), bytes)?;
            }
            json!({
                "bench": "plan", "mode": mode.name(), "utterances": utterances, "world_size": world_size,
                "corpora": k, "source_temperature": source_temperature,
                "batches": batches, "seconds_median": median(times.clone()), "seconds_all": times,
                "input_mib": before, "peak_mib": peak, "planner_peak_mib": peak - before,
            })
        }
        Bench::Startup { corpus } => {
            let (rss0, anon0, _, _) = memory();
            let t = Instant::now();
            let c =
                Corpus::open(&corpus).with_context(|| format!("opening {}", corpus.display()))?;
            let open_s = t.elapsed().as_secs_f64();
            let (rss1, anon1, file1, _) = memory();
            let t = Instant::now();
            let durations = Durations::Samples { samples: c.num_samples(), rate: 16_000.0 };
            let plan =
                EpochPlan::build(durations, c.languages(), &SamplerConfig::default(), 0, 8, 4)?;
            let plan_s = t.elapsed().as_secs_f64();
            let (rss2, anon2, file2, peak) = memory();
            json!({
                "bench": "startup", "corpus": corpus, "utterances": c.len(), "file_bytes": c.as_bytes().len(),
                "open_seconds": open_s, "plan_seconds": plan_s, "batches": plan.len(),
                "rss_mib": {"start": rss0, "after_open": rss1, "after_plan": rss2, "peak": peak},
                "anon_mib": {"start": anon0, "after_open": anon1, "after_plan": anon2},
                "file_mapped_mib": {"after_open": file1, "after_plan": file2},
            })
        }
        Bench::TdtMemory { backend, batch, frames, targets, vocab } => match backend.as_str() {
            "cpu" => tdt_memory::<burn::backend::NdArray>(
                "cpu",
                &Default::default(),
                [batch, frames, targets, vocab],
            )?,
            #[cfg(feature = "wgpu")]
            "wgpu" => tdt_memory::<burn::backend::Wgpu>(
                "wgpu",
                &Default::default(),
                [batch, frames, targets, vocab],
            )?,
            #[cfg(not(feature = "wgpu"))]
            "wgpu" => anyhow::bail!("--backend wgpu: this build has no wgpu (--features wgpu)"),
            other => anyhow::bail!("--backend {other}: expected cpu or wgpu"),
        },
        Bench::JointMemory { batch, seconds, tokens_per_second, part, unfused } => {
            joint_memory(batch, seconds, tokens_per_second, part, unfused)?
        }
        Bench::TdtCheck { device, dtypes, sizes, repeats, dump, json_out } => {
            let dump = dump.as_deref();
            // Parsed and prepared as `asrt train --device` does; `cpu` here is burn-flex.
            let devices: Devices = device.parse()?;
            devices.prepare(&kernel_cache(), false)?;
            let v = match devices {
                Devices::Cpu(_) | Devices::Flex(_) => tdt_check::run::<burn::backend::Flex>(
                    &Default::default(),
                    "cpu (burn-flex)",
                    &dtypes,
                    &sizes,
                    repeats,
                    dump,
                )?,
                #[cfg(feature = "wgpu")]
                Devices::Wgpu(..) => tdt_check::run::<burn::backend::Wgpu>(
                    &Default::default(),
                    "wgpu",
                    &dtypes,
                    &sizes,
                    repeats,
                    dump,
                )?,
                #[cfg(feature = "cuda")]
                Devices::Cuda(ordinals, _) => tdt_check::run::<burn::backend::Cuda>(
                    &burn::backend::cuda::CudaDevice::new(ordinals[0]),
                    &device,
                    &dtypes,
                    &sizes,
                    repeats,
                    dump,
                )?,
            };
            if let Some(p) = json_out {
                std::fs::write(&p, serde_json::to_string_pretty(&v)?)
                    .with_context(|| format!("writing {}", p.display()))?;
            }
            v
        }
        Bench::NcclCheck { device } => nccl_check(&device)?,
        Bench::Matmul { device, kernels, sizes, repeats, operands } => {
            matmul_bench(&device, kernels.as_deref(), &sizes, repeats, operands)?
        }
        Bench::Tdt { batch, frames, targets, vocab, repeats } => {
            tdt_bench(batch, frames, targets, vocab, repeats)?
        }
        Bench::Batches { corpus, repeats, f32 } => {
            let c = Corpus::open(&corpus)?;
            let durations = Durations::Samples { samples: c.num_samples(), rate: 16_000.0 };
            let plan =
                EpochPlan::build(durations, c.languages(), &SamplerConfig::default(), 0, 1, 1)?;
            let ids = plan.rank_batches(0, 0);
            let format = if f32 { AudioFormat::F32 } else { AudioFormat::I16 };
            // Warm-up pass: brings the corpus into the page cache.
            let mut secs = 0.0;
            for &b in &ids {
                if b != IDLE {
                    secs += assemble(&c, plan.batch(b), ShapePolicy::default(), format).seconds;
                }
            }
            let mut rates = Vec::new();
            for _ in 0..repeats.max(1) {
                let t = Instant::now();
                let mut checksum = 0u64;
                for &b in &ids {
                    if b != IDLE {
                        let batch = assemble(&c, plan.batch(b), ShapePolicy::default(), format);
                        // Keeps the optimiser from eliding the copies into a buffer never read.
                        let batch = std::hint::black_box(batch);
                        checksum = checksum.wrapping_add(batch.max_samples as u64);
                    }
                }
                std::hint::black_box(checksum);
                rates.push(secs / t.elapsed().as_secs_f64());
            }
            json!({
                "bench": "batches", "corpus": corpus, "batches": ids.len(), "audio_seconds": secs,
                "format": if f32 { "f32" } else { "i16" },
                "audio_seconds_per_second_median": median(rates.clone()), "all": rates,
            })
        }
    };
    println!("{out}");
    Ok(ExitCode::SUCCESS)
}

/// The kernel cache `asrt` would use (`ASRT_KERNEL_CACHE`, the XDG cache).
fn kernel_cache() -> asr_trainer::KernelCache {
    asr_trainer::KernelCache::resolve(None, &|k| std::env::var(k).ok())
}

#[cfg(not(feature = "cuda"))]
fn nccl_check(device: &str) -> anyhow::Result<serde_json::Value> {
    anyhow::bail!("nccl-check --device {device}: this asrt-bench was built without cuda")
}

/// Sums `1, 2, ..., n` over one rank both ways NCCL is used; each must give it back unchanged.
#[cfg(feature = "cuda")]
fn nccl_check(device: &str) -> anyhow::Result<serde_json::Value> {
    use asr_trainer::{HostSum, NcclGroup, Solo};
    use burn::backend::cuda::CudaDevice;
    use burn::backend::Cuda;
    let devices: Devices = device.parse()?;
    let Devices::Cuda(ordinals, _) = &devices else {
        anyhow::bail!("--device {device}: expected cuda:N");
    };
    let n = ordinals[0];
    // As one of several processes: NCCL is made loadable.
    devices.prepare(&kernel_cache(), true)?;
    let values: Vec<f32> = (1..=1000).map(|i| i as f32).collect();
    let dev = CudaDevice::new(n);
    // Unfused, then through fusion (the default backend of `asrt train --device cuda:N`).
    let (got, in_process_s) = all_reduce_once::<Cuda>(&values, &dev)?;
    let (got_fused, fused_s) = all_reduce_once::<asr_trainer::FusedCuda>(&values, &dev)?;
    let s = Instant::now();
    let mut group = NcclGroup::join(n, &mut Solo)?;
    let mut host = values.clone();
    group.sum(&mut host)?;
    let communicator_s = s.elapsed().as_secs_f64();
    Ok(json!({
        "bench": "nccl-check", "device": device,
        "in_process_all_reduce_ok": got == values, "in_process_seconds": in_process_s,
        "fused_all_reduce_ok": got_fused == values, "fused_seconds": fused_s,
        "communicator_ok": host == values, "communicator_seconds": communicator_s,
    }))
}

/// `values` summed by `B`'s in-process all-reduce over one device, read back, and its seconds.
#[cfg(feature = "cuda")]
fn all_reduce_once<B: asr_trainer::DeviceAllReduce>(
    values: &[f32],
    dev: &B::Device,
) -> anyhow::Result<(Vec<f32>, f64)> {
    use burn::tensor::{Tensor, TensorData};
    let s = Instant::now();
    let t = Tensor::<B, 1>::from_data(TensorData::new(values.to_vec(), [values.len()]), dev);
    let summed = B::device_all_reduce(t, std::slice::from_ref(dev));
    let got: Vec<f32> =
        summed.into_data().convert::<f32>().to_vec().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok((got, s.elapsed().as_secs_f64()))
}

/// Resets this process's peak resident memory to the current one (Linux `clear_refs` 5).
fn reset_peak() -> anyhow::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("resetting the peak RSS")
}

fn tdt_memory<B: asr_tdt::op::TdtBackend>(
    name: &str,
    device: &B::Device,
    [b, t, u, v]: [usize; 4],
) -> anyhow::Result<serde_json::Value> {
    use asr_plan::rng::SplitMix64;
    use asr_tdt::op::TdtLoss;
    use asr_tdt::TdtOptions;
    use burn::backend::Autodiff;
    use burn::tensor::{ElementConversion, Tensor, TensorData};

    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let d = options.durations.len();
    let shape = [b, t, u + 1, v + d];
    let n: usize = shape.iter().product();
    let mut rng = SplitMix64::new(1);
    let targets: Vec<u32> = (0..b * u).map(|_| rng.below(v as u64 - 1) as u32).collect();
    let x = {
        let logits: Vec<f32> = (0..n).map(|_| (rng.next_f64() * 6.0 - 3.0) as f32).collect();
        Tensor::<Autodiff<B>, 4>::from_data(TensorData::new(logits, shape), device)
    }
    .require_grad();
    B::sync(device).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let logits_mib = (n * 4) as f64 / 1048576.0;
    let (rss0, _, _, _) = memory();
    reset_peak()?;
    let s = Instant::now();
    let mut loss = TdtLoss::new(options, 0)?;
    // The loss gets an intermediate, as the joint's output is in training (only the loss holds
    // it), not the leaf this function keeps for reading its gradient.
    let z = x.clone().mul_scalar(1.0);
    // Measured apart: what making the intermediate costs is the backend's, not the loss's
    // (on wgpu over lavapipe a fresh buffer peaks at twice its size while it is first written).
    B::sync(device).map_err(|e| anyhow::anyhow!("the device failed: {e:?}"))?;
    let (rss_z, _, _, peak_z) = memory();
    reset_peak()?;
    let out = loss.forward(z, &targets, &vec![t; b], &vec![u; b])?;
    let grads = out.loss.backward();
    let g = x.grad(&grads).context("no gradient")?;
    // Reading one value waits for the device.
    let probe: f32 = g.clone().slice([0..1, 0..1, 0..1, 0..1]).into_scalar().elem();
    // A device that failed (an allocation over its limit) says so here, not in the figures.
    B::sync(device).map_err(|e| anyhow::anyhow!("the device failed: {e:?}"))?;
    let seconds = s.elapsed().as_secs_f64();
    let (_, _, _, peak) = memory();
    Ok(json!({
        "bench": "tdt-memory", "backend": name, "shape": shape, "logits_mib": logits_mib,
        "rss_before_mib": rss0, "peak_rss_mib": peak.max(peak_z),
        "peak_growth_mib": peak.max(peak_z) - rss0,
        "peak_growth_over_logits": (peak.max(peak_z) - rss0) / logits_mib,
        "intermediate_peak_growth_mib": peak_z - rss0,
        "loss_peak_growth_mib": peak - rss_z,
        "loss_peak_growth_over_logits": (peak - rss_z) / logits_mib,
        "seconds": seconds, "gradient_probe": probe,
    }))
}

fn joint_memory(
    b: usize,
    seconds: f64,
    tokens_per_second: f64,
    part: usize,
    unfused: bool,
) -> anyhow::Result<serde_json::Value> {
    use asr_plan::rng::SplitMix64;
    use asr_tdt::op::TdtLoss;
    use asr_tdt::TdtOptions;
    use asr_trainer::{joint_in_parts, Joint, JointInputs, TrainConfig};
    use burn::backend::{Autodiff, NdArray};
    use burn::optim::GradientsParams;
    use burn::tensor::{activation, ElementConversion, Tensor, TensorData};
    type Ad = Autodiff<NdArray>;

    anyhow::ensure!(b > 0 && seconds > 0.0, "--batch and --seconds must be positive");
    anyhow::ensure!(!(unfused && part > 0), "--unfused runs the whole micro-batch (no --part)");
    let cfg = TrainConfig::from_toml("preset = \"parakeet-tdt-0.6b\"\n")?;
    let m = &cfg.model;
    let vocab = 1024;
    let d = m.durations.len();
    let width = vocab + 1 + d;
    let (d_enc, d_pred) = (m.encoder.d_model, m.decoder.pred_hidden);
    let t = (seconds / 0.08).ceil() as usize;
    let u = (seconds * tokens_per_second).round() as usize;
    let device = Default::default();
    <Ad as burn::tensor::backend::Backend>::seed(&device, 1);
    let joint = Joint::<Ad>::new(&m.joint, d_enc, d_pred, width, &device);
    let mut rng = SplitMix64::new(3);
    let mut random =
        |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32).collect() };
    let enc =
        Tensor::<Ad, 3>::from_data(TensorData::new(random(b * t * d_enc), [b, t, d_enc]), &device)
            .require_grad();
    let pred = Tensor::<Ad, 3>::from_data(
        TensorData::new(random(b * (u + 1) * d_pred), [b, u + 1, d_pred]),
        &device,
    )
    .require_grad();
    let mut r2 = SplitMix64::new(4);
    let targets: Vec<u32> = (0..b * u).map(|_| r2.below(vocab as u64) as u32).collect();
    let (frames, lens) = (vec![t; b], vec![u; b]);
    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let mut loss = TdtLoss::new(options, 0)?;
    let logits_mib = (b * t * (u + 1) * width * 4) as f64 / 1048576.0;

    let (rss0, _, _, _) = memory();
    reset_peak()?;
    let s = Instant::now();
    let (value, grads, d_enc_probe) = if part > 0 {
        let x = JointInputs {
            enc: joint.project_encoder(enc.clone()),
            pred: joint.project_prediction(pred.clone()),
            tokens: &targets,
            enc_lens: &frames,
            token_lens: &lens,
        };
        let (value, grads) = joint_in_parts(&joint, &joint, &loss, x, part, false, 1.0)?
            .context("non-finite loss")?;
        // The inputs' gradients came through the surrogate backward, with the parameters'.
        (value, grads, f32::NAN)
    } else {
        let logits = joint.forward(enc.clone(), pred.clone());
        let logits = if unfused {
            let tokens = logits.clone().slice([0..b, 0..t, 0..u + 1, 0..vocab + 1]);
            let durations = logits.slice([0..b, 0..t, 0..u + 1, vocab + 1..width]);
            Tensor::cat(
                vec![activation::log_softmax(tokens, 3), activation::log_softmax(durations, 3)],
                3,
            )
        } else {
            logits
        };
        let out = loss.forward(logits, &targets, &frames, &lens)?;
        let value: f32 = out.loss.clone().into_scalar().elem();
        let grads = out.loss.backward();
        let probe: f32 =
            enc.grad(&grads).context("no encoder gradient")?.abs().sum().into_scalar().elem();
        (f64::from(value), GradientsParams::from_grads(grads, &joint), probe)
    };
    let seconds_taken = s.elapsed().as_secs_f64();
    let (_, _, _, peak) = memory();
    let params = grads.len();
    Ok(json!({
        "bench": "joint-memory", "batch": b, "seconds_each": seconds, "frames": t, "targets": u,
        "logits_shape": [b, t, u + 1, width], "logits_mib": logits_mib,
        "mode": if unfused { "unfused".to_string() } else if part > 0 { format!("parts of {part}") } else { "fused".to_string() },
        "rss_before_mib": rss0, "peak_growth_mib": peak - rss0,
        "peak_growth_over_logits": (peak - rss0) / logits_mib,
        "loss": value, "joint_parameters_with_gradient": params, "encoder_gradient_probe": d_enc_probe,
        "seconds": seconds_taken,
    }))
}

fn tdt_bench(
    b: usize,
    t: usize,
    u: usize,
    v: usize,
    repeats: usize,
) -> anyhow::Result<serde_json::Value> {
    use asr_plan::rng::SplitMix64;
    use asr_tdt::op::{tdt_costs, TdtLoss, TdtProblem};
    use asr_tdt::TdtOptions;
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::{activation, Tensor, TensorData};

    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let d = options.durations.len();
    let shape = [b, t, u + 1, v + d];
    let mut rng = SplitMix64::new(1);
    let logits: Vec<f32> =
        (0..shape.iter().product::<usize>()).map(|_| (rng.next_f64() * 6.0 - 3.0) as f32).collect();
    let targets: Vec<u32> = (0..b * u).map(|_| rng.below(v as u64 - 1) as u32).collect();
    // Ragged, as real batches are: lengths between half and all of the padded size.
    let frame_lens: Vec<usize> = (0..b).map(|i| t - i * t / (2 * b)).collect();
    let target_lens: Vec<usize> = (0..b).map(|i| u - i * u / (2 * b)).collect();
    let device = Default::default();
    let x = Tensor::<NdArray, 4>::from_data(TensorData::new(logits.clone(), shape), &device);

    let mut softmax = Vec::new();
    let mut plain = Vec::new();
    let mut forward = Vec::new();
    let mut fwd_bwd = Vec::new();
    let problem = TdtProblem {
        targets: targets.clone(),
        u_max: u,
        frame_lens: frame_lens.clone(),
        target_lens: target_lens.clone(),
        options: options.clone(),
        rnnt: false,
    };
    for _ in 0..repeats.max(1) {
        let s = Instant::now();
        let y = activation::log_softmax(x.clone(), 3);
        softmax.push(s.elapsed().as_secs_f64());
        drop(std::hint::black_box(y));

        // A second peer: a plain Rust log-softmax over the same rows, both cores.
        let s = Instant::now();
        let mut out = vec![0f32; logits.len()];
        {
            use rayon::prelude::*;
            let w = v + d;
            out.par_chunks_mut(w).zip(logits.par_chunks(w)).for_each(|(o, z)| {
                let m = z.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
                let lse = m + z.iter().map(|&x| (x - m).exp()).sum::<f32>().ln();
                o.iter_mut().zip(z).for_each(|(o, &x)| *o = x - lse);
            });
        }
        plain.push(s.elapsed().as_secs_f64());
        drop(std::hint::black_box(out));

        let s = Instant::now();
        let c = tdt_costs(x.clone(), &problem)?;
        forward.push(s.elapsed().as_secs_f64());
        drop(std::hint::black_box(c));

        let xa = Tensor::<Autodiff<NdArray>, 4>::from_data(
            TensorData::new(logits.clone(), shape),
            &device,
        )
        .require_grad();
        let mut loss = TdtLoss::new(options.clone(), 0)?;
        let s = Instant::now();
        let out = loss.forward(xa.clone(), &targets, &frame_lens, &target_lens)?;
        let grads = out.loss.backward();
        let g = xa.grad(&grads);
        fwd_bwd.push(s.elapsed().as_secs_f64());
        drop(std::hint::black_box(g));
    }
    let (sm, fw, fb) = (median(softmax.clone()), median(forward.clone()), median(fwd_bwd.clone()));
    let pl = median(plain.clone());
    Ok(json!({
        "bench": "tdt", "shape": shape, "threads": rayon::current_num_threads(),
        "log_softmax_seconds": sm, "tdt_forward_seconds": fw, "tdt_forward_backward_seconds": fb,
        "plain_rust_log_softmax_seconds": pl,
        "forward_backward_over_log_softmax": fb / sm,
        "forward_backward_over_plain_log_softmax": fb / pl,
        "all": {"log_softmax": softmax, "plain_log_softmax": plain, "forward": forward, "forward_backward": fwd_bwd},
    }))
}

/// What `train-step` runs.
struct StepRun<'a> {
    path: &'a std::path::Path,
    steps: u64,
    cfg: asr_trainer::TrainConfig,
    backend: &'a str,
    forward_only: bool,
    /// The encoder and a surrogate loss only ([`asr_trainer::Trainer::encoder_surrogate`]).
    encoder_only: bool,
}

fn train_step_bench<B>(run: StepRun<'_>) -> anyhow::Result<serde_json::Value>
where
    B: burn::tensor::backend::AutodiffBackend + asr_tdt::op::TdtBackend,
    B::InnerBackend: asr_trainer::DeviceAllReduce,
{
    use asr_trainer::Trainer;
    let StepRun { path, steps, cfg, backend, forward_only, encoder_only } = run;
    let set = asr_trainer::TrainingSet::open(&[asr_trainer::DataSpec::new(path)])?;
    let corpus = set.corpus(0);
    let vocab = corpus.metadata().tokenizer.vocab_size as usize;
    let params;
    let mut trainer = Trainer::<B>::new(cfg.clone(), vocab, Default::default())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    {
        use burn::module::Module;
        params = trainer.model.num_params();
    }
    let rate = f64::from(corpus.header().sample_rate);
    let mut times = Vec::new();
    let mut rates = Vec::new();
    let mut audios = Vec::new();
    // The joint lattice's cells, padded and valid (audio samples times targets + 1 stand for
    // frames times targets + 1): how much of the joint's work a whole-batch call spends on padding.
    let mut padded_cells = 0.0;
    let mut valid_cells = 0.0;
    let mut epoch = 0;
    'outer: loop {
        let plan = EpochPlan::build(
            Durations::Samples { samples: corpus.num_samples(), rate },
            corpus.languages(),
            &cfg.sampler,
            epoch,
            1,
            1,
        )?;
        anyhow::ensure!(plan.steps() > 0, "no step in an epoch of this corpus");
        for step in 0..plan.steps() {
            let batches: Vec<_> = plan
                .step_batches(step, 0)
                .iter()
                .filter(|&&b| b != IDLE)
                .map(|&b| assemble(corpus, plan.batch(b), ShapePolicy::default(), AudioFormat::I16))
                .collect();
            let t = Instant::now();
            let audio = if encoder_only {
                let mut audio = 0.0;
                for b in &batches {
                    trainer
                        .encoder_surrogate(b, !forward_only)
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    audio += b.seconds;
                }
                trainer.step += 1;
                audio
            } else if forward_only {
                let mut audio = 0.0;
                for b in &batches {
                    trainer.forward_loss(b).map_err(|e| anyhow::anyhow!("{e}"))?;
                    audio += b.seconds;
                }
                trainer.step += 1;
                audio
            } else {
                let m = trainer
                    .train_step(&batches, &set, epoch)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                m.audio_seconds
            };
            let dt = t.elapsed().as_secs_f64();
            // The first two steps warm allocators and caches.
            if trainer.step > 2 {
                for b in &batches {
                    padded_cells += (b.size() * b.max_samples * (b.max_tokens + 1)) as f64;
                    valid_cells += b
                        .audio_lens
                        .iter()
                        .zip(&b.token_lens)
                        .map(|(&a, &u)| f64::from(a) * f64::from(u + 1))
                        .sum::<f64>();
                }
                times.push(dt);
                rates.push(audio / dt);
                audios.push(audio);
            }
            if trainer.step >= steps + 2 {
                break 'outer;
            }
        }
        epoch += 1;
    }
    let part = if encoder_only { "encoder" } else { "model" };
    Ok(json!({
        "bench": "train_step", "preset": cfg.preset, "layers": cfg.model.encoder.n_layers,
        "backend": backend, "precision": cfg.train.precision.to_string(), "forward_only": forward_only,
        "part": part,
        "threads": rayon::current_num_threads(), "parameters": params, "steps": times.len(),
        "max_batch_seconds": cfg.sampler.max_batch_seconds, "audio_seconds_median": median(audios),
        "step_seconds_median": median(times.clone()), "audio_seconds_per_second_median": median(rates),
        "step_seconds_all": times, "fused_batch_size": cfg.train.fused_batch_size,
        "joint": format!("{:?}", cfg.train.joint).to_lowercase(),
        "lattice_valid_share": valid_cells / padded_cells,
    }))
}

fn model_shape_bench(
    preset: &str,
    seconds: f64,
    tokens: usize,
    vocab: usize,
    repeats: usize,
) -> anyhow::Result<serde_json::Value> {
    use asr_trainer::MelFrontend;
    use asr_trainer::{ModelConfig, TdtModel};
    use burn::module::Module;
    use burn::prelude::*;
    type B = burn::backend::NdArray;
    let cfg = ModelConfig::preset(preset).with_context(|| format!("unknown preset {preset}"))?;
    let device = Default::default();
    let t = Instant::now();
    let model = TdtModel::<B>::new(&cfg, vocab, 0, &device);
    let init = t.elapsed().as_secs_f64();
    let params = model.num_params();
    let frontend = MelFrontend::<B>::new(&cfg.preprocessor, &device);
    let n = (seconds * 16_000.0) as usize;
    let pcm: Vec<i16> = (0..n).map(|i| ((i as f64 * 0.05).sin() * 8000.0) as i16).collect();
    let targets: Vec<i64> = (0..tokens).map(|i| (i * 7 % vocab) as i64).collect();
    let mut times = Vec::new();
    let mut shape = Vec::new();
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        let (feats, lens) = frontend.forward(&pcm, 1, &[n as u32], None, &device);
        let (enc, _) = model.encode(&cfg, feats, &lens);
        let y =
            Tensor::<B, 2, Int>::from_data(TensorData::new(targets.clone(), [1, tokens]), &device);
        let logits = model.logits(enc, y);
        shape = logits.dims().to_vec();
        let _ = logits.into_data();
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(json!({
        "bench": "model_shape", "preset": preset, "parameters": params, "init_seconds": init,
        "audio_seconds": seconds, "tokens": tokens, "vocab": vocab, "logits_shape": shape,
        "forward_seconds_median": median(times.clone()), "forward_seconds_all": times,
    }))
}
