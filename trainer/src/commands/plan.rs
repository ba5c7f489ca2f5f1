//! `asrt plan`: the command line and config file turned into a [`PlanRequest`]; the plan,
//! its report and its printing are `asr_plan::command` (no Burn).

use std::process::ExitCode;

use crate::cli::PlanArgs;
use crate::config::TrainConfig;
use asr_plan::command::{PlanOutput, PlanRequest};
use asr_plan::set::resolve_specs;

/// Runs the command.
pub fn run(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    let s = &args.sampler;
    let (config, shape, grad_accum, data) = match &args.config {
        Some(p) => {
            let t = TrainConfig::from_file(p)?;
            (t.sampler, t.shape, t.train.grad_accum, t.data)
        }
        None => (s.config(), s.shape(), s.grad_accum, Vec::new()),
    };
    let output = match (args.batches, args.json) {
        (true, _) => PlanOutput::Batches { rank: args.rank },
        (false, true) => PlanOutput::Json,
        (false, false) => PlanOutput::Text,
    };
    asr_plan::command::run(&PlanRequest {
        data: resolve_specs(&args.corpus, &data)?,
        config,
        shape,
        grad_accum,
        world_size: s.world_size,
        epoch: args.epoch,
        output,
    })?;
    Ok(ExitCode::SUCCESS)
}
