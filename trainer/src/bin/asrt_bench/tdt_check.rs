//! `tdt-check`: the TDT loss on a device against the float64 CPU path, for each logits type the
//! device stores, at Parakeet-TDT-0.6B's sizes and at edge sizes; with the time of one loss
//! forward + backward against one log-softmax over the same logits (the unit the GPU kit
//! reports). `--dump DIR` also writes one case (inputs, float64 costs and gradients) as `.npy`
//! files, so `bench/tdt_peer.py` can feed the same logits to PyTorch's TDT loss.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use asr_plan::rng::SplitMix64;
use asr_tdt::batch;
use asr_tdt::op::{TdtBackend, TdtProblem};
use asr_tdt::TdtOptions;
use burn::tensor::{activation, DType, Tensor, TensorData, TensorPrimitive};
use serde_json::{json, Value};

use super::{median, sync};

/// One loss input: `[batch, t_max, u_max]` padded sizes, `vocab` token classes with blank.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub name: &'static str,
    pub batch: usize,
    pub t_max: usize,
    pub u_max: usize,
    pub vocab: usize,
}

/// The shapes of a `--sizes` name.
pub fn shapes(sizes: &str) -> anyhow::Result<Vec<Shape>> {
    let s = |name, batch, t_max, u_max, vocab| Shape { name, batch, t_max, u_max, vocab };
    Ok(match sizes {
        // Parakeet-TDT-0.6B: 1024 tokens + blank, 5 durations; 80 ms frames, so 750 frames are
        // 60 s, and 150 tokens about what 60 s of speech holds.
        "parakeet" => vec![
            s("parakeet-b8-t750-u150", 8, 750, 150, 1025),
            s("parakeet-b8-t250-u60", 8, 250, 60, 1025),
            s("edge-one-frame-no-target", 1, 1, 0, 1025),
            s("edge-more-targets-than-frames", 2, 3, 9, 1025),
            s("edge-long-t1500-u1", 2, 1500, 1, 1025),
            s("edge-vocab-2", 3, 40, 12, 2),
            s("edge-u400", 1, 120, 400, 1025),
        ],
        // Seconds on a CPU: for the kit's dry run.
        "small" => vec![
            s("small-b4-t40-u12", 4, 40, 12, 129),
            s("edge-one-frame-no-target", 1, 1, 0, 129),
            s("edge-vocab-2", 3, 20, 6, 2),
        ],
        // Only the case bench/tdt_peer.py is timed on (at Parakeet's sizes).
        "peer" => Vec::new(),
        other => anyhow::bail!("--sizes {other}: expected parakeet, small or peer"),
    })
}

/// The seed of the peer case's logits.
const PEER_SEED: u64 = 7;

/// The case `--dump` writes for the PyTorch comparison.
pub fn peer_shape(sizes: &str) -> Shape {
    match sizes {
        "small" => Shape { name: "peer", batch: 2, t_max: 30, u_max: 8, vocab: 129 },
        _ => Shape { name: "peer", batch: 4, t_max: 300, u_max: 80, vocab: 1025 },
    }
}

struct Case {
    logits: Vec<f32>,
    dims: [usize; 4],
    problem: TdtProblem,
}

/// Random logits in [-3, 3), random targets, ragged lengths (utterance 0 fills the padding).
fn case(shape: &Shape, seed: u64) -> Case {
    let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
    let width = shape.vocab + options.durations.len();
    let Shape { batch, t_max, u_max, vocab, .. } = *shape;
    let mut rng = SplitMix64::new(seed);
    let frame_lens: Vec<usize> =
        (0..batch).map(|i| if i == 0 { t_max } else { t_max - i * t_max / (2 * batch) }).collect();
    let target_lens: Vec<usize> =
        (0..batch).map(|i| if i == 0 { u_max } else { u_max - i * u_max / (2 * batch) }).collect();
    let targets: Vec<u32> =
        (0..batch * u_max).map(|_| rng.below(vocab.max(2) as u64 - 1) as u32).collect();
    let n = batch * t_max * (u_max + 1) * width;
    let logits: Vec<f32> = (0..n).map(|_| (rng.next_f64() * 6.0 - 3.0) as f32).collect();
    Case {
        logits,
        dims: [batch, t_max, u_max + 1, width],
        problem: TdtProblem { targets, u_max, frame_lens, target_lens, options, rnnt: false },
    }
}

/// Float64 costs and gradients of `logits` (the case's, or their rounding to a type).
fn reference(c: &Case, logits: &[f32]) -> anyhow::Result<(Vec<f64>, Vec<f32>)> {
    let p = &c.problem;
    let out = batch::loss(&p.input(logits, c.dims)?, &p.options, false, true)?;
    Ok((out.costs, out.grads.context("no gradient")?))
}

fn dtype_named(name: &str) -> anyhow::Result<DType> {
    Ok(match name {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        other => anyhow::bail!("--dtypes {other}: expected f32, f16 or bf16"),
    })
}

/// Every shape and type on `device`.
pub fn run<B: TdtBackend>(
    device: &B::Device,
    device_name: &str,
    dtypes: &[String],
    sizes: &str,
    repeats: usize,
    dump: Option<&Path>,
) -> anyhow::Result<Value> {
    let dtypes = dtypes.iter().map(|d| dtype_named(d)).collect::<anyhow::Result<Vec<_>>>()?;
    let mut results = Vec::new();
    for (i, shape) in shapes(sizes)?.iter().enumerate() {
        let c = case(shape, 1000 + i as u64);
        for &dtype in &dtypes {
            if !B::supports_dtype(device, dtype) {
                results.push(
                    json!({"case": shape.name, "dtype": dtype_name(dtype), "supported": false}),
                );
                continue;
            }
            let want = reference(&c, &rounded(&c.logits, c.dims, dtype)?)?;
            results.push(check::<B>(device, shape, &c, dtype, &want, repeats)?);
        }
    }
    // The case PyTorch's loss is timed on too (bench/tdt_peer.py reads the dump), f32 only.
    let peer = peer_shape(sizes);
    let c = case(&peer, PEER_SEED);
    let want = reference(&c, &c.logits)?;
    results.push(check::<B>(device, &peer, &c, DType::F32, &want, repeats)?);
    if let Some(dir) = dump {
        write_peer_case(dir, &c, &want)?;
    }
    Ok(json!({
        "bench": "tdt-check", "device": device_name, "cases": results,
        "loaded_libraries": loaded_libraries(),
    }))
}

fn dtype_name(dtype: DType) -> String {
    format!("{dtype:?}").to_lowercase()
}

/// `logits` as `dtype` stores them, read back as f32 (what the device's loss reads).
fn rounded(logits: &[f32], dims: [usize; 4], dtype: DType) -> anyhow::Result<Vec<f32>> {
    if dtype == DType::F32 {
        return Ok(logits.to_vec());
    }
    TensorData::new(logits.to_vec(), dims)
        .convert_dtype(dtype)
        .convert::<f32>()
        .to_vec()
        .map_err(|e| anyhow::anyhow!("{e:?}"))
}

/// The loss on the device with logits stored as `dtype`, against `want` (the float64 path's
/// costs and gradients on the same rounded logits), and timed.
fn check<B: TdtBackend>(
    device: &B::Device,
    shape: &Shape,
    c: &Case,
    dtype: DType,
    (want_c, want_g): &(Vec<f64>, Vec<f32>),
    repeats: usize,
) -> anyhow::Result<Value> {
    let x = Tensor::<B, 4>::from_data(
        TensorData::new(c.logits.clone(), c.dims).convert_dtype(dtype),
        (device, dtype),
    );
    sync::<B>(device)?;
    let mut loss_s = Vec::new();
    let mut softmax_s = Vec::new();
    let mut got = None;
    for _ in 0..repeats.max(1) {
        // A fresh buffer each time, as the joint's output is in training: the loss may write
        // its gradient over it.
        let z = x.clone().mul_scalar(1.0);
        sync::<B>(device)?;
        let s = Instant::now();
        let (costs, grads) = B::tdt_forward(z.into_primitive().tensor(), &c.problem, true)?;
        sync::<B>(device)?;
        loss_s.push(s.elapsed().as_secs_f64());
        got = Some((costs, grads.context("no gradient")?));

        let s = Instant::now();
        let y = activation::log_softmax(x.clone(), 3);
        sync::<B>(device)?;
        softmax_s.push(s.elapsed().as_secs_f64());
        drop(y);
    }
    let (costs, grads) = got.context("no repeat ran")?;
    let costs = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(costs));
    let grads = Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(grads));
    let got_c: Vec<f64> =
        costs.into_data().convert::<f64>().to_vec().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let got_g: Vec<f32> =
        grads.into_data().convert::<f32>().to_vec().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let finite = |x: f64| if x.is_finite() { x } else { f64::NAN };
    let cost_rel = got_c
        .iter()
        .zip(want_c)
        .map(|(g, w)| if g == w { 0.0 } else { (g - w).abs() / w.abs() })
        .fold(0.0, f64::max);
    let grad_abs =
        got_g.iter().zip(want_g).map(|(g, w)| f64::from((g - w).abs())).fold(0.0, f64::max);
    let grad_scale = want_g.iter().map(|w| f64::from(w.abs())).fold(0.0, f64::max);
    let (l, sm) = (median(loss_s.clone()), median(softmax_s.clone()));
    Ok(json!({
        "case": shape.name, "dtype": dtype_name(dtype), "supported": true, "dims": c.dims,
        "costs": want_c.iter().map(|&x| finite(x)).collect::<Vec<_>>(),
        "max_relative_cost_error": finite(cost_rel),
        "max_abs_gradient_error": finite(grad_abs),
        "max_abs_gradient": grad_scale,
        "loss_forward_backward_seconds": l, "log_softmax_seconds": sm,
        "loss_over_log_softmax": l / sm,
        "all": {"loss": loss_s, "log_softmax": softmax_s},
    }))
}

/// Writes `values` as a NumPy `.npy` file (format 1.0, little-endian, C order).
fn write_npy(path: &Path, descr: &str, shape: &[usize], bytes: &[u8]) -> anyhow::Result<()> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let tuple =
        if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple}, }}");
    // Magic (6) + version (2) + length (2) + header + newline, padded to a multiple of 64.
    let pad = (64 - (10 + header.len() + 1) % 64) % 64;
    header.push_str(&" ".repeat(pad));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + bytes.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&u16::try_from(header.len())?.to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(bytes);
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

fn write_peer_case(
    dir: &Path,
    c: &Case,
    (costs, grads): &(Vec<f64>, Vec<f32>),
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let p = &c.problem;
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let i64s = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let lens = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
    let targets: Vec<i64> = p.targets.iter().map(|&x| i64::from(x)).collect();
    write_npy(&dir.join("logits.npy"), "<f4", &c.dims, &f32s(&c.logits))?;
    write_npy(&dir.join("targets.npy"), "<i8", &[c.dims[0], p.u_max], &i64s(&targets))?;
    write_npy(&dir.join("frame_lens.npy"), "<i8", &[c.dims[0]], &i64s(&lens(&p.frame_lens)))?;
    write_npy(&dir.join("target_lens.npy"), "<i8", &[c.dims[0]], &i64s(&lens(&p.target_lens)))?;
    let cost_bytes: Vec<u8> = costs.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_npy(&dir.join("costs.npy"), "<f8", &[c.dims[0]], &cost_bytes)?;
    write_npy(&dir.join("grads.npy"), "<f4", &c.dims, &f32s(grads))?;
    let meta = json!({
        "durations": p.options.durations, "sigma": p.options.sigma, "blank": c.dims[3] - p.options.durations.len() - 1,
        "note": "costs and grads: asrt's float64 CPU path, per utterance, no reduction",
    });
    std::fs::write(dir.join("case.json"), serde_json::to_string_pretty(&meta)?)?;
    Ok(())
}

/// The CUDA, NVRTC and NCCL libraries this process has loaded (from `/proc/self/maps`): which
/// files the dynamic loader actually picked.
fn loaded_libraries() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut libs: Vec<String> = asr_trainer::cuda_env::mapped_files(&maps)
        .map(|p| p.display().to_string())
        .filter(|p| ["libcuda", "libnvrtc", "libnccl", "libvulkan"].iter().any(|n| p.contains(n)))
        .collect();
    libs.sort();
    libs.dedup();
    libs
}
