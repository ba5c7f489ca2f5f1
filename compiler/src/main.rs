//! `asrc` command-line entry point: parse, dispatch, map errors to exit codes.

use std::process::ExitCode;

use asr_compiler::cli::{Cli, Command};
use asr_compiler::commands;
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Compile(args) => commands::compile::run(args),
        Command::Validate(args) => commands::validate::run(args),
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Dump(args) => commands::dump::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("asrc: error: {e:#}");
            ExitCode::from(commands::validate::EXIT_ERROR)
        }
    }
}
