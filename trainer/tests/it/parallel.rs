//! Data-parallel training on CPU ranks: W ranks of G micro-batches make the step one rank makes
//! of all W x G; a run resumed on another world size trains every utterance of the epoch as often
//! as the uninterrupted run (read from the metrics' ids); two processes on localhost meet through
//! the multi-process path and train as the same two ranks in one process do; a missing rank or a
//! rank with another config is named.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use asr_corpus::synth::SynthSpec;
use asr_trainer::{
    assemble, flatten_gradients, run_cpu_ranks, AudioFormat, Collective, DataSpec, LocalGroup,
    RankBatches, RunOptions, ShapePolicy, Solo, StepMetrics, TrainConfig, Trainer, TrainingSet,
};
use burn::module::{ModuleVisitor, Param};
use burn::prelude::*;

type B = burn::backend::Autodiff<burn::backend::NdArray>;

/// A corpus of short synthetic utterances (0.25-1.5 s) over a small vocabulary.
pub(crate) fn corpus(dir: &Path, n: u64) -> PathBuf {
    let spec = SynthSpec {
        min_samples: 4_000,
        max_samples: 24_000,
        vocab_size: 48,
        max_tokens: 8,
        ..SynthSpec::default()
    };
    let path = dir.join("c.asrcorpus");
    spec.write_corpus(&path, n, b"m").unwrap();
    path
}

const CONFIG: &str = "[model.encoder]\nn_layers = 1\n[train]\ngrad_accum = 1\n\
    checkpoint_every = 2\n[sampler]\nmax_batch_seconds = 4.0\n";

fn config(extra: &str) -> TrainConfig {
    TrainConfig::from_toml(&format!("{CONFIG}{extra}")).unwrap()
}

/// Every trainable float parameter of a model, in module order, then its running statistics as
/// a checkpoint saves them.
fn parameters(trainer: &Trainer<B>) -> (Vec<f32>, Vec<f32>) {
    // `into_record` (what a checkpoint calls) folds any update Burn's `RunningState` still holds
    // for a thread into the value the visitor reads; the clone shares that value.
    let _record = burn::module::Module::into_record(trainer.model.clone());
    struct Collect(Vec<f32>, Vec<f32>);
    impl ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let v = p.val();
            let out = if v.is_require_grad() { &mut self.0 } else { &mut self.1 };
            out.extend(v.into_data().convert::<f32>().to_vec::<f32>().unwrap());
        }
    }
    let mut c = Collect(Vec::new(), Vec::new());
    burn::module::Module::visit(&trainer.model, &mut c);
    (c.0, c.1)
}

#[test]
fn four_ranks_of_two_micro_batches_make_one_rank_s_step_of_eight() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let set = TrainingSet::open(&[DataSpec::new(corpus(dir.path(), 48))]).unwrap();
    let cfg = config("");
    let vocab = set.tokenizer().0 as usize;
    // Two steps of eight micro-batches of three utterances.
    let steps: Vec<Vec<_>> = (0..2u32)
        .map(|s| {
            (0..8u32)
                .map(|k| {
                    let idx: Vec<u32> = (0..3).map(|j| s * 24 + k * 3 + j).collect();
                    assemble(&set, &idx, ShapePolicy::default(), AudioFormat::I16)
                })
                .collect()
        })
        .collect();

    let mut one = Trainer::<B>::new(cfg.clone(), vocab, Default::default()).unwrap();
    let mut one_metrics = Vec::new();
    for (s, batches) in steps.iter().enumerate() {
        let slots: Vec<u64> = (0..8).map(|k| s as u64 * 8 + k).collect();
        let share = RankBatches {
            batches,
            slots: &slots,
            divisor: 8,
            next_micro: 8 * (s as u64 + 1),
            peers: &[],
        };
        one_metrics.push(one.parallel_step(&share, &set, 0, &mut Solo, 0.0).unwrap());
    }

    let members = LocalGroup::new(4, Duration::from_secs(60));
    let (set, steps) = (&set, &steps);
    let ranks: Vec<((Vec<f32>, Vec<f32>), Vec<StepMetrics>)> = std::thread::scope(|s| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|mut m| {
                let cfg = cfg.clone();
                s.spawn(move || {
                    let r = m.rank();
                    let mut t = Trainer::<B>::new(cfg, vocab, Default::default()).unwrap();
                    let mut metrics = Vec::new();
                    for (step, batches) in steps.iter().enumerate() {
                        let mine = &batches[2 * r..2 * r + 2];
                        let base = step as u64 * 8;
                        let slots = [base + 2 * r as u64, base + 2 * r as u64 + 1];
                        let share = RankBatches {
                            batches: mine,
                            slots: &slots,
                            divisor: 8,
                            next_micro: base + 8,
                            peers: &[],
                        };
                        metrics.push(t.parallel_step(&share, set, 0, &mut m, 0.0).unwrap());
                    }
                    m.finish();
                    (parameters(&t), metrics)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    // Every rank holds the same parameters and running statistics, bit for bit.
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for ((p, buf), _) in &ranks[1..] {
        assert_eq!(bits(p), bits(&ranks[0].0 .0));
        assert_eq!(bits(buf), bits(&ranks[0].0 .1));
    }
    // The trainable ones equal one rank's, to float rounding (the sums run in another order).
    // (The running statistics do not: one rank updates them 8 times a step, four ranks twice
    // each and average.)
    let (single, single_buffers) = parameters(&one);
    assert_eq!(single.len(), ranks[0].0 .0.len());
    assert_eq!(single_buffers.len(), 192, "the encoder layer's batch norm: 2 x 96");
    // Adam divides each gradient by its own running magnitude, so a rounding difference in a
    // near-zero gradient can flip a parameter's update (up to 2 lr): almost every parameter is
    // within 1e-6, every one within 2.5 x the largest learning rate of the two steps.
    let lr = one_metrics.iter().map(|m| m.lr).fold(0.0, f64::max) as f32;
    let close = single
        .iter()
        .zip(&ranks[0].0 .0)
        .filter(|(a, b)| (*a - *b).abs() <= 1e-6 * a.abs().max(1e-3))
        .count();
    eprintln!("{close} of {} parameters within 1e-6", single.len());
    assert!(close as f64 >= 0.99 * single.len() as f64, "{close} of {} within 1e-6", single.len());
    let worst = single.iter().zip(&ranks[0].0 .0).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 2.5 * lr, "largest difference {worst}, lr {lr}");
    let fresh = Trainer::<B>::new(cfg.clone(), vocab, Default::default()).unwrap();
    let changed = single.iter().zip(&parameters(&fresh).0).filter(|(a, b)| a != b).count();
    assert!(changed > single.len() / 2, "the steps trained: {changed} of {} changed", single.len());
    for (k, (a, b)) in one_metrics.iter().zip(&ranks[0].1).enumerate() {
        // Step 1 starts from the same parameters: the same losses, gradients within rounding.
        let tolerance = if k == 0 { 1e-6 } else { 1e-4 };
        assert!((a.loss - b.loss).abs() <= tolerance * a.loss.abs(), "{} vs {}", a.loss, b.loss);
        let dn = (a.grad_norm - b.grad_norm).abs();
        assert!(dn <= tolerance * a.grad_norm, "{} vs {}", a.grad_norm, b.grad_norm);
        assert_eq!(
            (a.utterances, a.micro_batches, &a.ids),
            (b.utterances, b.micro_batches, &b.ids)
        );
        assert_eq!(b.world_size, 4);
        assert_eq!(b.ranks.len(), 4);
        assert!(b.ranks.iter().all(|r| r.utterances == 6));
    }
}

fn read_metrics(out: &Path) -> Vec<StepMetrics> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// [corpus, index] -> uses, over the metrics lines of `epoch`.
fn uses(metrics: &[StepMetrics], epoch: u64) -> BTreeMap<[u32; 2], u32> {
    let mut m = BTreeMap::new();
    for s in metrics.iter().filter(|s| s.epoch == epoch) {
        for &id in s.ids.iter().flatten() {
            *m.entry(id).or_default() += 1;
        }
    }
    m
}

#[test]
fn a_run_resumed_on_another_world_size_trains_the_epoch_s_utterances_as_often() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let c = corpus(dir.path(), 80);
    let opts = |out: &str, resume, stop_at| RunOptions {
        data: vec![DataSpec::new(&c)],
        out: dir.path().join(out),
        resume,
        stop_at,
        val_corpus: None,
        init: None,
        allow_unmapped: false,
    };
    // Enough steps to finish epoch 0 on any of the world sizes below.
    let mut cfg = config("");
    cfg.train.max_steps = 12;
    let whole =
        run_cpu_ranks(cfg.clone(), &opts("whole", false, None), 2, None, &mut |_, _| {}).unwrap();
    assert_eq!(whole.steps, 12);
    let reference = uses(&read_metrics(&dir.path().join("whole")), 0);
    assert!(!reference.is_empty());
    let epoch0_steps =
        read_metrics(&dir.path().join("whole")).iter().filter(|m| m.epoch == 0).count();
    assert!(epoch0_steps >= 4, "{epoch0_steps} steps in epoch 0");

    run_cpu_ranks(cfg.clone(), &opts("split", false, Some(2)), 2, None, &mut |_, _| {}).unwrap();
    let b =
        run_cpu_ranks(cfg.clone(), &opts("split", true, None), 3, None, &mut |_, _| {}).unwrap();
    assert_eq!(b.steps, 12);
    let metrics = read_metrics(&dir.path().join("split"));
    assert_eq!(metrics[..2].iter().map(|m| m.world_size).collect::<Vec<_>>(), [2, 2]);
    assert!(metrics[2..].iter().all(|m| m.world_size == 3 && m.ranks.len() == 3));
    assert_eq!(uses(&metrics, 0), reference, "epoch 0 after a 2 -> 3 rank resume");
    tensorboard_agrees(&dir.path().join("split"), &metrics);
}

/// TensorBoard's own reader (`EventAccumulator`, pip's `tensorboard`) finds every step's loss,
/// learning rate and gradient norm in the event files beside the metrics: the value of the
/// last file that has the step (a resumed run writes a new file), as f32.
fn tensorboard_agrees(out: &Path, metrics: &[StepMetrics]) {
    let script = "import json, sys\n\
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n\
        ea = EventAccumulator(sys.argv[1], purge_orphaned_data=False)\n\
        ea.Reload()\n\
        print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()['scalars']}))\n";
    let probe = std::process::Command::new("python3").args(["-c", "import tensorboard"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: TensorBoard's reader (pip install tensorboard) is not installed");
        return;
    }
    let o = std::process::Command::new("python3")
        .args(["-c", script, out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tags: BTreeMap<String, Vec<(u64, f32)>> = serde_json::from_slice(&o.stdout).unwrap();
    let files: Vec<(String, u64)> = std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("tfevents"))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len()))
        .collect();
    let last = |tag: &str, step: u64| {
        tags.get(tag)
            .unwrap_or_else(|| panic!("no {tag} in {:?}", tags.keys()))
            .iter()
            .rev()
            .find(|(s, _)| *s == step)
            .map(|p| p.1)
            .unwrap_or_else(|| panic!("no {tag} at step {step}: {:?} in {files:?}", tags[tag]))
    };
    for m in metrics {
        assert_eq!(last("train_loss", m.step), m.loss as f32, "step {}", m.step);
        assert_eq!(last("learning_rate", m.step), m.lr as f32, "step {}", m.step);
        assert_eq!(last("grad_norm", m.step), m.grad_norm as f32, "step {}", m.step);
        assert_eq!(last("global_step", m.step), m.step as f32);
    }
    let wait = &tags["data_wait_share"];
    assert!(wait.iter().all(|(_, w)| (0.0..=1.0).contains(w)), "{wait:?}");
}

fn asrt(args: &[&str], env: &[(&str, String)]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_asrt"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The environment a launcher gives process `rank` of two meeting at `port` on localhost.
fn launcher_env(rank: u32, port: &str) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", "2".to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
    ]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn two_processes_on_localhost_train_as_two_ranks_of_one_process() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let c = corpus(dir.path(), 40);
    let cfg_path = dir.path().join("train.toml");
    std::fs::write(
        &cfg_path,
        "[model.encoder]\nn_layers = 1\n[train]\ngrad_accum = 1\ncheckpoint_every = 2\nmax_steps = 3\n\
         collective_timeout_seconds = 60.0\n[sampler]\nmax_batch_seconds = 4.0\n",
    )
    .unwrap();
    let (c, cfg) = (c.to_str().unwrap(), cfg_path.to_str().unwrap());
    let local = dir.path().join("local");
    let out = asrt(
        &[
            "train",
            c,
            "--config",
            cfg,
            "--out",
            local.to_str().unwrap(),
            "--devices",
            "cpu,cpu",
            "-q",
        ],
        &[],
    )
    .wait_with_output()
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let multi = dir.path().join("multi");
    let port = free_port().to_string();
    let args = ["train", c, "--config", cfg, "--out", multi.to_str().unwrap(), "-q"];
    let p1 = asrt(&args, &launcher_env(1, &port));
    let p0 = asrt(&args, &launcher_env(0, &port));
    for p in [p0, p1] {
        let out = p.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let (a, b) = (read_metrics(&local), read_metrics(&multi));
    assert_eq!(a.len(), 3);
    for (x, y) in a.iter().zip(&b) {
        // The same reduction in the same rank order: the same bits.
        assert_eq!(
            (x.loss.to_bits(), x.grad_norm.to_bits(), &x.ids),
            (y.loss.to_bits(), y.grad_norm.to_bits(), &y.ids)
        );
        assert_eq!(y.world_size, 2);
    }

    // A rank with another config is refused at start-up, by both.
    let other = dir.path().join("other.toml");
    std::fs::write(
        &other,
        std::fs::read_to_string(&cfg_path).unwrap().replace("max_steps = 3", "max_steps = 4"),
    )
    .unwrap();
    let port = free_port().to_string();
    let out_dir = dir.path().join("mismatch");
    let p1 = asrt(
        &[
            "train",
            c,
            "--config",
            other.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
            "-q",
        ],
        &launcher_env(1, &port),
    );
    let p0 = asrt(
        &["train", c, "--config", cfg, "--out", out_dir.to_str().unwrap(), "-q"],
        &launcher_env(0, &port),
    );
    for p in [p0, p1] {
        let out = p.wait_with_output().unwrap();
        assert!(!out.status.success());
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("fingerprint"), "{e}");
    }

    // A rank that never comes: rank 0 stops after the timeout, naming it.
    let short = dir.path().join("short.toml");
    std::fs::write(&short, std::fs::read_to_string(&cfg_path).unwrap().replace("60.0", "2.0"))
        .unwrap();
    let env = launcher_env(0, &free_port().to_string());
    let started = std::time::Instant::now();
    let out = asrt(
        &[
            "train",
            c,
            "--config",
            short.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
            "-q",
        ],
        &env,
    )
    .wait_with_output()
    .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("rank 1 of 2") && e.contains("2 s"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn the_ranks_summed_gradients_are_one_rank_s_mean_gradient() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let set = TrainingSet::open(&[DataSpec::new(corpus(dir.path(), 24))]).unwrap();
    let cfg = config("");
    let vocab = set.tokenizer().0 as usize;
    let batches: Vec<_> = (0..6u32)
        .map(|k| {
            let idx: Vec<u32> = (0..4).map(|j| k * 4 + j).collect();
            assemble(&set, &idx, ShapePolicy::default(), AudioFormat::I16)
        })
        .collect();
    let mut one = Trainer::<B>::new(cfg.clone(), vocab, Default::default()).unwrap();
    let g = one.gradients_at(&batches, &[0, 1, 2, 3, 4, 5], 6.0).unwrap();
    let single = flatten_gradients(&one.model, &g.grads);
    // Three ranks: two batches, one (an idle slot beside it), three.
    let shares: [&[usize]; 3] = [&[0, 1], &[2], &[3, 4, 5]];
    let members = LocalGroup::new(3, Duration::from_secs(60));
    let (batches, cfg) = (&batches, &cfg);
    let flats: Vec<(Vec<f32>, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|mut m| {
                s.spawn(move || {
                    let share = shares[m.rank()];
                    let mine: Vec<_> = share.iter().map(|&k| batches[k].clone()).collect();
                    let slots: Vec<u64> = share.iter().map(|&k| k as u64).collect();
                    let mut t = Trainer::<B>::new(cfg.clone(), vocab, Default::default()).unwrap();
                    let g = t.gradients_at(&mine, &slots, 6.0).unwrap();
                    let g = asr_trainer::reduce(&t.model, g, &mut m, &t.device, &[], None).unwrap();
                    m.finish();
                    (flatten_gradients(&t.model, &g.grads), g.loss)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let norm = single.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    assert!(norm > 0.0);
    for (flat, loss) in &flats {
        assert_eq!(flat.len(), single.len());
        let diff =
            flat.iter().zip(&single).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>().sqrt();
        assert!(diff <= 1e-6 * norm, "|difference| {diff:e}, |gradient| {norm:e}");
        assert!((loss - g.loss).abs() <= 1e-9 * g.loss.abs(), "{loss} vs {}", g.loss);
    }
}
