//! Command-line interface of `asrc` (clap derive types only; behaviour is in `commands`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueHint};

/// Compile ASR manifests into indexed, memory-mappable corpora, and check corpora.
#[derive(Debug, Parser)]
#[command(name = "asrc", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check that a corpus file is valid: structure, every checksum, every cross-reference.
    ///
    /// Exit status: 0 when the corpus is valid, 1 when it is not (the message names the section,
    /// the utterance or byte offset, and what was expected), 2 when it cannot be read at all or
    /// the command line is wrong.
    #[command(after_help = "Examples:\n  asrc validate corpus.asrcorpus\n  \
                            asrc validate --json corpus.asrcorpus | jq .report.hours")]
    Validate(ValidateArgs),
    /// Summarise a corpus: hours per language, duration histogram, token statistics.
    #[command(after_help = "Examples:\n  asrc inspect corpus.asrcorpus\n  \
                            asrc inspect --json corpus.asrcorpus | jq .languages")]
    Inspect(InspectArgs),
    /// Print one JSON object per utterance (index, segment id, language, source, text, token
    /// ids, samples); with --pcm-dir also write each utterance's audio as a 16 kHz WAV file.
    #[command(after_help = "Examples:\n  asrc dump corpus.asrcorpus | head\n  \
                            asrc dump corpus.asrcorpus --start 100 --limit 10 --pcm-dir /tmp/pcm")]
    Dump(DumpArgs),
}

/// Arguments of `asrc inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Corpus file.
    #[arg(value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub corpus: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `asrc dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Corpus file.
    #[arg(value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub corpus: PathBuf,
    /// First utterance to print.
    #[arg(long, default_value_t = 0)]
    pub start: usize,
    /// Most utterances to print (all by default).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Also write each printed utterance's audio to DIR/<index>.wav (16 kHz, mono, 16-bit).
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    pub pcm_dir: Option<PathBuf>,
}

/// Arguments of `asrc validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Corpus file to check.
    #[arg(value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub corpus: PathBuf,
    /// Print one JSON object (valid, error, report) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Only apply the structural checks done when a corpus is opened (header, section table,
    /// offsets, metadata): milliseconds instead of one full read of the file.
    #[arg(long)]
    pub structure_only: bool,
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
