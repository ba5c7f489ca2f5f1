//! One module per subcommand; each exposes `run(args) -> anyhow::Result<ExitCode>`.

pub mod eval;
pub mod nemo;
pub mod plan;
pub mod train;
pub mod transcribe;
