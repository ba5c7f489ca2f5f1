//! `asrt eval`.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{bail, Context};
use asr_corpus::Corpus;

use crate::cli::EvalArgs;
use crate::device::{dispatch, EvalOn};
use crate::eval::{ErrorRates, Evaluation};
use crate::model_source::ModelSource;

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
    let source = ModelSource::resolve(&args.checkpoint)?;
    let step = source.describe()?.step;
    let corpus =
        Corpus::open(&args.corpus).with_context(|| format!("opening {}", args.corpus.display()))?;
    let (limit, batch_seconds) = (args.limit, args.batch_seconds);
    if !(batch_seconds.is_finite() && batch_seconds > 0.0) {
        bail!("--batch-seconds {batch_seconds}: expected a positive number of seconds");
    }
    let devices = args.device.one()?;
    args.device.prepare(&devices, false)?;
    let result =
        dispatch(&devices, EvalOn { source: &source, corpus: &corpus, limit, batch_seconds })
            .with_context(|| format!("evaluating on {}", args.corpus.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        let step = step.map_or("imported".to_owned(), |s| format!("step {s}"));
        print!("checkpoint {} ({step})\n{}", source.path().display(), table(&result));
    }
    Ok(ExitCode::SUCCESS)
}
