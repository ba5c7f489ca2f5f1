//! `asrt eval`.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{bail, Context};
use asr_corpus::Corpus;

use super::{parse_device, Device};
use crate::checkpoint;
use crate::cli::EvalArgs;
use crate::eval::{ErrorRates, Evaluation};

fn table(e: &Evaluation) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<8} {:>6} {:>8} {:>8} {:>8} {:>8}",
        "language", "utts", "words", "WER %", "chars", "CER %"
    );
    let mut row = |name: &str, r: &ErrorRates| {
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
pub fn run(args: &EvalArgs) -> anyhow::Result<ExitCode> {
    // A `.nemo` file or an imported directory evaluates as it is; otherwise a training
    // checkpoint (or output directory).
    let (ckpt, step) = if crate::nemo::is_nemo_source(&args.checkpoint) {
        (args.checkpoint.clone(), None)
    } else {
        let ckpt = checkpoint::resolve(&args.checkpoint)?;
        let step = checkpoint::load_state(&ckpt)?.step;
        (ckpt, Some(step))
    };
    let corpus =
        Corpus::open(&args.corpus).with_context(|| format!("opening {}", args.corpus.display()))?;
    let (limit, batch) = (args.limit, args.batch_seconds);
    if !(batch.is_finite() && batch > 0.0) {
        bail!("--batch-seconds {batch}: expected a positive number of seconds");
    }
    let result = match parse_device(&args.device)? {
        Device::Cpu => crate::eval::evaluate_checkpoint_cpu(&ckpt, &corpus, limit, batch),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => crate::eval::evaluate_checkpoint::<burn::backend::Cuda>(
            &ckpt,
            &corpus,
            limit,
            batch,
            &burn::backend::cuda::CudaDevice::new(n),
        ),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => unreachable!("parse_device refuses cuda:N in a build without cuda"),
        #[cfg(feature = "wgpu")]
        Device::Wgpu => crate::eval::evaluate_checkpoint::<burn::backend::Wgpu>(
            &ckpt,
            &corpus,
            limit,
            batch,
            &burn::backend::wgpu::WgpuDevice::DefaultDevice,
        ),
        #[cfg(not(feature = "wgpu"))]
        Device::Wgpu => unreachable!("parse_device refuses wgpu in a build without wgpu"),
    }
    .with_context(|| format!("evaluating on {}", args.corpus.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        let step = step.map_or("imported".to_owned(), |s| format!("step {s}"));
        print!("checkpoint {} ({step})\n{}", ckpt.display(), table(&result));
    }
    Ok(ExitCode::SUCCESS)
}
