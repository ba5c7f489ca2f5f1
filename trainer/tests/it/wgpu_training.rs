//! A few `tiny` training steps on Burn's wgpu backend (the TDT kernels, the model's ops on the
//! device) against the same steps on the CPU backend (NdArray, the float64 TDT path), from the
//! same initial weights and batches. Dropout and dither are off (the log-mel of near-silent
//! frames amplifies f32 differences in the dither); SpecAugment masks come from the host, so
//! both backends see the same inputs.
//!
//! Tolerances: per-step losses agree to 1e-5 relative and gradient norms to 1e-4 (measured:
//! 1e-7 and 1.4e-5; f32 rounding, and the TDT lattice in f32 instead of f64). This test found
//! that a rank-4 `Linear` got a wrong bias gradient on the CubeCL backend (the subsampling's
//! pointwise projections now run as rank-2 `Linear`s).

use asr_trainer::{
    assemble, AudioFormat, DataSpec, ShapePolicy, TrainConfig, Trainer, TrainingSet,
};
use burn::module::Module;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};

type Cpu = burn::backend::Autodiff<burn::backend::NdArray>;
type Gpu = burn::backend::Autodiff<burn::backend::Wgpu>;
type Fused = burn::backend::Autodiff<asr_trainer::FusedWgpu>;

/// Every float parameter's values, in the module's order.
struct Values(Vec<Vec<f32>>);

impl<B: burn::tensor::backend::Backend> burn::module::ModuleVisitor<B> for Values {
    fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<burn::tensor::Tensor<B, D>>) {
        self.0.push(p.val().into_data().convert::<f32>().into_vec::<f32>().unwrap());
    }
}

/// `module`'s float parameters' values ([`Values`]).
fn values<B: burn::tensor::backend::Backend, M: Module<B>>(module: &M) -> Vec<Vec<f32>> {
    let mut v = Values(Vec::new());
    module.visit(&mut v);
    v.0
}

fn initial_weights<B: burn::tensor::backend::Backend>(seed: u64) -> Vec<Vec<f32>> {
    let mut cfg = asr_trainer::ModelConfig::tiny();
    cfg.encoder.n_layers = 1;
    values(&asr_trainer::TdtModel::<B>::new(&cfg, 40, seed, &Default::default()))
}

/// One seed is one model on every backend: each backend draws from its own generator (the GPU
/// kit's first CUDA run started from another model than its CPU reference), so the weights are
/// drawn on the host and copied. Bit for bit, on wgpu against the CPU backend.
#[test]
fn one_seed_gives_the_same_initial_weights_on_every_backend() {
    let _turn = crate::serial();
    let cpu = initial_weights::<burn::backend::NdArray>(7);
    let gpu = initial_weights::<burn::backend::Wgpu>(7);
    assert!(cpu.len() > 20, "{} parameters", cpu.len());
    assert_eq!(cpu, gpu);
    // On the training backends too, and another seed is another model.
    assert_eq!(initial_weights::<Cpu>(7), cpu);
    assert_ne!(initial_weights::<burn::backend::NdArray>(8), cpu);
}

/// Per step: loss and gradient norm; then the first micro-batch's gradients, flattened.
type Trace = (Vec<(f64, f64)>, Vec<f32>);

/// Three `tiny` steps of two micro-batches on backend `G`, from the weights of `start`.
fn tiny_steps<G>(start: &Trainer<Cpu>, cfg: &TrainConfig, set: &TrainingSet) -> Trace
where
    G: burn::tensor::backend::AutodiffBackend + asr_tdt::op::TdtBackend,
    G::InnerBackend: asr_trainer::DeviceAllReduce,
{
    let vocab = set.tokenizer().0 as usize;
    let fresh = || {
        let mut t = Trainer::<G>::new(cfg.clone(), vocab, Default::default()).unwrap();
        // The backends draw initial weights from different generators: start from the CPU
        // model's weights.
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let bytes = recorder.record(start.model.clone().into_record(), ()).unwrap();
        let record = recorder.load(bytes, &Default::default()).unwrap();
        t.model = t.model.clone().load_record(record);
        t
    };
    let batches = |s: u32| -> Vec<_> {
        (0..2u32)
            .map(|k| {
                let idx: Vec<u32> = (0..2).map(|j| (s * 4 + k * 2 + j) % 12).collect();
                assemble(set, &idx, ShapePolicy::default(), AudioFormat::I16)
            })
            .collect()
    };
    let mut t = fresh();
    let mut per_step = Vec::new();
    for s in 0..3u32 {
        let m = t.train_step(&batches(s), set, 0).unwrap();
        assert!(!m.skipped, "step {s} skipped");
        per_step.push((m.loss, m.grad_norm));
    }
    let mut t = fresh();
    let g = t.gradients_at(&batches(0)[..1], &[0], 1.0).unwrap();
    (per_step, asr_trainer::flatten_gradients(&t.model, &g.grads))
}

/// Largest |a - b| over the gradients, relative to the largest |b|.
fn gradient_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max) / scale
}

/// The same steps on the CPU backend, on wgpu, and on wgpu through Burn's fusion (the default of
/// `--device wgpu` and `--device cuda:N`): fusion merges the element-wise chains into new
/// kernels, so its results may differ from unfused wgpu by rounding, never by more.
#[test]
fn tiny_steps_on_wgpu_match_the_cpu_backend_with_and_without_fusion() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let set = TrainingSet::open(&[DataSpec::new(crate::parallel::corpus(dir.path(), 12))]).unwrap();
    let cfg = TrainConfig::from_toml(
        "[model.encoder]\nn_layers = 1\ndropout = 0.0\n[model.preprocessor]\ndither = 0.0\n\
         [train]\ngrad_accum = 2\n\
         [sampler]\nmax_batch_seconds = 4.0\n[optim]\nlr = 1e-3\nwarmup_steps = 0\n",
    )
    .unwrap();
    let vocab = set.tokenizer().0 as usize;
    let start = Trainer::<Cpu>::new(cfg.clone(), vocab, Default::default()).unwrap();
    let cpu = tiny_steps::<Cpu>(&start, &cfg, &set);
    let gpu = tiny_steps::<Gpu>(&start, &cfg, &set);
    let fused = tiny_steps::<Fused>(&start, &cfg, &set);
    for s in 0..3 {
        let ((la, ga), (lb, gb), (lf, gf)) = (cpu.0[s], gpu.0[s], fused.0[s]);
        eprintln!(
            "step {s}: loss cpu {la:.6} wgpu {lb:.6} fused {lf:.6}, grad norm cpu {ga:.6} \
             wgpu {gb:.6} fused {gf:.6}"
        );
        for (name, l, g) in [("wgpu", lb, gb), ("fused wgpu", lf, gf)] {
            assert!((la - l).abs() <= 1e-5 * la.abs(), "step {s}: {name} loss {l} vs {la}");
            assert!((ga - g).abs() <= 1e-4 * ga, "step {s}: {name} gradient norm {g} vs {ga}");
        }
    }
    // Every parameter's gradient of one micro-batch (the norm above could hide a wrong one).
    let (d_gpu, d_fused) =
        (gradient_difference(&gpu.1, &cpu.1), gradient_difference(&fused.1, &gpu.1));
    eprintln!(
        "first micro-batch: max |gradient difference| / max |gradient|: cpu-wgpu {d_gpu:.3e}, \
         wgpu-fused {d_fused:.3e}"
    );
    assert!(d_gpu <= D_CPU_WGPU, "cpu against wgpu: {d_gpu:.3e}");
    assert!(d_fused <= D_WGPU_FUSED, "wgpu against fused wgpu: {d_fused:.3e}");
}

/// Replaces every float parameter with NaN, each still a leaf that takes a gradient. (The first
/// parameter alone was not enough: the loss stayed finite.)
struct Poison;

impl<B: burn::tensor::backend::Backend> burn::module::ModuleMapper<B> for Poison {
    fn map_float<const D: usize>(
        &mut self,
        p: burn::module::Param<burn::tensor::Tensor<B, D>>,
    ) -> burn::module::Param<burn::tensor::Tensor<B, D>> {
        let (id, value) = (p.id, p.val());
        let nan = burn::tensor::Tensor::<B, D>::full(value.shape(), f32::NAN, &value.device());
        burn::module::Param::initialized(id, nan.require_grad())
    }
}

/// On the device path (fused wgpu, as `--device cuda:N` trains) a micro-batch's loss is read
/// after its backward is queued (`ASRT_LOSS_READ` unset): a loss that is not finite must still
/// leave that micro-batch out of the step and the step skipped with no parameter changed; the
/// next step trains.
#[test]
fn a_micro_batch_whose_loss_is_not_finite_is_left_out_on_the_device_path() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let set = TrainingSet::open(&[DataSpec::new(crate::parallel::corpus(dir.path(), 8))]).unwrap();
    let cfg = TrainConfig::from_toml(
        "[model.encoder]\nn_layers = 1\n[sampler]\nmax_batch_seconds = 4.0\n",
    )
    .unwrap();
    let vocab = set.tokenizer().0 as usize;
    let batch =
        |k: u32| assemble(&set, &[2 * k, 2 * k + 1], ShapePolicy::default(), AudioFormat::I16);
    let mut t = Trainer::<Fused>::new(cfg.clone(), vocab, Default::default()).unwrap();
    let healthy = t.model.clone();
    t.model = t.model.clone().map(&mut Poison);
    let before = values(&t.model);
    let g = t.gradients_at(&[batch(0)], &[0], 1.0).unwrap();
    assert!(
        g.non_finite && g.finite == 0 && g.loss.is_nan(),
        "{:?}",
        (g.non_finite, g.finite, g.loss)
    );
    let (_, _, skipped) = t.apply(g);
    assert!(skipped, "a step with no finite micro-batch is skipped");
    let after = values(&t.model);
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(before.iter().zip(&after).all(|(a, b)| same(a, b)), "a parameter changed");
    // From the healthy weights, after the skipped step: two finite micro-batches train.
    t.model = healthy;
    let g = t.gradients_at(&[batch(1), batch(2)], &[1, 2], 2.0).unwrap();
    assert!(
        !g.non_finite && g.finite == 2 && g.loss.is_finite(),
        "{:?}",
        (g.non_finite, g.finite, g.loss)
    );
    let (_, norm, skipped) = t.apply(g);
    assert!(!skipped && norm.is_finite() && norm > 0.0, "norm {norm}, skipped {skipped}");
}

/// Two wgpu ranks (fused, as `--devices wgpu,wgpu` trains) sum their gradients as one rank
/// sums all their micro-batches: each rank's micro-batches summed flat on the device
/// (`flat_grads`), laid out flat for the sum over ranks, and given back as views. Rank 0 has
/// two micro-batches, rank 1 one; the presence flags and every value are compared.
#[test]
fn two_wgpu_ranks_sum_gradients_as_one_rank_sums_their_micro_batches() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let set = TrainingSet::open(&[DataSpec::new(crate::parallel::corpus(dir.path(), 12))]).unwrap();
    let cfg = TrainConfig::from_toml(
        "[model.encoder]\nn_layers = 1\ndropout = 0.0\n[model.preprocessor]\ndither = 0.0\n\
         [sampler]\nmax_batch_seconds = 4.0\n",
    )
    .unwrap();
    let vocab = set.tokenizer().0 as usize;
    let batches: Vec<_> = (0..3u32)
        .map(|k| assemble(&set, &[2 * k, 2 * k + 1], ShapePolicy::default(), AudioFormat::I16))
        .collect();
    // One seed: every trainer starts from the same weights.
    let mut one = Trainer::<Fused>::new(cfg.clone(), vocab, Default::default()).unwrap();
    let g = one.gradients_at(&batches, &[0, 1, 2], 3.0).unwrap();
    let single = asr_trainer::flatten_gradients(&one.model, &g.grads);
    let shares: [&[usize]; 2] = [&[0, 1], &[2]];
    let members = asr_trainer::LocalGroup::new(2, std::time::Duration::from_secs(120));
    let (batches, cfg) = (&batches, &cfg);
    let flats: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|mut m| {
                s.spawn(move || {
                    use asr_trainer::Collective;
                    let share = shares[m.rank()];
                    let mine: Vec<_> = share.iter().map(|&k| batches[k].clone()).collect();
                    let slots: Vec<u64> = share.iter().map(|&k| k as u64).collect();
                    let mut t =
                        Trainer::<Fused>::new(cfg.clone(), vocab, Default::default()).unwrap();
                    let g = t.gradients_at(&mine, &slots, 3.0).unwrap();
                    let g = asr_trainer::reduce(&t.model, g, &mut m, &t.device, &[], None).unwrap();
                    m.finish();
                    asr_trainer::flatten_gradients(&t.model, &g.grads)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let norm = single.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    assert!(norm > 0.0);
    for (rank, flat) in flats.iter().enumerate() {
        assert_eq!(flat.len(), single.len());
        let diff =
            flat.iter().zip(&single).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>().sqrt();
        let differing =
            flat.iter().zip(&single).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        eprintln!(
            "rank {rank}: |difference| {diff:e}, |gradient| {norm:e}, {differing} values differ"
        );
        // The same additions in the same order ((mb0 + mb1) + mb2): measured the same bits.
        assert_eq!(differing, 0, "rank {rank}: |difference| {diff:e}, |gradient| {norm:e}");
    }
    // Both ranks hold the same sums, bit for bit.
    assert!(flats[0].iter().zip(&flats[1]).all(|(a, b)| a.to_bits() == b.to_bits()));
}

// Measured on lavapipe: 3.44e-4 between the CPU backend (whose TDT loss is float64) and wgpu,
// 7.3e-7 between wgpu and fused wgpu (the same kernels for the loss and the products; fusion
// only regroups element-wise work). The bounds are 4.4x and 4.8x those.
const D_CPU_WGPU: f32 = 1.5e-3;
const D_WGPU_FUSED: f32 = 3.5e-6;

/// `asrt train --device wgpu`: the run trains and checkpoints on wgpu, and `asrt eval` decodes
/// the corpus with its checkpoint on wgpu as on the CPU: the same hypotheses, the same rates.
/// The corpus carries a real SentencePiece model (the example's), so hypotheses are text.
#[test]
fn asrt_trains_and_evaluates_on_wgpu() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let spm = crate::example_spm();
    let spec = asr_corpus::synth::SynthSpec {
        min_samples: 4_000,
        max_samples: 24_000,
        vocab_size: 320,
        max_tokens: 8,
        ..asr_corpus::synth::SynthSpec::default()
    };
    let corpus = dir.path().join("c.asrcorpus");
    spec.write_corpus(&corpus, 12, &spm).unwrap();
    let config = dir.path().join("train.toml");
    std::fs::write(
        &config,
        "[model.encoder]\nn_layers = 1\n[train]\ngrad_accum = 1\ncheckpoint_every = 3\n\
         [sampler]\nmax_batch_seconds = 4.0\n",
    )
    .unwrap();
    let run = dir.path().join("run");
    let memory_log = dir.path().join("memory.log");
    // The training run writes CubeCL's memory log (`ASRT_MEMORY_LOG`), the others do not.
    let asrt = |args: &[&std::ffi::OsStr]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_asrt"));
        if args[0] == "train" {
            cmd.env("ASRT_MEMORY_LOG", &memory_log);
        }
        let out = cmd.args(args).output().unwrap();
        assert!(out.status.success(), "asrt {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let os = |s: &str| std::ffi::OsString::from(s);
    asrt(&[
        os("train").as_os_str(),
        corpus.as_os_str(),
        os("--config").as_os_str(),
        config.as_os_str(),
        os("--out").as_os_str(),
        run.as_os_str(),
        os("--max-steps").as_os_str(),
        os("3").as_os_str(),
        os("--device").as_os_str(),
        os("wgpu").as_os_str(),
        os("--quiet").as_os_str(),
    ]);
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> =
        metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    for m in &lines {
        assert_eq!(m["skipped"], false, "{m}");
        assert!(m["loss"].as_f64().unwrap().is_finite(), "{m}");
    }
    assert!(run.join("checkpoints").join("latest").is_file());
    // Each step's device memory, against the checkpoint of step 3 (written after its update):
    // after the update the pool holds the parameters and both moments (what model.mpk and
    // optim.mpk hold, with their keys), and after backward also one gradient per trainable
    // parameter, as many bytes as one moment (half of optim.mpk).
    let step3 = run.join("checkpoints").join("step-00000003");
    let size = |f: &str| std::fs::metadata(step3.join(f)).unwrap().len() as f64;
    let (model, optim) = (size("model.mpk"), size("optim.mpk"));
    let mem = &lines[2]["device_memory"];
    let bytes = |k: &str| mem[k].as_f64().unwrap_or_else(|| panic!("no {k} in {mem}"));
    let (forward, gradients, update) =
        (bytes("forward_bytes"), bytes("gradients_bytes"), bytes("update_bytes"));
    assert!(bytes("reserved_bytes") >= forward.max(gradients).max(update), "{mem}");
    // Measured: in use after the update 1.23x the two files (the mel front end's tables and
    // the like besides); the gradients 0.17 % below half of optim.mpk (its keys); bound 1 %.
    assert!(update >= 0.99 * (model + optim), "{mem}: model.mpk {model}, optim.mpk {optim}");
    let grads = gradients - update;
    assert!((grads - optim / 2.0).abs() <= 0.01 * optim / 2.0, "{mem}: optim.mpk {optim}");
    pool_layout_agrees_with_the_metrics(&memory_log, &lines, dir.path());

    let eval = |device: &str| -> serde_json::Value {
        let out = asrt(&[
            os("eval").as_os_str(),
            corpus.as_os_str(),
            os("--checkpoint").as_os_str(),
            run.as_os_str(),
            os("--json").as_os_str(),
            os("--device").as_os_str(),
            os(device).as_os_str(),
        ]);
        serde_json::from_str(&out).unwrap()
    };
    let (on_wgpu, on_cpu) = (eval("wgpu"), eval("cpu"));
    let hypotheses = |e: &serde_json::Value| -> Vec<String> {
        e["utterances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["hypothesis"].as_str().unwrap().to_owned())
            .collect()
    };
    let h = hypotheses(&on_wgpu);
    assert_eq!(h.len(), 12);
    eprintln!("wgpu hypotheses: {h:?}");
    assert_eq!(h, hypotheses(&on_cpu), "wgpu and the CPU decode differently");
    assert_eq!(on_wgpu["overall"], on_cpu["overall"]);
}

/// The GPU kit's summary of CubeCL's memory log (`scripts/gpu/pool_summary.py`) against the
/// pool's own counters in the same run's metrics: the layout with the most pages holds as many
/// bytes as the most the metrics saw reserved (the pool takes pages and keeps them), each sliced
/// pool's pages times its page size add up to that, and buffers were asked of it.
fn pool_layout_agrees_with_the_metrics(
    log: &std::path::Path,
    metrics: &[serde_json::Value],
    dir: &std::path::Path,
) {
    let json = dir.join("pool.json");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/gpu/pool_summary.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(log)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "pool_summary.py: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let reserved = metrics
        .iter()
        .map(|m| m["device_memory"]["reserved_bytes"].as_f64().unwrap())
        .fold(0.0, f64::max);
    // The log prints sizes to three significant digits.
    let printed = s["reserved_bytes"].as_f64().unwrap();
    assert!((printed - reserved).abs() <= 5e-3 * reserved, "log {printed}, metrics {reserved}");
    let pages: f64 = s["pools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["page_bytes"].is_f64() || p["page_bytes"].is_u64())
        .map(|p| p["reserved_bytes"].as_f64().unwrap())
        .sum();
    assert_eq!(pages, reserved, "{s}");
    assert!(s["requests"].as_u64().unwrap() > 0, "{s}");
}
