//! `asrt train`.

use std::io::IsTerminal;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{parse_device, Device};
use crate::cli::TrainArgs;
use crate::config::TrainConfig;
use crate::train::metrics::StepMetrics;
use crate::train::run::RunOptions;

fn load_config(args: &TrainArgs) -> anyhow::Result<TrainConfig> {
    let mut cfg = match &args.config {
        Some(p) => TrainConfig::from_file(p)?,
        None => TrainConfig::default(),
    };
    if let Some(n) = args.max_steps {
        cfg.train.max_steps = n;
    }
    cfg.validate()?;
    Ok(cfg)
}

/// Runs `asrt train`.
pub fn run(args: &TrainArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(args)?;
    let opts = RunOptions {
        data: crate::data::set::resolve_specs(&args.corpus, &cfg.data)?,
        out: args.out.clone(),
        resume: args.resume,
        stop_at: args.stop_at,
        val_corpus: args.val_corpus.clone(),
    };
    let accum = cfg.train.grad_accum;
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let bar =
            ProgressBar::with_draw_target(Some(cfg.train.max_steps), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{elapsed_precise} [{bar:25}] step {pos}/{len} {msg} ETA {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar
    });
    let quiet = args.quiet;
    let mut on_step = |m: &StepMetrics, target: u64| {
        let msg = format!(
            "(micro-batch {}, {accum} per step) loss {:.4} lr {:.2e} |g| {:.3} {:.0} audio-s/s{}",
            m.micro_batches,
            m.loss,
            m.lr,
            m.grad_norm,
            m.audio_seconds_per_second,
            if m.skipped { " SKIPPED (non-finite)" } else { "" }
        );
        let msg = match m.validation.as_ref().and_then(|v| v.get("wer")).and_then(|w| w.as_f64()) {
            Some(w) => format!("{msg} val WER {:.1} %", 100.0 * w),
            None => msg,
        };
        if let Some(bar) = &bar {
            bar.set_length(target);
            bar.set_position(m.step);
            bar.set_message(msg);
        } else if !quiet {
            eprintln!("asrt: step {}/{target} {msg}", m.step);
        }
    };
    let summary = match parse_device(&args.device)? {
        Device::Cpu => crate::train::run::run_cpu(cfg, &opts, &mut on_step)?,
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => crate::train::run::run::<burn::backend::Autodiff<burn::backend::Cuda>>(
            cfg,
            &opts,
            burn::backend::cuda::CudaDevice::new(n),
            &mut on_step,
        )?,
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => unreachable!("parse_device refuses cuda:N in a build without cuda"),
    };
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let last = summary.metrics.last();
    println!(
        "trained to step {} ({} skipped); last loss {}; metrics {}, plot {}, checkpoint {}",
        summary.steps,
        summary.skipped,
        last.map_or("-".into(), |m| format!("{:.4}", m.loss)),
        args.out.join("metrics.jsonl").display(),
        args.out.join("loss.svg").display(),
        summary.checkpoint.as_deref().map_or("-".into(), |p| p.display().to_string()),
    );
    Ok(ExitCode::SUCCESS)
}
