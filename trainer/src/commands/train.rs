//! `asrt train` and `asrt eval`.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use asr_corpus::Corpus;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::{EvalArgs, TrainArgs};
#[cfg(feature = "cuda")]
use crate::eval::evaluate;
use crate::eval::Evaluation;
#[cfg(feature = "cuda")]
use crate::model::TdtModel;
use crate::train::checkpoint;
use crate::train::metrics::StepMetrics;
#[cfg(feature = "cuda")]
use crate::train::run::run as run_training;
use crate::train::run::RunOptions;
use crate::train::TrainConfig;

enum Device {
    Cpu,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda(usize),
}

fn parse_device(s: &str) -> anyhow::Result<Device> {
    if s == "cpu" {
        return Ok(Device::Cpu);
    }
    if let Some(n) = s.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
        if cfg!(feature = "cuda") {
            return Ok(Device::Cuda(n));
        }
        bail!("--device {s}: this asrt was built without CUDA (cargo build --features cuda)");
    }
    bail!("--device {s}: expected cpu or cuda:N")
}

fn load_config(args: &TrainArgs) -> anyhow::Result<TrainConfig> {
    let mut cfg = match &args.config {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            TrainConfig::from_toml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => TrainConfig::default(),
    };
    if let Some(n) = args.max_steps {
        cfg.train.max_steps = n;
    }
    cfg.validate().map_err(anyhow::Error::msg)?;
    Ok(cfg)
}

/// Runs `asrt train`.
pub fn run(args: &TrainArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(args)?;
    let opts = RunOptions {
        corpus: args.corpus.clone(),
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
        Device::Cuda(n) => run_training::<burn::backend::Autodiff<burn::backend::Cuda>>(
            cfg,
            &opts,
            burn::backend::cuda::CudaDevice::new(n),
            &mut on_step,
        )?,
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => unreachable!("parse_device refuses cuda without the feature"),
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

/// A checkpoint directory from a checkpoint or a training output directory.
pub fn resolve_checkpoint(p: &Path) -> anyhow::Result<PathBuf> {
    if p.join("state.json").is_file() {
        return Ok(p.to_path_buf());
    }
    for dir in [p.to_path_buf(), p.join("checkpoints")] {
        if let Some(c) = checkpoint::latest(&dir) {
            return Ok(c);
        }
    }
    bail!(
        "{}: no checkpoint (expected state.json, or a `latest` file in it or in its checkpoints/)",
        p.display()
    )
}

fn table(e: &Evaluation) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<8} {:>6} {:>8} {:>8} {:>8} {:>8}",
        "language", "utts", "words", "WER %", "chars", "CER %"
    );
    let mut row = |name: &str, r: &crate::eval::ErrorRates| {
        let _ = writeln!(
            o,
            "{name:<8} {:>6} {:>8} {:>8.2} {:>8} {:>8.2}",
            r.utterances,
            r.words,
            100.0 * r.wer,
            r.chars,
            100.0 * r.cer
        );
    };
    for (l, r) in &e.languages {
        row(l, r);
    }
    row("all", &e.overall);
    o
}

/// Runs `asrt eval`.
pub fn eval(args: &EvalArgs) -> anyhow::Result<ExitCode> {
    let ckpt = resolve_checkpoint(&args.checkpoint)?;
    let state = checkpoint::load_state(&ckpt).map_err(anyhow::Error::msg)?;
    let corpus =
        Corpus::open(&args.corpus).with_context(|| format!("opening {}", args.corpus.display()))?;
    let vocab = corpus.metadata().tokenizer.vocab_size as usize;
    if vocab != state.vocab {
        bail!(
            "{} has a vocabulary of {vocab}, the checkpoint {}",
            args.corpus.display(),
            state.vocab
        );
    }
    let result = match parse_device(&args.device)? {
        Device::Cpu => {
            crate::eval::evaluate_checkpoint_cpu(&ckpt, &corpus, args.limit, args.batch_seconds)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => {
            let cfg = &state.config.model;
            let count = args.limit.unwrap_or(corpus.len()).min(corpus.len());
            let indices: Vec<usize> = (0..count).collect();
            let device = burn::backend::cuda::CudaDevice::new(n);
            let model = TdtModel::<burn::backend::Cuda>::new(cfg, vocab, 0, &device);
            let model =
                checkpoint::load_model(&ckpt, model, &device).map_err(anyhow::Error::msg)?;
            evaluate(&model, cfg, &corpus, &indices, args.batch_seconds, &device)
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => unreachable!("parse_device refuses cuda without the feature"),
    }
    .map_err(anyhow::Error::msg)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print!("checkpoint {} (step {})\n{}", ckpt.display(), state.step, table(&result));
    }
    Ok(ExitCode::SUCCESS)
}
