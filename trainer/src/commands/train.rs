//! `asrt train`.

use std::io::IsTerminal;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::TrainArgs;
use crate::config::TrainConfig;
use crate::device::{dispatch, RunOn};
use crate::model_source::ModelSource;
use crate::train::metrics::StepMetrics;
use crate::train::run::{ProcessGroup, RunOptions};

fn load_config(args: &TrainArgs) -> anyhow::Result<TrainConfig> {
    // With --init, the model is the initial model's and its loss options are the base the
    // config file's [loss] keys override.
    let start = match &args.init {
        Some(init) => {
            let info = ModelSource::resolve(init)?.describe()?;
            if !args.quiet {
                eprintln!(
                    "asrt: model from {}: {} layers, d_model {}, {} heads, vocabulary {}, \
                     durations {:?}, loss sigma {} omega {}",
                    init.display(),
                    info.model.encoder.n_layers,
                    info.model.encoder.d_model,
                    info.model.encoder.n_heads,
                    info.tokenizer.vocab,
                    info.model.durations,
                    info.loss.sigma,
                    info.loss.omega
                );
            }
            Some(info)
        }
        None => None,
    };
    let start = start.as_ref().map(|i| (&i.model, &i.loss));
    let mut cfg = match &args.config {
        Some(p) => TrainConfig::from_file_with(p, start)?,
        None => TrainConfig::from_toml_with("", start)?,
    };
    if let Some(n) = args.max_steps {
        cfg.train.max_steps = n;
    }
    if let Some(p) = args.precision {
        cfg.train.precision = p;
    }
    cfg.validate()?;
    Ok(cfg)
}

/// Why the launcher's environment describes no usable process group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LauncherError {
    /// A variable that must be a number is not one.
    #[error("{key}={value}: not a number")]
    NotANumber {
        /// The variable.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// One variable of a launcher's pair is set, the other not.
    #[error("{set} and {unset} must be set together (only {set} is)")]
    HalfPair {
        /// The one set.
        set: &'static str,
        /// The one missing.
        unset: &'static str,
    },
    /// The rank is not below the process count.
    #[error("process rank {rank} is outside {count} processes")]
    RankOutside {
        /// This process's rank.
        rank: usize,
        /// Processes in all.
        count: usize,
    },
    /// Several processes but nowhere to meet.
    #[error(
        "{count} processes but no MASTER_ADDR: set it to process 0's host (under Slurm: \
         export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1))"
    )]
    NoMasterAddr {
        /// Processes in all.
        count: usize,
    },
}

/// The process group the environment describes: `RANK` and `WORLD_SIZE` (torchrun and similar
/// launchers), or `SLURM_PROCID` and `SLURM_NTASKS` (`srun`); with more than one process,
/// `MASTER_ADDR` (required) and `MASTER_PORT` (default 29500) say where process 0 listens.
/// Either launcher's pair is all or nothing: half a pair is a launch script's mistake, and
/// running as a single process would train alone while the others wait.
pub(crate) fn process_group(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ProcessGroup>, LauncherError> {
    let number = |key: &'static str| -> Result<Option<usize>, LauncherError> {
        env(key)
            .map(|value| {
                value.trim().parse::<usize>().map_err(|_| LauncherError::NotANumber { key, value })
            })
            .transpose()
    };
    let pair =
        |rank: &'static str, size: &'static str| -> Result<Option<(usize, usize)>, LauncherError> {
            match (number(rank)?, number(size)?) {
                (Some(r), Some(w)) => Ok(Some((r, w))),
                (None, None) => Ok(None),
                (Some(_), None) => Err(LauncherError::HalfPair { set: rank, unset: size }),
                (None, Some(_)) => Err(LauncherError::HalfPair { set: size, unset: rank }),
            }
        };
    let (rank, count) = match pair("RANK", "WORLD_SIZE")? {
        Some(p) => p,
        None => match pair("SLURM_PROCID", "SLURM_NTASKS")? {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    if count <= 1 {
        return Ok(None);
    }
    if rank >= count {
        return Err(LauncherError::RankOutside { rank, count });
    }
    let host = env("MASTER_ADDR")
        .filter(|h| !h.is_empty())
        .ok_or(LauncherError::NoMasterAddr { count })?;
    let port = number("MASTER_PORT")?.unwrap_or(29500);
    Ok(Some(ProcessGroup { rank, count, addr: format!("{host}:{port}") }))
}

/// Runs `asrt train`.
pub fn run(args: &TrainArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(args)?;
    let opts = RunOptions {
        data: asr_plan::set::resolve_specs(&args.corpus, &cfg.data)?,
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
            "(micro-batch {}, {accum} per step) loss {:.4} lr {:.2e} |g| {:.3} {:.0} audio-s/s{}{}",
            m.micro_batches,
            m.loss,
            m.lr,
            m.grad_norm,
            m.audio_seconds_per_second,
            m.device_memory.map_or(String::new(), |d| format!(
                " device {:.2} GB in use, {:.2} reserved",
                d.in_use_bytes() as f64 / 1e9,
                d.reserved_bytes as f64 / 1e9
            )),
            match (m.skipped, m.loss_scale) {
                (false, _) => String::new(),
                (true, None) => " SKIPPED (non-finite)".to_owned(),
                (true, Some(s)) => format!(" SKIPPED (non-finite at loss scale {s})"),
            }
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
    let devices = args.device.devices();
    let processes = process_group(&|k| std::env::var(k).ok())?;
    let process = processes.as_ref().map_or(0, |p| p.rank);
    args.device.prepare(&devices, processes.is_some())?;
    crate::device::check_precision(&devices, cfg.train.precision)?;
    let summary = dispatch(&devices, RunOn { cfg, opts: &opts, processes, on_step: &mut on_step })?;
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
        let e = process_group(&env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")]));
        assert_eq!(e, Err(LauncherError::NoMasterAddr { count: 2 }));
        assert_eq!(
            process_group(&env(&[("RANK", "x"), ("WORLD_SIZE", "2")])),
            Err(LauncherError::NotANumber { key: "RANK", value: "x".into() })
        );
        assert_eq!(
            process_group(&env(&[("RANK", "1")])),
            Err(LauncherError::HalfPair { set: "RANK", unset: "WORLD_SIZE" })
        );
        assert_eq!(
            process_group(&env(&[("WORLD_SIZE", "2")])),
            Err(LauncherError::HalfPair { set: "WORLD_SIZE", unset: "RANK" })
        );
        // Half of Slurm's pair is refused the same way (it used to run as a single process).
        assert_eq!(
            process_group(&env(&[("SLURM_PROCID", "1")])),
            Err(LauncherError::HalfPair { set: "SLURM_PROCID", unset: "SLURM_NTASKS" })
        );
        assert_eq!(
            process_group(&env(&[("SLURM_NTASKS", "2")])),
            Err(LauncherError::HalfPair { set: "SLURM_NTASKS", unset: "SLURM_PROCID" })
        );
        assert_eq!(
            process_group(&env(&[("RANK", "4"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "n")])),
            Err(LauncherError::RankOutside { rank: 4, count: 4 })
        );
    }
}
