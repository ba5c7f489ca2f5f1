//! What `asrt plan` does once its options are known: the epoch plan of a training set, as a
//! report (text or JSON) or as one rank's batch list, written to stdout. The command line and
//! the config file are read by the trainer, which hands over a [`PlanRequest`]; nothing here
//! needs the tensor stack.

use std::fmt::Write as _;
use std::io::Write as _;

use crate::report::{report, GroupReport, PlanReport, ReportInput};
use crate::sampler::{EpochPlan, PlanError, SamplerConfig, IDLE};
use crate::set::{DataSpec, SetError, TrainingSet};
use crate::shape::{ShapeError, ShapePolicy};

/// Everything `asrt plan` needs.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// The training set.
    pub data: Vec<DataSpec>,
    /// The sampler.
    pub config: SamplerConfig,
    /// The padding policy the report measures.
    pub shape: ShapePolicy,
    /// Micro-batches per rank and step.
    pub grad_accum: u32,
    /// Ranks.
    pub world_size: u32,
    /// The epoch to plan.
    pub epoch: u64,
    /// What to print.
    pub output: PlanOutput,
}

/// What `asrt plan` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanOutput {
    /// The report, as text.
    Text,
    /// The report, as JSON.
    Json,
    /// One rank's micro-batches, as JSON.
    Batches {
        /// The rank.
        rank: u32,
    },
}

/// Why `asrt plan` failed.
#[derive(Debug, thiserror::Error)]
pub enum PlanCommandError {
    /// The training set cannot be opened or mixed.
    #[error(transparent)]
    Set(#[from] SetError),
    /// The sampler options make no plan.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The padding policy is out of range.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// `--rank` is not one of the ranks.
    #[error("--rank {rank} is outside --world-size {world_size}")]
    Rank {
        /// The rank asked for.
        rank: u32,
        /// Ranks.
        world_size: u32,
    },
    /// Writing the output failed.
    #[error("writing the plan: {0}")]
    Write(#[from] std::io::Error),
    /// The output could not be encoded (a bug).
    #[error("encoding the plan: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Plans the epoch and prints what `req.output` asks for.
pub fn run(req: &PlanRequest) -> Result<(), PlanCommandError> {
    req.shape.validate()?;
    if let PlanOutput::Batches { rank } = req.output {
        if rank >= req.world_size {
            return Err(PlanCommandError::Rank { rank, world_size: req.world_size });
        }
    }
    let set = TrainingSet::open(&req.data)?;
    let mix = set.mix();
    let plan = EpochPlan::build_mixed(
        set.durations(),
        set.languages(),
        &mix,
        &req.config,
        req.epoch,
        req.world_size,
        req.grad_accum,
    )?;

    if let PlanOutput::Batches { rank } = req.output {
        // One corpus: utterance indices; several: [corpus, index] pairs.
        let list: Vec<serde_json::Value> = plan
            .rank_batches(rank, 0)
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
            "epoch": req.epoch,
            "rank": rank,
            "world_size": req.world_size,
            "grad_accum": req.grad_accum,
            "micro_batches": list,
        });
        emit(&(serde_json::to_string(&doc)? + "\n"))?;
        return Ok(());
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
        shape: req.shape,
    };
    let r = report(&plan, &req.config, &input)?;
    if req.output == PlanOutput::Json {
        emit(&(serde_json::to_string_pretty(&r)? + "\n"))?;
    } else {
        emit(&human(&r, &set.corpus_names().join(" + ")))?;
    }
    Ok(())
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
