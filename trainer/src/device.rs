//! Devices as the command line names them, and the one place a Burn backend is chosen.
//!
//! `--device cpu|cuda:N|wgpu` and `--devices LIST` are parsed by clap through [`DeviceArgs`]
//! into [`Devices`]: one kind of device, at least one, no CUDA ordinal twice (two ranks on one
//! GPU would wait for each other in NCCL). A kind this build lacks is refused while parsing, so
//! nothing later needs an `unreachable!`: the variants themselves exist only in builds that
//! can run them.
//!
//! Work that is generic over the backend implements [`OnBackend`]; [`dispatch`] calls its one
//! generic method with the backend the devices name (Burn's `examples/mnist` pattern: one arm
//! per backend, each gated on its feature, all calling the same generic code). The work this
//! crate runs is here too: a training run ([`RunOn`]) and an evaluation ([`EvalOn`]), with the
//! CPU entry points the library offers (`run_cpu`, `run_cpu_ranks`, `evaluate_model_cpu`,
//! instantiated in this optimised crate). This module sits above `train` and `eval`: they never
//! choose a backend.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use asr_corpus::Corpus;
use burn::tensor::backend::AutodiffBackend;

use crate::config::TrainConfig;
use crate::cuda_env::CudaEnvError;
use crate::eval::{evaluate_source, EvalError, Evaluation};
use crate::kernel_cache::{KernelCache, KernelCacheError};
use crate::model::precision::{Precision, PrecisionError};
use crate::model_source::{Expected, ModelSource, TokenizerId};
use crate::tokenizer::Pieces;
use crate::train::metrics::StepMetrics;
use crate::train::parallel::DeviceAllReduce;
use crate::train::run::{run_ranks, ProcessGroup, RunOptions, RunSummary};
use crate::train::TrainError;
use crate::transcribe::{transcribe, Item, TranscribeError, TranscribeOptions, Transcript};
use asr_tdt::op::TdtBackend;

/// One device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The CPU (Burn's NdArray backend).
    Cpu,
    /// The CPU through burn-flex, the CPU backend that computes in bfloat16 and float16
    /// (mixed precision; slower than NdArray in f32: bench/RESULTS.md).
    Flex,
    /// CUDA device `N`.
    #[cfg(feature = "cuda")]
    Cuda(usize),
    /// wgpu's default adapter (a GPU through Vulkan, Metal or DX12; Mesa's software Vulkan
    /// driver without one).
    #[cfg(feature = "wgpu")]
    Wgpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Flex => f.write_str("flex"),
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            #[cfg(feature = "wgpu")]
            Device::Wgpu => f.write_str("wgpu"),
        }
    }
}

/// Why a device list cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// Not a device name.
    #[error("{0:?}: expected cpu, flex, cuda:N or wgpu")]
    Unknown(String),
    /// A kind of device this build cannot run.
    #[error("{given}: this asrt was built without {feature} (cargo build --features {feature})")]
    NotBuilt {
        /// The name given.
        given: String,
        /// The cargo feature that adds it.
        feature: &'static str,
    },
    /// An empty list.
    #[error("no device given")]
    Empty,
    /// Devices of different kinds in one list.
    #[error("{0}: one kind of device per run (all cpu, all flex, all cuda:N or all wgpu)")]
    Mixed(String),
    /// One CUDA device listed twice.
    #[error("cuda:{0} is listed twice: one rank per GPU (two would wait for each other in NCCL)")]
    DuplicateCuda(usize),
    /// A command that runs on one device was given several.
    #[error("{0} devices given: this command runs on one")]
    NotOne(usize),
}

impl FromStr for Device {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Device, DeviceError> {
        let s = s.trim();
        if s == "cpu" {
            return Ok(Device::Cpu);
        }
        if s == "flex" {
            return Ok(Device::Flex);
        }
        if let Some(n) = s.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            #[cfg(feature = "cuda")]
            return Ok(Device::Cuda(n));
            #[cfg(not(feature = "cuda"))]
            {
                let _ = n;
                return Err(DeviceError::NotBuilt { given: s.to_owned(), feature: "cuda" });
            }
        }
        if s == "wgpu" {
            #[cfg(feature = "wgpu")]
            return Ok(Device::Wgpu);
            #[cfg(not(feature = "wgpu"))]
            return Err(DeviceError::NotBuilt { given: s.to_owned(), feature: "wgpu" });
        }
        Err(DeviceError::Unknown(s.to_owned()))
    }
}

/// Whether a GPU run goes through Burn's fusion backend (`Fusion<CubeBackend>`), which queues
/// tensor operations and merges element-wise, reduction and matmul-epilogue chains into single
/// kernels. On by default; `off` runs each operation as its own kernel (for comparison, or
/// around a fusion bug). The CPU backends have no fusion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Fusion {
    /// Fused kernels.
    #[default]
    On,
    /// One kernel per operation.
    Off,
}

/// The devices of one run: at least one, all of one kind, no CUDA device twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    /// `n` ranks on the CPU.
    Cpu(usize),
    /// `n` ranks on the CPU through burn-flex.
    Flex(usize),
    /// One rank per listed CUDA device.
    #[cfg(feature = "cuda")]
    Cuda(Vec<usize>, Fusion),
    /// `n` ranks on wgpu's default adapter.
    #[cfg(feature = "wgpu")]
    Wgpu(usize, Fusion),
}

impl Devices {
    /// Checks a list of devices.
    pub fn new(list: &[Device]) -> Result<Devices, DeviceError> {
        let first = *list.first().ok_or(DeviceError::Empty)?;
        let names = || list.iter().map(Device::to_string).collect::<Vec<_>>().join(",");
        if list.iter().any(|d| std::mem::discriminant(d) != std::mem::discriminant(&first)) {
            return Err(DeviceError::Mixed(names()));
        }
        Ok(match first {
            Device::Cpu => Devices::Cpu(list.len()),
            Device::Flex => Devices::Flex(list.len()),
            #[cfg(feature = "wgpu")]
            Device::Wgpu => Devices::Wgpu(list.len(), Fusion::On),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => {
                let mut ordinals = Vec::with_capacity(list.len());
                for d in list {
                    if let Device::Cuda(n) = *d {
                        if ordinals.contains(&n) {
                            return Err(DeviceError::DuplicateCuda(n));
                        }
                        ordinals.push(n);
                    }
                }
                Devices::Cuda(ordinals, Fusion::On)
            }
        })
    }

    /// These devices with fusion `f` (the CPU backends have none: unchanged).
    #[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(unused_variables))]
    pub fn with_fusion(self, f: Fusion) -> Devices {
        match self {
            #[cfg(feature = "cuda")]
            Devices::Cuda(v, _) => Devices::Cuda(v, f),
            #[cfg(feature = "wgpu")]
            Devices::Wgpu(n, _) => Devices::Wgpu(n, f),
            other => other,
        }
    }

    /// Whether these devices run the trainer's CubeCL kernels (cuda, wgpu), where `--matmul`
    /// picks the linear layers' kernel; the CPU backends have their own products.
    pub fn on_cubecl(&self) -> bool {
        !matches!(self, Devices::Cpu(_) | Devices::Flex(_))
    }

    /// The matmul kernel these devices' linear layers use unless `--matmul` names one:
    /// cuBLAS on CUDA, where it is the fastest (on an H200, 0.23 ms over the 0.6B preset's five
    /// product cases against Burn's 1.39 ms, and the step 0.205 s against 0.290 s in the same
    /// call; bench/RESULTS.md, 2026-11-30 evening), and falls back to Burn's product, with a
    /// warning, where cuBLAS does not load; Burn's product elsewhere.
    pub fn default_matmul(&self) -> crate::model::matmul_kernel::Kernel {
        use crate::model::matmul_kernel::Kernel;
        match self {
            #[cfg(feature = "cuda")]
            Devices::Cuda(..) => Kernel::Cublas,
            _ => Kernel::Burn,
        }
    }

    /// Ranks in this process.
    pub fn len(&self) -> usize {
        match self {
            Devices::Cpu(n) | Devices::Flex(n) => *n,
            #[cfg(feature = "cuda")]
            Devices::Cuda(v, _) => v.len(),
            #[cfg(feature = "wgpu")]
            Devices::Wgpu(n, _) => *n,
        }
    }

    /// The first device (its `Display` is the command line's name).
    pub fn first(&self) -> Device {
        match self {
            Devices::Cpu(_) => Device::Cpu,
            Devices::Flex(_) => Device::Flex,
            #[cfg(feature = "cuda")]
            Devices::Cuda(v, _) => Device::Cuda(v.first().copied().unwrap_or(0)),
            #[cfg(feature = "wgpu")]
            Devices::Wgpu(..) => Device::Wgpu,
        }
    }

    /// Never true: a list holds at least one device.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks what these devices need from this machine and sets up `cache`, before
    /// [`dispatch`] runs anything on them. `processes`: this process is one of several, whose
    /// ranks sum gradients (as several devices of one process do). A CUDA run that needs NCCL
    /// and finds only `libnccl.so.2` runs this program again (see `cuda_env`), with the
    /// `libnccl.so` link in the cache's `nccl/` folder (a temporary folder when the cache is off).
    // Builds without a GPU backend have nothing to prepare.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub fn prepare(&self, cache: &KernelCache, processes: bool) -> Result<(), SetupError> {
        match self {
            Devices::Cpu(_) | Devices::Flex(_) => {}
            #[cfg(feature = "wgpu")]
            Devices::Wgpu(..) => cache.install()?,
            #[cfg(feature = "cuda")]
            Devices::Cuda(ordinals, _) => {
                let link_dir = match cache.dir() {
                    Some(d) => d.join("nccl"),
                    None => std::env::temp_dir().join("asrt-nccl"),
                };
                crate::cuda_env::prepare(ordinals, ordinals.len() > 1 || processes, &link_dir)?;
                cache.install()?;
            }
        }
        Ok(())
    }
}

impl From<Device> for Devices {
    fn from(d: Device) -> Devices {
        match d {
            Device::Cpu => Devices::Cpu(1),
            Device::Flex => Devices::Flex(1),
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => Devices::Cuda(vec![n], Fusion::On),
            #[cfg(feature = "wgpu")]
            Device::Wgpu => Devices::Wgpu(1, Fusion::On),
        }
    }
}

impl FromStr for Devices {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Devices, DeviceError> {
        let list = s.split(',').map(str::parse).collect::<Result<Vec<Device>, _>>()?;
        Devices::new(&list)
    }
}

/// `--device` and `--devices`, shared by the commands that run a model.
#[derive(Debug, Clone, clap::Args)]
pub struct DeviceArgs {
    /// `cpu` (NdArray, the faster in f32), `flex` (the CPU through burn-flex, which also runs
    /// bf16-mixed and f16-mixed), `cuda:N` (needs a build with --features cuda) or `wgpu` (the
    /// default adapter: a GPU through Vulkan, Metal or DX12, or Mesa's software Vulkan driver).
    #[arg(long, default_value = "cpu", conflicts_with = "devices")]
    pub device: Device,
    /// Data-parallel: one rank per listed device of this process (`cpu,cpu` or
    /// `cuda:0,cuda:1,...`: one kind per run, no CUDA device twice); with RANK/WORLD_SIZE (or
    /// SLURM_PROCID/SLURM_NTASKS) and MASTER_ADDR/MASTER_PORT set, this process is one of
    /// several (one per node).
    #[arg(long, value_name = "LIST")]
    pub devices: Option<Devices>,
    /// Where CubeCL keeps compiled CUDA kernels (PTX) and autotune results between runs (wgpu
    /// and CUDA): `off`, or a directory. Default: $ASRT_KERNEL_CACHE, else
    /// $XDG_CACHE_HOME/asrt/kernels, else ~/.cache/asrt/kernels.
    #[arg(long, value_name = "DIR")]
    pub kernel_cache: Option<PathBuf>,
    /// On cuda and wgpu: `on` runs through Burn's fusion backend, which merges chains of
    /// element-wise operations (and reductions, and matmul epilogues) into single kernels;
    /// `off` launches one kernel per operation. Results agree within rounding either way.
    #[arg(long, value_enum, default_value = "on")]
    pub fusion: Fusion,
    /// On cuda and wgpu: the matmul kernel of the linear layers' products and their gradients
    /// (in the mixed precisions, on the operands rounded to the half type). `cublas` is
    /// NVIDIA's library (TF32 tensor cores for f32), called on CubeCL's stream; `burn` is
    /// Burn's own (under fusion cubek's simple cyclic CMMA); the others are cubek's strategies
    /// by name (`asrt-bench matmul --device cuda:0` times each at the 0.6B preset's shapes;
    /// with `--operands bf16` as bf16-mixed runs them). A kernel the device cannot run falls
    /// back to Burn's, with a warning. Default: `cublas` on cuda, `burn` elsewhere.
    #[arg(long, value_enum)]
    pub matmul: Option<crate::model::matmul_kernel::Kernel>,
}

/// Why the devices cannot be used on this machine.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Something a CUDA run needs is missing.
    #[error(transparent)]
    Cuda(#[from] CudaEnvError),
    /// The kernel cache cannot be set up.
    #[error(transparent)]
    Cache(#[from] KernelCacheError),
}

impl DeviceArgs {
    /// The devices given.
    pub fn devices(&self) -> Devices {
        match &self.devices {
            Some(d) => d.clone(),
            None => Devices::from(self.device),
        }
        .with_fusion(self.fusion)
    }

    /// The kernel cache the flag and the environment name.
    pub fn kernel_cache(&self) -> KernelCache {
        KernelCache::resolve(self.kernel_cache.as_deref(), &|k| std::env::var(k).ok())
    }

    /// [`Devices::prepare`] with the kernel cache the flag and the environment name, and the
    /// matmul kernel chosen for this process (with a warning where it changes nothing).
    pub fn prepare(&self, devices: &Devices, processes: bool) -> Result<(), SetupError> {
        crate::model::matmul_kernel::choose(self.matmul_on(devices));
        if let Some(warning) = self.matmul_unused(devices) {
            eprintln!("warning: {warning}");
        }
        devices.prepare(&self.kernel_cache(), processes)
    }

    /// Why `--matmul` changes nothing for a run on `devices`, where it does not: the CPU
    /// backends use their own products. (In the mixed precisions it runs the linear layers'
    /// products on the half type's operands, `device_mixed`.)
    pub fn matmul_unused(&self, devices: &Devices) -> Option<String> {
        let chosen = self.matmul?;
        let kernel = chosen.name();
        if chosen == crate::model::matmul_kernel::Kernel::Burn || devices.on_cubecl() {
            None
        } else {
            Some(format!(
                "--matmul {kernel} applies on cuda and wgpu; the CPU backends use their own \
                 products"
            ))
        }
    }

    /// The matmul kernel a run on `devices` uses: `--matmul`'s, else the devices' default
    /// ([`Devices::default_matmul`]).
    pub fn matmul_on(&self, devices: &Devices) -> crate::model::matmul_kernel::Kernel {
        self.matmul.unwrap_or_else(|| devices.default_matmul())
    }

    /// The one device of a command that runs on one.
    pub fn one(&self) -> Result<Devices, DeviceError> {
        let d = self.devices();
        if d.len() != 1 {
            return Err(DeviceError::NotOne(d.len()));
        }
        Ok(d)
    }
}

/// Burn's CUDA backend through its fusion backend (`burn::backend::Cuda` is the unfused
/// CubeCL backend in this build: Burn's own `fusion` feature, which would make that alias fused
/// everywhere, is off, so both can be chosen at run time).
#[cfg(feature = "cuda")]
pub type FusedCuda = burn_fusion::Fusion<burn::backend::Cuda>;

/// Burn's wgpu backend through its fusion backend (see [`FusedCuda`]).
#[cfg(feature = "wgpu")]
pub type FusedWgpu = burn_fusion::Fusion<burn::backend::Wgpu>;

/// Work that runs on whichever backend the devices name.
pub trait OnBackend {
    /// What the work returns.
    type Output;

    /// Runs the work with one Burn device per rank of this process.
    fn run<B>(self, devices: Vec<B::Device>) -> Self::Output
    where
        B: AutodiffBackend + TdtBackend,
        B::InnerBackend: DeviceAllReduce;
}

/// Runs `work` on the backend `devices` name (fused or not on a GPU): the only place a backend
/// type is chosen.
pub fn dispatch<W: OnBackend>(devices: &Devices, work: W) -> W::Output {
    use burn::backend::Autodiff;
    match devices {
        Devices::Cpu(n) => {
            work.run::<Autodiff<burn::backend::NdArray>>(vec![Default::default(); *n])
        }
        Devices::Flex(n) => work.run::<Autodiff<burn::backend::Flex>>(vec![Default::default(); *n]),
        #[cfg(feature = "cuda")]
        Devices::Cuda(ordinals, fusion) => {
            let devices =
                ordinals.iter().map(|&n| burn::backend::cuda::CudaDevice::new(n)).collect();
            match fusion {
                Fusion::On => work.run::<Autodiff<FusedCuda>>(devices),
                Fusion::Off => work.run::<Autodiff<burn::backend::Cuda>>(devices),
            }
        }
        #[cfg(feature = "wgpu")]
        Devices::Wgpu(n, fusion) => {
            let devices = vec![burn::backend::wgpu::WgpuDevice::DefaultDevice; *n];
            match fusion {
                Fusion::On => work.run::<Autodiff<FusedWgpu>>(devices),
                Fusion::Off => work.run::<Autodiff<burn::backend::Wgpu>>(devices),
            }
        }
    }
}

// The work this crate runs, and its CPU entry points for library users and tests (instantiated
// in this optimised crate).

/// Whether the first of `devices` computes in `precision`'s type (`Backend::supports_dtype`),
/// asked before a run builds anything: the error names the device as the command line does.
pub fn check_precision(devices: &Devices, precision: Precision) -> Result<(), PrecisionError> {
    struct Check {
        precision: Precision,
        name: String,
    }
    impl OnBackend for Check {
        type Output = Result<(), PrecisionError>;

        fn run<B>(self, devices: Vec<B::Device>) -> Self::Output
        where
            B: AutodiffBackend + TdtBackend,
            B::InnerBackend: DeviceAllReduce,
        {
            match devices.first() {
                Some(d) => self.precision.check::<B>(d, &self.name),
                None => Ok(()),
            }
        }
    }
    if precision.compute().is_none() {
        // f32 runs everywhere; asking would start a GPU client for nothing.
        return Ok(());
    }
    let name = devices.first().to_string();
    dispatch(devices, Check { precision, name })
}

/// A run as work for [`dispatch`]: [`run_ranks`] on whichever backend the devices name.
pub struct RunOn<'a> {
    /// The configuration.
    pub cfg: TrainConfig,
    /// The run's options.
    pub opts: &'a RunOptions,
    /// The other processes, if any.
    pub processes: Option<ProcessGroup>,
    /// Called after every step on this process's first rank.
    pub on_step: &'a mut dyn FnMut(&StepMetrics, u64),
}

impl OnBackend for RunOn<'_> {
    type Output = Result<RunSummary, TrainError>;

    fn run<B>(self, devices: Vec<B::Device>) -> Self::Output
    where
        B: AutodiffBackend + TdtBackend,
        B::InnerBackend: DeviceAllReduce,
    {
        run_ranks::<B>(self.cfg, self.opts, devices, self.processes, self.on_step)
    }
}

/// [`crate::train::run::run`] on the CPU backend.
pub fn run_cpu(
    cfg: TrainConfig,
    opts: &RunOptions,
    on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> Result<RunSummary, TrainError> {
    run_cpu_ranks(cfg, opts, 1, None, on_step)
}

/// [`run_ranks`] on the CPU backend: `ranks` ranks in this process (threads), times the
/// processes of `processes`.
pub fn run_cpu_ranks(
    cfg: TrainConfig,
    opts: &RunOptions,
    ranks: usize,
    processes: Option<ProcessGroup>,
    on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> Result<RunSummary, TrainError> {
    dispatch(&Devices::Cpu(ranks), RunOn { cfg, opts, processes, on_step })
}

/// An evaluation as work for [`dispatch`]: [`evaluate_source`] on the first device.
pub struct EvalOn<'a> {
    /// The model.
    pub source: &'a ModelSource,
    /// The corpus to decode.
    pub corpus: &'a Corpus,
    /// Decode only the first `limit` utterances.
    pub limit: Option<usize>,
    /// Audio seconds per decoding batch.
    pub batch_seconds: f64,
}

impl OnBackend for EvalOn<'_> {
    type Output = Result<Evaluation, EvalError>;

    fn run<B>(self, devices: Vec<B::Device>) -> Self::Output
    where
        B: AutodiffBackend + TdtBackend,
        B::InnerBackend: DeviceAllReduce,
    {
        // Decoding needs no gradients: the inner backend, on the same device.
        let device = devices.into_iter().next().ok_or(EvalError::NoDevice)?;
        evaluate_source::<B::InnerBackend>(
            self.source,
            self.corpus,
            self.limit,
            self.batch_seconds,
            &device,
        )
    }
}

/// Transcription with the model of `source` ([`transcribe`]): the model loaded on the device,
/// the tokenizer (given, or the model's own) checked against the model's by hash and size.
pub struct TranscribeOn<'a> {
    /// The model.
    pub source: &'a ModelSource,
    /// The tokenizer, when the model does not carry one (a checkpoint) or another is given.
    pub tokenizer: Option<&'a [u8]>,
    /// What to transcribe.
    pub items: &'a [Item],
    /// The corpora the items name.
    pub corpora: &'a [Corpus],
    /// Batching and limits.
    pub opts: TranscribeOptions,
    /// Called with each transcript, in input order.
    pub emit: &'a mut dyn FnMut(Transcript),
}

impl OnBackend for TranscribeOn<'_> {
    type Output = Result<(), TranscribeError>;

    fn run<B>(self, devices: Vec<B::Device>) -> Self::Output
    where
        B: AutodiffBackend + TdtBackend,
        B::InnerBackend: DeviceAllReduce,
    {
        let device = devices.into_iter().next().ok_or(EvalError::NoDevice)?;
        let loaded = self.source.load::<B::InnerBackend>(None, false, &device)?;
        let tokenizer = match (self.tokenizer, loaded.tokenizer_model) {
            (Some(t), _) => t.to_vec(),
            (None, Some(t)) => t,
            (None, None) => return Err(TranscribeError::NoTokenizer),
        };
        let pieces = Pieces::parse(&tokenizer)?;
        let id = TokenizerId { xxh3: crate::nemo::tokenizer_hash(&tokenizer), vocab: pieces.len() };
        self.source.check_tokenizer(&loaded.info, &id, Expected::Given)?;
        transcribe(
            &loaded.model,
            &loaded.info.model,
            &pieces,
            self.items,
            self.corpora,
            &self.opts,
            &device,
            self.emit,
        )
    }
}

/// [`evaluate_source`] of the model at `path` ([`ModelSource::resolve`]) on the CPU backend.
pub fn evaluate_model_cpu(
    path: &Path,
    corpus: &Corpus,
    limit: Option<usize>,
    batch_seconds: f64,
) -> Result<Evaluation, EvalError> {
    let source = ModelSource::resolve(path)?;
    dispatch(&Devices::Cpu(1), EvalOn { source: &source, corpus, limit, batch_seconds })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device flags of a command line `asrt ARGS...`.
    fn args(a: &[&str]) -> DeviceArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            device: DeviceArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from([&["asrt"], a].concat());
        cli.expect("the arguments parse").device
    }

    /// `--matmul` other than `burn` warns where it changes nothing: on the CPU backends.
    #[test]
    fn matmul_warns_where_it_changes_nothing() {
        let wgpu = Devices::Wgpu(1, Fusion::Off);
        let unit = args(&["--matmul", "simple-unit"]);
        assert_eq!(unit.matmul_unused(&wgpu), None);
        assert_eq!(
            unit.matmul_unused(&Devices::Cpu(1)).as_deref(),
            Some("--matmul simple-unit applies on cuda and wgpu; the CPU backends use their own products")
        );
        let default = args(&[]);
        assert_eq!(default.matmul_unused(&Devices::Cpu(1)), None);
        assert_eq!(default.matmul_unused(&wgpu), None);
        let burn = args(&["--matmul", "burn"]);
        assert_eq!(burn.matmul_unused(&Devices::Cpu(1)), None);
    }

    /// Without `--matmul` a CUDA run takes cuBLAS's product and every other run Burn's; a
    /// kernel named is taken on every device.
    #[test]
    fn matmul_defaults_to_cublas_on_cuda_only() {
        use crate::model::matmul_kernel::Kernel;
        let default = args(&[]);
        let unit = args(&["--matmul", "simple-unit"]);
        for devices in [Devices::Cpu(1), Devices::Flex(2), Devices::Wgpu(1, Fusion::On)] {
            assert_eq!(default.matmul_on(&devices), Kernel::Burn, "{devices:?}");
            assert_eq!(unit.matmul_on(&devices), Kernel::SimpleUnit, "{devices:?}");
        }
        #[cfg(feature = "cuda")]
        {
            let cuda = Devices::Cuda(vec![0], Fusion::On);
            assert_eq!(default.matmul_on(&cuda), Kernel::Cublas);
            assert_eq!(args(&["--matmul", "burn"]).matmul_on(&cuda), Kernel::Burn);
        }
    }

    #[test]
    fn device_lists_are_checked_while_parsing() {
        assert_eq!("cpu".parse::<Devices>(), Ok(Devices::Cpu(1)));
        assert!(!Devices::Cpu(1).on_cubecl() && !Devices::Flex(2).on_cubecl());
        #[cfg(feature = "wgpu")]
        assert!(Devices::Wgpu(1, Fusion::Off).on_cubecl());
        assert_eq!("cpu, cpu".parse::<Devices>(), Ok(Devices::Cpu(2)));
        assert_eq!("".parse::<Devices>(), Err(DeviceError::Unknown(String::new())));
        assert_eq!("tpu:0".parse::<Device>(), Err(DeviceError::Unknown("tpu:0".into())));
        assert_eq!("cuda:x".parse::<Device>(), Err(DeviceError::Unknown("cuda:x".into())));
        #[cfg(not(feature = "cuda"))]
        assert_eq!(
            "cuda:0".parse::<Device>(),
            Err(DeviceError::NotBuilt { given: "cuda:0".into(), feature: "cuda" })
        );
        #[cfg(feature = "cuda")]
        {
            assert_eq!(
                "cuda:0,cuda:1".parse::<Devices>(),
                Ok(Devices::Cuda(vec![0, 1], Fusion::On))
            );
            assert_eq!("cuda:0,cuda:0".parse::<Devices>(), Err(DeviceError::DuplicateCuda(0)));
            assert!(matches!("cpu,cuda:0".parse::<Devices>(), Err(DeviceError::Mixed(_))));
        }
        #[cfg(feature = "wgpu")]
        {
            assert_eq!("wgpu,wgpu".parse::<Devices>(), Ok(Devices::Wgpu(2, Fusion::On)));
            assert_eq!(
                Devices::Wgpu(2, Fusion::On).with_fusion(Fusion::Off),
                Devices::Wgpu(2, Fusion::Off)
            );
            assert_eq!("cpu,wgpu".parse::<Devices>(), Err(DeviceError::Mixed("cpu,wgpu".into())));
        }
    }
}
