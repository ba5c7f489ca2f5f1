//! One module per subcommand; each exposes `run(args) -> anyhow::Result<ExitCode>`.

pub mod eval;
pub mod nemo;
pub mod plan;
pub mod train;

use anyhow::bail;

/// Where a command runs.
pub(crate) enum Device {
    Cpu,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda(usize),
}

pub(crate) fn parse_device(s: &str) -> anyhow::Result<Device> {
    if s == "cpu" {
        return Ok(Device::Cpu);
    }
    if let Some(n) = s.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
        if cfg!(feature = "cuda") {
            return Ok(Device::Cuda(n));
        }
        bail!("--device {s}: this asrt was built without CUDA (cargo build --features cuda)");
    }
    bail!("--device {s}: expected cpu or cuda:N")
}
