//! `asrt`: plans epochs over corpus files (bucketed, temperature-balanced, exactly resumable),
//! assembles padded batches ahead of the trainer, and trains and evaluates FastConformer-TDT
//! models.
//!
//! The public surface is this page: the command line (`Cli`, [`run_command`]), configuration,
//! the batch plan and loader, the model, training, checkpoints, evaluation, and the TDT loss
//! library ([`tdt`]). Everything else is internal and may change without notice.
// Only `allocator` (mimalloc's C option API) and `tdt::cube` (CubeCL's unchecked kernel launches)
// may use `unsafe`, and say why at each use.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod allocator;
pub mod checkpoint;
mod cli;
mod commands;
mod config;
mod data;
pub mod device_failure;
mod eval;
mod model;
pub mod nemo;
pub mod rng;
pub mod tdt;
mod tokenizer;
mod train;

use std::process::ExitCode;

// The command line.
pub use cli::{Cli, Command, EvalArgs, ExportArgs, ImportArgs, PlanArgs, SamplerArgs, TrainArgs};
// Configuration.
pub use config::{ConfigError, LoopConfig, OptimConfig, TrainConfig};
// The batch plan, its report, and the loader.
pub use data::batcher::{
    assemble, Audio, AudioFormat, LoadedStep, Loader, LoaderConfig, LoaderError, MicroBatch,
    PaddedBatch, Steps,
};
pub use data::report::{report, GroupReport, LanguageReport, PlanReport, ReportInput};
pub use data::sampler::{
    epoch_draws, epoch_draws_mixed, quota_cells, target_shares, Cell, Durations, EpochPlan, Mix,
    PlanError, SamplerConfig, SamplerMode, SamplerState, DEFAULT_BOUNDARIES, IDLE,
};
pub use data::set::{
    resolve_specs, CorpusIdentity, DataSpec, SetError, TrainingSet, UtteranceSource,
};
pub use data::shape::ShapePolicy;
pub use data::synthetic::lognormal_zipf;
// Evaluation.
pub use eval::{
    edit_distance, evaluate, evaluate_checkpoint, evaluate_checkpoint_cpu, Decoded, ErrorRates,
    EvalError, Evaluation,
};
// The model.
pub use model::augment::SpecAugmentDraws;
pub use model::config::{PreprocessorConfig, SpecAugmentConfig};
pub use model::decoder::Joint;
pub use model::mel::{unpack_pcm, MelFrontend};
pub use model::{ModelConfig, TdtModel};
pub use tokenizer::{Pieces, TokenizerError};
// Training.
pub use train::collective::{Collective, CollectiveError, LocalGroup, Rendezvous, Solo, TcpGroup};
pub use train::fused::{joint_in_parts, JointInputs};
pub use train::grads::flatten as flatten_gradients;
pub use train::metrics::StepMetrics;
pub use train::out_of_memory::lattice_cells;
pub use train::parallel::{reduce, sync_buffers, DeviceAllReduce, HostSum, RankStep};
pub use train::run::{
    run, run_cpu, run_cpu_ranks, run_ranks, ProcessGroup, RunOptions, RunSummary,
};
pub use train::{OutOfMemory, RankBatches, StepGradients, TrainError, Trainer};

/// Runs one `asrt` command line; the binary maps the error to exit code 2.
pub fn run_command(cli: &Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Plan(args) => commands::plan::run(args),
        Command::Train(args) => commands::train::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Import(args) => commands::nemo::import(args),
        Command::Export(args) => commands::nemo::export(args),
    }
}
