//! `asrt plan`: the epoch plan of a corpus or training set, as a report or as one rank's batch
//! list.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use crate::cli::PlanArgs;
use crate::config::TrainConfig;
use crate::data::report::{report, GroupReport, PlanReport, ReportInput};
use crate::data::sampler::{EpochPlan, IDLE};
use crate::data::set::{resolve_specs, TrainingSet};

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
    shape.validate()?;
    let set = TrainingSet::open(&resolve_specs(&args.corpus, &data)?)?;
    let mix = set.mix();
    let plan = EpochPlan::build_mixed(
        set.durations(),
        set.languages(),
        &mix,
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
        // One corpus: utterance indices; several: [corpus, index] pairs.
        let list: Vec<serde_json::Value> = plan
            .rank_batches(args.rank, 0)
            .into_iter()
            .map(|b| match (b != IDLE).then(|| plan.batch(b)) {
                None => serde_json::Value::Null,
                Some(items) if set.corpora() == 1 => serde_json::json!(items),
                Some(items) => serde_json::json!(items
                    .iter()
                    .map(|&g| <[u32; 2]>::from(set.locate(g)))
                    .collect::<Vec<_>>()),
            })
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

    let tokens = set.token_counts();
    let input = ReportInput {
        durations: set.durations(),
        languages: set.languages(),
        language_names: set.language_names(),
        mix,
        source_names: set.source_names(),
        corpus_names: set.corpus_names(),
        tokens: Some(&tokens),
        sample_rate: f64::from(set.sample_rate()),
        shape,
    };
    let r = report(&plan, &config, &input)?;
    if args.json {
        emit(&(serde_json::to_string_pretty(&r)? + "\n"))?;
    } else {
        emit(&human(&r, &set.corpus_names().join(" + ")))?;
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

fn human(r: &PlanReport, name: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: epoch {} ({} mode), {} utterances, {:.2} h; world size {}, grad accum {}",
        name, r.epoch, r.mode, r.utterances, r.hours, r.world_size, r.grad_accum
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
    groups(&mut s, "source", &r.sources);
    groups(&mut s, "corpus", &r.corpora);
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

/// A table of sources or corpora (nothing when there are none).
fn groups(s: &mut String, what: &str, rows: &[GroupReport]) {
    if rows.is_empty() {
        return;
    }
    let width = rows.iter().map(|g| g.name.len()).max().unwrap_or(0).max(10);
    let _ = writeln!(
        s,
        "\n  {what:<width$} {:>11} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "utterances", "hours", "corpus", "target", "epoch", "repeats", "unused"
    );
    for g in rows {
        let _ = writeln!(
            s,
            "  {:<width$} {:>11} {:>9.2} {:>7.1}% {:>7.1}% {:>7.1}% {:>8} {:>9}",
            g.name,
            g.utterances,
            g.hours,
            100.0 * g.corpus_share,
            100.0 * g.target_share,
            100.0 * g.epoch_share,
            g.max_repeats,
            g.unused
        );
    }
}
