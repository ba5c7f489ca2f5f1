//! `asrt`: plans epochs over corpus files (bucketed, temperature-balanced, exactly resumable),
//! assembles padded batches ahead of the trainer, and trains and evaluates FastConformer-TDT
//! models.
//!
//! The public surface is this page: the command line (`Cli`, [`run_command`]), configuration,
//! the batch plan and loader (re-exported from `asr-plan`), the model, training, checkpoints and
//! evaluation. The TDT loss is the `asr-tdt` crate. Everything else is internal and may change
//! without notice.
// Only `allocator` (mimalloc's C option API), `cuda_env` (cudarc's raw CUDA bindings),
// `model::cublas_product` (cuBLAS's raw bindings) and `model::host_product` (gemm's
// pointer-and-stride products) may use `unsafe` here (asr-tdt's
// `cube` and `joint` are the other places: CubeCL's unchecked kernel launches, gemm), and say
// why at each use.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod allocator;
pub mod checkpoint;
mod cli;
mod commands;
mod config;
// Its `cuda`-feature probe asks the CUDA libraries for their versions and device count through
// cudarc's raw bindings, and says why at each use.
#[allow(unsafe_code)]
pub mod cuda_env;
pub mod device;
pub mod device_failure;
mod eval;
pub mod hf;
pub mod kernel_cache;
mod loss_scale;
mod model;
pub mod model_source;
pub mod nemo;
mod tokenizer;
mod train;
mod transcribe;

use std::process::ExitCode;

// The command line.
pub use cli::{
    Cli, Command, EvalArgs, ExportArgs, ExportFormat, ImportArgs, PlanArgs, SamplerArgs, TrainArgs,
    TranscribeArgs, TranscriptFormat,
};
// Configuration.
pub use config::{ConfigError, JointPath, LoopConfig, OptimConfig, TrainConfig};
// The batch plan, its report, and the loader.
pub use asr_plan::batcher::{
    assemble, Audio, AudioFormat, LoadedStep, Loader, LoaderConfig, LoaderError, MicroBatch,
    PaddedBatch, Steps,
};
pub use asr_plan::report::{report, GroupReport, LanguageReport, PlanReport, ReportInput};
pub use asr_plan::sampler::{
    epoch_draws, epoch_draws_mixed, quota_cells, target_shares, Cell, Durations, EpochPlan, Mix,
    PlanError, SamplerConfig, SamplerMode, SamplerState, DEFAULT_BOUNDARIES, IDLE,
};
pub use asr_plan::set::{
    resolve_specs, CorpusIdentity, DataSpec, SetError, TrainingSet, UtteranceSource,
};
pub use asr_plan::shape::ShapePolicy;
pub use asr_plan::synthetic::lognormal_zipf;
// Evaluation.
pub use eval::{
    edit_distance, evaluate, evaluate_source, Decoded, ErrorRates, EvalError, Evaluation,
};
// The model.
pub use model::augment::SpecAugmentDraws;
pub use model::config::{ModelConfigError, PreprocessorConfig, SpecAugmentConfig};
pub use model::decoder::Joint;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub use model::device_matmul::try_bare as try_matmul;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub use model::device_matmul::try_stacked_bare as try_stacked_matmul;
pub use model::greedy::{BurnGreedy, DeviceState};
pub use model::matmul_kernel::Kernel as MatmulKernel;
pub use model::mel::{unpack_pcm, MelFrontend};
pub use model::precision::{Precision, PrecisionError};
pub use model::{ModelConfig, TdtModel};
pub use tokenizer::{Pieces, TokenizerError};
// Transcription: NeMo's token, word and segment times.
pub use transcribe::timestamps::{
    compute as transcript_timestamps, text as transcript_text, vocabulary_punctuation, FrameTime,
    Span, Timestamps, TokenTime,
};
// Where work runs: devices, the backend dispatcher, the CPU entry points.
#[cfg(feature = "cuda")]
pub use device::FusedCuda;
#[cfg(feature = "wgpu")]
pub use device::FusedWgpu;
pub use device::{
    check_precision, dispatch, evaluate_model_cpu, run_cpu, run_cpu_ranks, Device, DeviceArgs,
    DeviceError, Devices, EvalOn, Fusion, OnBackend, RunOn, SetupError,
};
pub use kernel_cache::KernelCache;
// Training.
pub use loss_scale::LossScale;
pub use train::adamw::{AdamWSettings, HostAdamW};
pub use train::collective::{Collective, CollectiveError, LocalGroup, Rendezvous, Solo, TcpGroup};
pub use train::device_memory::{pool_usage, DeviceMemory};
pub use train::flat_adamw::FlatAdamW;
pub use train::fused::{joint_in_parts, JointInputs};
pub use train::grads::flatten as flatten_gradients;
pub use train::metrics::StepMetrics;
pub use train::out_of_memory::lattice_cells;
#[cfg(feature = "cuda")]
pub use train::parallel::NcclGroup;
pub use train::parallel::{reduce, sync_buffers, DeviceAllReduce, HostSum, RankStep};
pub use train::run::{run, run_ranks, ProcessGroup, RunOptions, RunSummary};
pub use train::{OutOfMemory, RankBatches, ResumeMismatch, StepGradients, TrainError, Trainer};

/// `asrt`'s whole life as a process: parses the process's arguments, runs them, and prints an
/// error as `asrt: error: ...` with exit code 2. The `asrt` binary is this; so is `asrt-bench`
/// started under the name `asrt` (the GPU kit ships that one binary for both, as they share most
/// of their code; scripts/gpu/bundle.sh).
pub fn cli_main() -> ExitCode {
    use clap::Parser;
    let cli = Cli::parse();
    run_command(&cli).unwrap_or_else(|e| {
        eprintln!("asrt: error: {e:#}");
        ExitCode::from(2)
    })
}

/// Runs one `asrt` command line; [`cli_main`] maps the error to exit code 2.
pub fn run_command(cli: &Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Plan(args) => commands::plan::run(args),
        Command::Train(args) => commands::train::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Import(args) => commands::nemo::import(args),
        Command::Export(args) => commands::nemo::export(args),
        Command::Transcribe(args) => commands::transcribe::run(args),
    }
}
