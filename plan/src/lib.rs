//! The batch planner behind `asrt plan` and the trainer's data feed, with no Burn in it: `asrt
//! plan` and every edit here build without the tensor stack.
//!
//! - `set`: the training set of one or more corpora read as one.
//! - `sampler`: the epoch plan (buckets, the temperature sampler or the seed's sampler, packing,
//!   dealing to ranks, re-dealing on a new world size) and its resumable state.
//! - `report`: `asrt plan`'s statistics of a plan; `command`: the command itself, once its
//!   options are known (report as text or JSON, or one rank's batch list).
//! - `shape`: how padded audio and token lengths are rounded.
//! - `batcher`: padded batches and their background loader.
//! - `rng`: every random stream of a run, derived from (seed, stream, counter).
//! - `pyrandom`: CPython's `random.Random`, so plans equal the Python sampler's.
//! - `synthetic`: realistic synthetic (duration, language) arrays for tests and benchmarks.
#![deny(unsafe_code)]

pub mod batcher;
pub mod command;
pub mod pyrandom;
pub mod report;
pub mod rng;
pub mod sampler;
pub mod set;
pub mod shape;
pub mod synthetic;

pub use batcher::{
    assemble, Audio, AudioFormat, LoadedStep, Loader, LoaderConfig, LoaderError, MicroBatch,
    PaddedBatch, Steps,
};
pub use report::{report, GroupReport, LanguageReport, PlanReport, ReportInput};
pub use sampler::{
    epoch_draws, epoch_draws_mixed, quota_cells, target_shares, Cell, Durations, EpochPlan, Mix,
    PlanError, SamplerConfig, SamplerMode, SamplerState, DEFAULT_BOUNDARIES, IDLE,
};
pub use set::{resolve_specs, CorpusIdentity, DataSpec, SetError, TrainingSet, UtteranceSource};
pub use shape::{ShapeError, ShapePolicy};
pub use synthetic::lognormal_zipf;
