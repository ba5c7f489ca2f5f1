//! One module per subcommand; each exposes `run(args) -> anyhow::Result<ExitCode>`.

pub mod compile;
pub mod dump;
pub mod inspect;
pub mod merge;
pub mod probe;
pub mod retokenize;
pub mod validate;

use std::path::Path;
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
        Command::Retokenize(args) => retokenize::run(args),
        Command::Probe(args) => probe::run(args),
        Command::Merge(args) => merge::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("asrc: error: {}", message(&e));
            ExitCode::from(validate::EXIT_ERROR)
        }
    }
}

/// An error and its causes, `: `-separated, each said once. Many errors (the corpus writer's,
/// the manifest reader's, the report's) include their source's message in their own and also
/// expose the source, which `{:#}` would print twice; a cause whose message is already there
/// is left out.
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Adds "`action` `path`" in front of an error that does not name `path` already, so that a
/// message names its file once.
pub(crate) fn about_path<T, E>(result: Result<T, E>, action: &str, path: &Path) -> anyhow::Result<T>
where
    E: Into<anyhow::Error>,
{
    result.map_err(|e| {
        let e = e.into();
        let shown = path.display().to_string();
        if message(&e).contains(&shown) {
            e
        } else {
            e.context(format!("{action} {shown}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("writing {path}: {source}")]
    struct Wrapping {
        path: String,
        source: std::io::Error,
    }

    fn wrapping(path: &str) -> Wrapping {
        let source = std::io::Error::new(std::io::ErrorKind::NotFound, "gone at path \"/x/.tmp\"");
        Wrapping { path: path.into(), source }
    }

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let e = anyhow::Error::new(wrapping("out/c")).context("compiling out/c.x");
        assert_eq!(message(&e), "compiling out/c.x: writing out/c: gone at path \"/x/.tmp\"");
        let plain = anyhow::Error::new(std::io::Error::other("disk full")).context("writing a");
        assert_eq!(message(&plain), "writing a: disk full");
    }

    #[test]
    fn a_path_the_error_names_is_not_added_again() {
        let named: Result<(), Wrapping> = Err(wrapping("out/c.x"));
        let e = about_path(named, "compiling", Path::new("out/c.x")).unwrap_err();
        assert_eq!(message(&e), "writing out/c.x: gone at path \"/x/.tmp\"");
        let other: Result<(), Wrapping> = Err(wrapping("elsewhere"));
        let e = about_path(other, "compiling", Path::new("out/c.x")).unwrap_err();
        assert_eq!(message(&e), "compiling out/c.x: writing elsewhere: gone at path \"/x/.tmp\"");
    }
}
