//! `asrt train`.

use std::io::IsTerminal;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{parse_device, Device};
use crate::cli::TrainArgs;
use crate::config::TrainConfig;
use crate::train::metrics::StepMetrics;
use crate::train::run::{ProcessGroup, RunOptions};

fn load_config(args: &TrainArgs) -> anyhow::Result<TrainConfig> {
    let mut cfg = match &args.config {
        Some(p) => TrainConfig::from_file(p)?,
        None => TrainConfig::default(),
    };
    if let Some(n) = args.max_steps {
        cfg.train.max_steps = n;
    }
    if let Some(init) = &args.init {
        // The model is the initial model's; the loss keeps the run's options but its durations.
        let info = crate::nemo::describe(init)?;
        if !args.quiet {
            eprintln!(
                "asrt: model from {}: {} layers, d_model {}, {} heads, vocabulary {}, durations {:?}",
                init.display(),
                info.model.encoder.n_layers,
                info.model.encoder.d_model,
                info.model.encoder.n_heads,
                info.vocab,
                info.model.durations
            );
        }
        cfg.loss.durations = info.model.durations.clone();
        cfg.model = info.model;
    }
    cfg.validate()?;
    Ok(cfg)
}

/// CUDA devices of this process, one rank each, and of the other processes when there are
/// (gradients summed with NCCL: on the devices within a process, staged through the host
/// between processes).
#[cfg(feature = "cuda")]
fn run_cuda(
    cfg: TrainConfig,
    opts: &RunOptions,
    devices: &[Device],
    processes: Option<ProcessGroup>,
    on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> anyhow::Result<crate::train::run::RunSummary> {
    let devices = devices
        .iter()
        .map(|d| match d {
            Device::Cuda(n) => Ok(burn::backend::cuda::CudaDevice::new(*n)),
            Device::Cpu | Device::Wgpu => Err(anyhow::anyhow!("CUDA devices expected")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(crate::train::run::run_ranks::<burn::backend::Autodiff<burn::backend::Cuda>>(
        cfg, opts, devices, processes, on_step,
    )?)
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(
    _cfg: TrainConfig,
    _opts: &RunOptions,
    _devices: &[Device],
    _processes: Option<ProcessGroup>,
    _on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> anyhow::Result<crate::train::run::RunSummary> {
    anyhow::bail!("this asrt was built without CUDA (parse_device refuses cuda:N)")
}

/// wgpu's default adapter, once per rank (`--devices wgpu,wgpu` runs two ranks on it).
#[cfg(feature = "wgpu")]
fn run_wgpu(
    cfg: TrainConfig,
    opts: &RunOptions,
    ranks: usize,
    processes: Option<ProcessGroup>,
    on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> anyhow::Result<crate::train::run::RunSummary> {
    let devices = vec![burn::backend::wgpu::WgpuDevice::DefaultDevice; ranks];
    Ok(crate::train::run::run_ranks::<burn::backend::Autodiff<burn::backend::Wgpu>>(
        cfg, opts, devices, processes, on_step,
    )?)
}

#[cfg(not(feature = "wgpu"))]
fn run_wgpu(
    _cfg: TrainConfig,
    _opts: &RunOptions,
    _ranks: usize,
    _processes: Option<ProcessGroup>,
    _on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> anyhow::Result<crate::train::run::RunSummary> {
    anyhow::bail!("this asrt was built without wgpu (parse_device refuses wgpu)")
}

/// The process group the environment describes: `RANK` and `WORLD_SIZE` (torchrun and similar
/// launchers), or `SLURM_PROCID` and `SLURM_NTASKS` (`srun`); with more than one process,
/// `MASTER_ADDR` (required) and `MASTER_PORT` (default 29500) say where process 0 listens.
pub(crate) fn process_group(
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<ProcessGroup>> {
    let number = |k: &str| -> anyhow::Result<Option<usize>> {
        env(k)
            .map(|v| {
                v.trim().parse::<usize>().map_err(|_| anyhow::anyhow!("{k}={v}: not a number"))
            })
            .transpose()
    };
    let (rank, count) = match (number("RANK")?, number("WORLD_SIZE")?) {
        (Some(r), Some(w)) => (r, w),
        (None, None) => match (number("SLURM_PROCID")?, number("SLURM_NTASKS")?) {
            (Some(r), Some(w)) => (r, w),
            _ => return Ok(None),
        },
        _ => anyhow::bail!("RANK and WORLD_SIZE must be set together"),
    };
    if count <= 1 {
        return Ok(None);
    }
    anyhow::ensure!(rank < count, "process rank {rank} is outside {count} processes");
    let host = env("MASTER_ADDR").filter(|h| !h.is_empty()).ok_or_else(|| {
        anyhow::anyhow!(
            "{count} processes but no MASTER_ADDR: set it to process 0's host (under Slurm: \
             export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1))"
        )
    })?;
    let port = number("MASTER_PORT")?.unwrap_or(29500);
    Ok(Some(ProcessGroup { rank, count, addr: format!("{host}:{port}") }))
}

/// Runs `asrt train`.
pub fn run(args: &TrainArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(args)?;
    let opts = RunOptions {
        data: crate::data::set::resolve_specs(&args.corpus, &cfg.data)?,
        out: args.out.clone(),
        resume: args.resume,
        stop_at: args.stop_at,
        val_corpus: args.val_corpus.clone(),
        init: args.init.clone(),
        allow_unmapped: args.allow_unmapped,
    };
    let accum = cfg.train.grad_accum;
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let bar =
            ProgressBar::with_draw_target(Some(cfg.train.max_steps), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{elapsed_precise} [{bar:25}] step {pos}/{len} {msg} ETA {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar
    });
    let quiet = args.quiet;
    let mut on_step = |m: &StepMetrics, target: u64| {
        let msg = format!(
            "(micro-batch {}, {accum} per step) loss {:.4} lr {:.2e} |g| {:.3} {:.0} audio-s/s{}",
            m.micro_batches,
            m.loss,
            m.lr,
            m.grad_norm,
            m.audio_seconds_per_second,
            if m.skipped { " SKIPPED (non-finite)" } else { "" }
        );
        let msg = match m.validation.as_ref().and_then(|v| v.get("wer")).and_then(|w| w.as_f64()) {
            Some(w) => format!("{msg} val WER {:.1} %", 100.0 * w),
            None => msg,
        };
        if let Some(bar) = &bar {
            bar.set_length(target);
            bar.set_position(m.step);
            bar.set_message(msg);
        } else if !quiet {
            eprintln!("asrt: step {}/{target} {msg}", m.step);
        }
    };
    let devices: Vec<Device> = match &args.devices {
        Some(list) => list.split(',').map(|d| parse_device(d.trim())).collect::<Result<_, _>>()?,
        None => vec![parse_device(&args.device)?],
    };
    let processes = process_group(&|k| std::env::var(k).ok())?;
    let kind = std::mem::discriminant(&devices[0]);
    anyhow::ensure!(
        devices.iter().all(|d| std::mem::discriminant(d) == kind),
        "--devices {}: one kind of device per run (all cpu, all cuda:N or all wgpu)",
        args.devices.as_deref().unwrap_or_default()
    );
    let process = processes.as_ref().map_or(0, |p| p.rank);
    let summary = match devices[0] {
        Device::Cpu => {
            crate::train::run::run_cpu_ranks(cfg, &opts, devices.len(), processes, &mut on_step)?
        }
        Device::Cuda(_) => run_cuda(cfg, &opts, &devices, processes, &mut on_step)?,
        Device::Wgpu => run_wgpu(cfg, &opts, devices.len(), processes, &mut on_step)?,
    };
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let last = summary.metrics.last();
    if process > 0 {
        println!(
            "trained to step {} ({} skipped) as process {process}; last loss {}; process 0 \
             writes the metrics and checkpoints in {}",
            summary.steps,
            summary.skipped,
            last.map_or("-".into(), |m| format!("{:.4}", m.loss)),
            args.out.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "trained to step {} ({} skipped); last loss {}; metrics {}, plot {}, checkpoint {}",
        summary.steps,
        summary.skipped,
        last.map_or("-".into(), |m| format!("{:.4}", m.loss)),
        args.out.join("metrics.jsonl").display(),
        args.out.join("loss.svg").display(),
        summary.checkpoint.as_deref().map_or("-".into(), |p| p.display().to_string()),
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_group_comes_from_the_launcher_s_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(process_group(&env(&[])).unwrap(), None);
        assert_eq!(process_group(&env(&[("RANK", "0"), ("WORLD_SIZE", "1")])).unwrap(), None);
        const TORCHRUN: &[(&str, &str)] =
            &[("RANK", "2"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "n1"), ("MASTER_PORT", "7")];
        let want = ProcessGroup { rank: 2, count: 4, addr: "n1:7".into() };
        assert_eq!(process_group(&env(TORCHRUN)).unwrap(), Some(want));
        const SLURM: &[(&str, &str)] =
            &[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("MASTER_ADDR", "n0")];
        let want = ProcessGroup { rank: 1, count: 2, addr: "n0:29500".into() };
        assert_eq!(process_group(&env(SLURM)).unwrap(), Some(want));
        let e = process_group(&env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")])).unwrap_err();
        assert!(e.to_string().contains("MASTER_ADDR"), "{e}");
        assert!(process_group(&env(&[("RANK", "x"), ("WORLD_SIZE", "2")])).is_err());
        assert!(process_group(&env(&[("RANK", "1")])).is_err());
    }
}
