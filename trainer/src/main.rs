//! `asrt` command-line entry point: parse, dispatch, map errors to exit codes.

use std::process::ExitCode;

use asr_trainer::cli::{Cli, Command};
use asr_trainer::commands;
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Plan(args) => commands::plan::run(args),
        Command::Train(args) => commands::train::run(args),
        Command::Eval(args) => commands::train::eval(args),
    };
    result.unwrap_or_else(|e| {
        eprintln!("asrt: error: {e:#}");
        ExitCode::from(2)
    })
}
