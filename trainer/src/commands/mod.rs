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
    /// wgpu's default adapter (a GPU through Vulkan, Metal or DX12; Mesa's software Vulkan
    /// driver without one).
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    Wgpu,
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
    if s == "wgpu" {
        if cfg!(feature = "wgpu") {
            return Ok(Device::Wgpu);
        }
        bail!("--device {s}: this asrt was built without wgpu (cargo build --features wgpu)");
    }
    bail!("--device {s}: expected cpu, cuda:N or wgpu")
}
