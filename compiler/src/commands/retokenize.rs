//! `asrc retokenize`: a corpus with new token ids, its audio copied as it is.

use std::process::ExitCode;
use std::time::Instant;

use crate::cli::RetokenizeArgs;
use crate::retokenize::{retokenize, RetokenizeOptions};

/// Runs `asrc retokenize`.
pub fn run(args: &RetokenizeArgs) -> anyhow::Result<ExitCode> {
    let t = Instant::now();
    let s = retokenize(&RetokenizeOptions {
        input: args.corpus.clone(),
        tokenizer: args.tokenizer.clone(),
        output: args.output.clone(),
        lang_prefix: args.lang_prefix,
        max_tokens: args.max_tokens,
    })?;
    for (i, segment, why) in &s.dropped {
        eprintln!("asrc: left out utterance {i} ({segment}): {why}");
    }
    println!(
        "wrote {} ({:.1} MB) in {:.2} s",
        args.output.display(),
        s.bytes as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    println!(
        "utterances {}: kept {}, left out {} (the new model cannot tokenize them); \
         with <|lang|> prefix {}; token sequences truncated {}",
        s.utterances,
        s.kept,
        s.dropped.len(),
        s.prefixed,
        s.truncated
    );
    Ok(ExitCode::SUCCESS)
}
