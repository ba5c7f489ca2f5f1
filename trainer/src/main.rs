//! `asrt` command-line entry point: parse, dispatch, map errors to exit codes.

use std::process::ExitCode;

use asr_trainer::Cli;
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    asr_trainer::run_command(&cli).unwrap_or_else(|e| {
        eprintln!("asrt: error: {e:#}");
        ExitCode::from(2)
    })
}
