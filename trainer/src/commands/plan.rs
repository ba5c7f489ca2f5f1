//! `asrt plan`: the epoch plan of a corpus, as a report or as one rank's batch list.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use asr_corpus::Corpus;

use crate::cli::PlanArgs;
use crate::config::TrainConfig;
use crate::data::report::{report, PlanReport, ReportInput};
use crate::data::sampler::{Durations, EpochPlan, IDLE};

/// Runs the command.
pub fn run(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    let corpus = Corpus::open(&args.corpus)
        .with_context(|| format!("opening corpus {}", args.corpus.display()))?;
    let rate = f64::from(corpus.header().sample_rate);
    let durations = Durations::Samples { samples: corpus.num_samples(), rate };
    let s = &args.sampler;
    let (config, shape, grad_accum) = match &args.config {
        Some(p) => {
            let t = TrainConfig::from_file(p)?;
            (t.sampler, t.shape, t.train.grad_accum)
        }
        None => (s.config(), s.shape(), s.grad_accum),
    };
    shape.validate()?;
    let plan = EpochPlan::build(
        durations,
        corpus.languages(),
        &config,
        args.epoch,
        s.world_size,
        grad_accum,
    )?;

    if args.batches {
        anyhow::ensure!(
            args.rank < s.world_size,
            "--rank {} is outside --world-size {}",
            args.rank,
            s.world_size
        );
        let list: Vec<Option<&[u32]>> = plan
            .rank_batches(args.rank, 0)
            .into_iter()
            .map(|b| (b != IDLE).then(|| plan.batch(b)))
            .collect();
        let doc = serde_json::json!({
            "epoch": args.epoch,
            "rank": args.rank,
            "world_size": s.world_size,
            "grad_accum": grad_accum,
            "micro_batches": list,
        });
        emit(&(serde_json::to_string(&doc)? + "\n"))?;
        return Ok(ExitCode::SUCCESS);
    }

    let tokens: Vec<u32> =
        corpus.token_offsets().windows(2).map(|w| (w[1] - w[0]) as u32).collect();
    let input = ReportInput {
        durations,
        languages: corpus.languages(),
        language_names: &corpus.metadata().languages,
        tokens: Some(&tokens),
        sample_rate: rate,
        shape,
    };
    let r = report(&plan, &config, &input);
    if args.json {
        emit(&(serde_json::to_string_pretty(&r)? + "\n"))?;
    } else {
        emit(&human(&r, args))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes to stdout; a closed pipe (`asrt plan ... | head`) is not an error.
fn emit(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

fn human(r: &PlanReport, args: &PlanArgs) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: epoch {} ({} mode), {} utterances, {:.2} h; world size {}, grad accum {}",
        args.corpus.display(),
        r.epoch,
        r.mode,
        r.utterances,
        r.hours,
        r.world_size,
        r.grad_accum
    );
    let _ = writeln!(
        s,
        "  {} batches formed, {} used: {} optimizer steps ({} micro-batches per rank)",
        r.batches_formed,
        r.batches_used,
        r.steps,
        r.steps * u64::from(r.grad_accum)
    );
    let _ = writeln!(
        s,
        "  dropped by truncation and trimming: {} utterances, {:.3} h",
        r.dropped_utterances, r.dropped_hours
    );
    let _ = writeln!(
        s,
        "\n  {:<14} {:>9} {:>11} {:>9} {:>11}",
        "bucket (s)", "batches", "utterances", "hours", "mean size"
    );
    for b in &r.buckets {
        let _ = writeln!(
            s,
            "  {:<14} {:>9} {:>11} {:>9.2} {:>11.1}",
            b.range, b.batches, b.utterances, b.hours, b.mean_batch_size
        );
    }
    let _ = writeln!(
        s,
        "\n  {:<10} {:>11} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "language",
        "utterances",
        "hours",
        "corpus",
        "target",
        "epoch",
        "early",
        "repeats",
        "unused"
    );
    for l in &r.languages {
        let _ = writeln!(
            s,
            "  {:<10} {:>11} {:>9.2} {:>7.1}% {:>7.1}% {:>7.1}% {:>7.1}% {:>8} {:>9}",
            l.language,
            l.utterances,
            l.hours,
            100.0 * l.corpus_share,
            100.0 * l.target_share,
            100.0 * l.epoch_share,
            100.0 * l.early_share,
            l.max_repeats,
            l.unused
        );
    }
    let note = if r.mode == "seed" {
        "seed mode: every utterance is used once per epoch, so temperature changes the order,\n   \
         not the mix (epoch = corpus minus truncation)"
    } else {
        "temperature mode: each language gets its target share of the epoch's draws, small\n   \
         languages upsampled (repeats: uses of the most used utterance), large ones downsampled"
    };
    let _ = writeln!(
        s,
        "  (target: share after temperature; epoch: share of the epoch's utterances, repeats\n   \
         counted; early: share in the first tenth of the steps)\n  ({note})"
    );
    let _ = writeln!(s, "\n  padding: {:.1}% of audio samples", 100.0 * r.audio_padding_fraction);
    if let Some(t) = r.token_padding_fraction {
        let _ = writeln!(s, "           {:.1}% of token slots", 100.0 * t);
    }
    let _ = writeln!(
        s,
        "  rank imbalance per step (max/mean cost): mean {:.3}, worst {:.3} at step {}",
        r.imbalance_mean, r.imbalance_worst, r.imbalance_worst_step
    );
    if let Some(l) = &r.largest_batch {
        let _ = writeln!(
            s,
            "  largest batch: {} utterances, longest {:.2} s, {:.1} s of audio, {} padded samples",
            l.utterances, l.longest_seconds, l.seconds, l.padded_samples
        );
    }
    s
}
