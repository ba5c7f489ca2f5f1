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
