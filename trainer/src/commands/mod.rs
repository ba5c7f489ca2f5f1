//! One module per subcommand; each exposes `run(args) -> anyhow::Result<ExitCode>`.

pub mod plan;
pub mod train;
