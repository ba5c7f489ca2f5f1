//! One module per subcommand; each exposes `run(args) -> anyhow::Result<ExitCode>`.

pub mod compile;
pub mod dump;
pub mod inspect;
pub mod validate;
