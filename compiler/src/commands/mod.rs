//! One module per subcommand; each exposes `run(args) -> anyhow::Result<ExitCode>`.

pub mod compile;
pub mod dump;
pub mod inspect;
pub mod validate;

use std::process::ExitCode;

use crate::cli::{Cli, Command};

/// Runs the command `cli` names and returns its exit status. An error is printed to stderr
/// (`asrc: error: ...`) and exits with status 2.
pub fn run(cli: &Cli) -> ExitCode {
    let result = match &cli.command {
        Command::Compile(args) => compile::run(args),
        Command::Validate(args) => validate::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Dump(args) => dump::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("asrc: error: {e:#}");
            ExitCode::from(validate::EXIT_ERROR)
        }
    }
}
