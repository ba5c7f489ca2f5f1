//! Writes a synthetic corpus (tones with noise, random token ids, several languages) through the
//! corpus writer: a stand-in input for the reader, the validator and the benchmarks until a
//! compiled corpus is at hand. Deterministic: the same arguments give the same bytes.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use asr_corpus::synth::SynthSpec;
use asr_corpus::{CorpusWriter, WriterOptions};
use clap::Parser;

/// Write a deterministic synthetic corpus.
#[derive(Debug, Parser)]
#[command(after_help = "Example:\n  make-synthetic-corpus out/demo.asrcorpus --utterances 2000")]
struct Args {
    /// Output corpus path (written atomically).
    out: PathBuf,
    /// Number of utterances.
    #[arg(long, default_value_t = 1000)]
    utterances: u64,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Vocabulary size; above 65536 the corpus stores u32 token ids.
    #[arg(long, default_value_t = 1024)]
    vocab: u32,
    /// Utterances per text block.
    #[arg(long, default_value_t = 256)]
    text_block_size: u32,
    /// Comma-separated language codes, most frequent first.
    #[arg(long, default_value = "en,hi,ta,bn,mr,te")]
    languages: String,
    /// Shortest utterance in seconds.
    #[arg(long, default_value_t = 0.5)]
    min_seconds: f64,
    /// Longest utterance in seconds.
    #[arg(long, default_value_t = 8.0)]
    max_seconds: f64,
    /// Most tokens per utterance (each utterance draws a count uniformly in 0..=N).
    #[arg(long, default_value_t = 24)]
    max_tokens: u32,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !(args.min_seconds > 0.0 && args.max_seconds >= args.min_seconds) {
        anyhow::bail!("need 0 < --min-seconds <= --max-seconds");
    }
    let spec = SynthSpec {
        seed: args.seed,
        languages: args.languages.split(',').map(str::to_owned).collect(),
        min_samples: (args.min_seconds * 16_000.0) as u32,
        max_samples: (args.max_seconds * 16_000.0) as u32,
        vocab_size: args.vocab,
        max_tokens: args.max_tokens,
        ..SynthSpec::default()
    };
    let mut opts = WriterOptions::new(args.vocab, "none", Vec::new());
    opts.text_block_size = args.text_block_size;
    opts.compile = serde_json::json!({
        "generator": "make-synthetic-corpus",
        "seed": args.seed,
        "utterances": args.utterances,
    });
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let start = Instant::now();
    let mut w = CorpusWriter::create(&args.out, opts)?;
    for i in 0..args.utterances {
        w.push(&spec.utterance(i).as_input())?;
    }
    let written = w.finish()?;
    eprintln!(
        "wrote {}: {} utterances, {:.2} hours, {} bytes in {:.2} s",
        args.out.display(),
        written.stats.utterances,
        written.stats.hours,
        written.bytes,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
