//! `asrc` command-line entry point: parse the command line, run the command, exit with its
//! status (the library's [`asr_compiler::run`] maps errors to exit codes).

use std::process::ExitCode;

use asr_compiler::Cli;
use clap::Parser;

fn main() -> ExitCode {
    asr_compiler::run(&Cli::parse())
}
