//! `matmul`: each of `--matmul`'s kernels (`model::device_matmul`) at the 0.6B preset's linear
//! products, forward and both gradients' forms: median time per product, TFLOP/s, and the
//! largest error against float64 on sampled outputs (relative to the sum of the terms'
//! magnitudes; TF32 on CUDA's tensor cores gives about 1e-3). A kernel the device cannot run is
//! listed with cubek's reason. Which kernel to train with (`asrt train --matmul`) is this
//! table's fastest correct one. With `--operands bf16` (or `f16`) the operands are rounded to
//! that type first and multiplied as mixed precision's products take them (`device_mixed`: the
//! half type in, f32 out), against float64 on the rounded values.
//!
//! `--sizes attention` times the attention's stacks of products instead (`[B, H, m, k] · [B or
//! 1, H, k, n]`, forward and gradients' forms, one summed over the batch), as `--matmul cublas`
//! takes them: Burn's product (`burn`) and cuBLAS's strided-batched calls (`cublas`); the other
//! kernels take no stacks and are listed as unavailable.

use std::time::Instant;

use asr_plan::rng::SplitMix64;
use asr_trainer::{try_matmul as try_bare, try_stacked_matmul, MatmulKernel as Kernel};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use serde_json::{json, Value};

use super::{median, sync, Operands};

/// One product `a [m, k] · b [k, n]` (or a stack of them); `a_t`/`b_t`: the operand is a
/// transposed view (as the weight's gradient reads the input and the input's gradient the
/// weight).
struct Case {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    a_t: bool,
    b_t: bool,
    /// A stack `[outer, heads, m, k] · [b_outer, heads, k, n]` (`b_outer` 1: read by every
    /// outer index), summed over the outer axis where `sum_outer`; `None`: one matrix product.
    stack: Option<StackCase>,
}

/// A case's stack axes.
#[derive(Clone, Copy)]
struct StackCase {
    outer: usize,
    heads: usize,
    b_outer: usize,
    sum_outer: bool,
}

impl Case {
    /// The outer size of the product (1 where summed) and of `a` and `b`, and the heads.
    fn axes(&self) -> (usize, usize, usize, usize) {
        match self.stack {
            None => (1, 1, 1, 1),
            Some(s) => (if s.sum_outer { 1 } else { s.outer }, s.outer, s.b_outer, s.heads),
        }
    }
}

/// Errors above this are a wrong kernel, not rounding (TF32: about 1e-3; operands already in
/// the half type are multiplied exactly, the sums rounded in f32).
const WRONG: f64 = 1e-2;

fn cases(sizes: &str) -> anyhow::Result<Vec<Case>> {
    let c = |name, m, k, n, a_t, b_t| Case { name, m, k, n, a_t, b_t, stack: None };
    // The attention's stacks at batch `b`, `h` heads of `dk`, `t` frames (positions 2t - 1).
    let attention = |b: usize, h: usize, t: usize, dk: usize| {
        let s = |b_outer, sum_outer| Some(StackCase { outer: b, heads: h, b_outer, sum_outer });
        let p = 2 * t - 1;
        vec![
            Case { stack: s(b, false), ..c("scores forward (q kT)", t, dk, t, false, true) },
            Case {
                stack: s(1, false),
                ..c("position scores forward (q rT)", t, dk, p, false, true)
            },
            Case { stack: s(b, false), ..c("context forward (w v)", t, t, dk, false, false) },
            Case {
                stack: s(1, false),
                ..c("query grad from positions (dbd r)", t, p, dk, false, false)
            },
            Case {
                stack: s(b, true),
                ..c("position grad, summed (qT dbd)", dk, t, p, true, false)
            },
        ]
    };
    Ok(match sizes {
        // 1440 rows: about 115 s of audio at 80 ms frames, the kit's d batch; the feed-forward
        // (1024 -> 4096 -> 1024) and the attention's projections (1024 -> 1024).
        "parakeet" => vec![
            c("ff-up forward", 1440, 1024, 4096, false, false),
            c("ff-down forward", 1440, 4096, 1024, false, false),
            c("ff-up input grad (dy wT)", 1440, 4096, 1024, false, true),
            c("ff-up weight grad (xT dy)", 1024, 1440, 4096, true, false),
            c("projection forward", 1440, 1024, 1024, false, false),
        ],
        "small" => vec![
            c("forward", 96, 64, 80, false, false),
            c("input grad (dy wT)", 96, 80, 64, false, true),
            c("weight grad (xT dy)", 64, 96, 80, true, false),
        ],
        // The kit's batch: 1440 frames as 6 utterances of 240 (8 heads of 128).
        "attention" => attention(6, 8, 240, 128),
        "attention-small" => attention(3, 2, 12, 8),
        other => {
            anyhow::bail!("--sizes {other}: expected parakeet, small, attention or attention-small")
        }
    })
}

/// A `[rows, cols]` operand of values in [-1, 1) of type `operands`, as a transposed view of
/// its transpose when `transposed` (rounded in memory, then viewed, as mixed precision's
/// rounding keeps a view's strides); and its values row-major in the logical layout, as that
/// type holds them.
fn operand<B: Backend>(
    rows: usize,
    cols: usize,
    transposed: bool,
    operands: Operands,
    rng: &mut SplitMix64,
    device: &B::Device,
) -> (Tensor<B, 2>, Vec<f64>) {
    let values: Vec<f32> = (0..rows * cols).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32).collect();
    let logical = values.iter().map(|&v| f64::from(operands.round(v))).collect();
    let stored = if transposed {
        // Stored as [cols, rows] with the logical (r, c) at (c, r).
        let mut stored = vec![0.0f32; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                stored[c * rows + r] = values[r * cols + c];
            }
        }
        Tensor::<B, 2>::from_data(TensorData::new(stored, [cols, rows]), device)
    } else {
        Tensor::<B, 2>::from_data(TensorData::new(values, [rows, cols]), device)
    };
    let stored = match operands.dtype() {
        Some(dtype) => stored.cast(dtype),
        None => stored,
    };
    (if transposed { stored.transpose() } else { stored }, logical)
}

/// A `[outer, heads, rows, cols]` stack as [`operand`] makes a matrix: each matrix stored
/// transposed when `transposed` (a view of the last two axes swapped); its values row-major in
/// the logical layout.
fn stack_operand<B: Backend>(
    [outer, heads, rows, cols]: [usize; 4],
    transposed: bool,
    operands: Operands,
    rng: &mut SplitMix64,
    device: &B::Device,
) -> (Tensor<B, 4>, Vec<f64>) {
    let count = outer * heads;
    let values: Vec<f32> =
        (0..count * rows * cols).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32).collect();
    let logical = values.iter().map(|&v| f64::from(operands.round(v))).collect();
    let stored = if transposed {
        let mut stored = vec![0.0f32; values.len()];
        for (from, to) in values.chunks(rows * cols).zip(stored.chunks_mut(rows * cols)) {
            for r in 0..rows {
                for c in 0..cols {
                    to[c * rows + r] = from[r * cols + c];
                }
            }
        }
        Tensor::<B, 4>::from_data(TensorData::new(stored, [outer, heads, cols, rows]), device)
    } else {
        Tensor::<B, 4>::from_data(TensorData::new(values, [outer, heads, rows, cols]), device)
    };
    let stored = match operands.dtype() {
        Some(dtype) => stored.cast(dtype),
        None => stored,
    };
    (if transposed { stored.swap_dims(2, 3) } else { stored }, logical)
}

/// A case's operands, on the device and in float64.
enum Pair<B: Backend> {
    Matrices(Tensor<B, 2>, Tensor<B, 2>),
    Stacks(Tensor<B, 4>, Tensor<B, 4>, bool),
}

impl<B: Backend> Pair<B> {
    /// The product with `kernel`, its values row-major, or why it could not run; `None` off
    /// the CubeCL types.
    fn run(&self, kernel: Kernel) -> Option<Result<Tensor<B, 1>, String>> {
        Some(match self {
            Pair::Matrices(a, b) => try_bare(a, b, kernel)?.map(|y| y.flatten(0, 1)),
            Pair::Stacks(a, b, sum) => {
                try_stacked_matmul(a, b, kernel, *sum)?.map(|y| y.flatten(0, 3))
            }
        })
    }
}

/// Every kernel on every case of `sizes`.
pub fn run<B: Backend>(
    device: &B::Device,
    device_name: &str,
    kernels: &[Kernel],
    sizes: &str,
    repeats: usize,
    operands: Operands,
) -> anyhow::Result<Value> {
    let mut rng = SplitMix64::new(11);
    let mut rows = Vec::new();
    for case in cases(sizes)? {
        let (outer, a_outer, b_outer, heads) = case.axes();
        let Case { name, m, k, n, a_t, b_t, stack } = case;
        let (pair, av, bv) = match stack {
            None => {
                let (a, av) = operand::<B>(m, k, a_t, operands, &mut rng, device);
                let (b, bv) = operand::<B>(k, n, b_t, operands, &mut rng, device);
                (Pair::Matrices(a, b), av, bv)
            }
            Some(s) => {
                let da = [a_outer, heads, m, k];
                let (a, av) = stack_operand::<B>(da, a_t, operands, &mut rng, device);
                let db = [b_outer, heads, k, n];
                let (b, bv) = stack_operand::<B>(db, b_t, operands, &mut rng, device);
                (Pair::Stacks(a, b, s.sum_outer), av, bv)
            }
        };
        // The outer indices each output sums over: its own, or all where summed.
        let summed = stack.is_some_and(|s| s.sum_outer);
        let all = a_outer.max(b_outer);
        let sources = |o: usize| if summed { 0..all } else { o..o + 1 };
        // 512 sampled outputs `(o, h, i, j)` in float64, with their terms' magnitudes summed.
        let samples: Vec<[usize; 4]> = (0..512)
            .map(|_| {
                let mut d = |x: usize| rng.below(x as u64) as usize;
                [d(outer), d(heads), d(m), d(n)]
            })
            .collect();
        let want: Vec<(f64, f64)> = samples
            .iter()
            .map(|&[o, h, i, j]| {
                let mut sum = (0.0, 0.0);
                for x in sources(o) {
                    let (xa, xb) =
                        (if a_outer == 1 { 0 } else { x }, if b_outer == 1 { 0 } else { x });
                    let (ma, mb) = ((xa * heads + h) * m * k, (xb * heads + h) * k * n);
                    for p in 0..k {
                        let t = av[ma + i * k + p] * bv[mb + p * n + j];
                        sum = (sum.0 + t, sum.1 + t.abs());
                    }
                }
                sum
            })
            .collect();
        let at = |[o, h, i, j]: [usize; 4]| ((o * heads + h) * m + i) * n + j;
        let products = all * heads;
        let flops = 2.0 * (products * m * k * n) as f64;
        for &kernel in kernels {
            let start = Instant::now();
            let first = match pair.run(kernel) {
                None => anyhow::bail!("matmul runs on wgpu or cuda:N, not {device_name}"),
                Some(Err(why)) => {
                    rows.push(json!({"case": name, "kernel": kernel.name(), "available": false,
                                     "why": why.chars().take(300).collect::<String>()}));
                    continue;
                }
                Some(Ok(y)) => y,
            };
            let got = first.into_data().into_vec::<f32>().map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let first_s = start.elapsed().as_secs_f64();
            let error = samples
                .iter()
                .zip(&want)
                .map(|(&s, &(w, mag))| (f64::from(got[at(s)]) - w).abs() / mag.max(1e-30))
                .fold(0.0, f64::max);
            // Launches in a row, then one wait: the device's time per product, not the host's
            // round trip.
            let inner = if products * m * k * n > 1 << 24 { 20 } else { 5 };
            let mut times = Vec::new();
            for _ in 0..repeats.max(1) {
                sync::<B>(device)?;
                let t = Instant::now();
                for _ in 0..inner {
                    let _ = pair.run(kernel);
                }
                sync::<B>(device)?;
                times.push(t.elapsed().as_secs_f64() / inner as f64);
            }
            let seconds = median(times);
            rows.push(json!({
                "case": name, "kernel": kernel.name(), "available": true,
                "m": m, "k": k, "n": n, "batch": [a_outer, b_outer, heads], "summed": summed,
                "seconds": seconds, "tflops": flops / seconds / 1e12,
                "first_seconds": first_s, "max_error": error, "correct": error <= WRONG,
            }));
        }
    }
    // Per kernel: the sum of its median times over the cases, where it ran all of them right.
    let mut totals = Vec::new();
    for &kernel in kernels {
        let mine: Vec<&Value> = rows.iter().filter(|r| r["kernel"] == kernel.name()).collect();
        let all_ok =
            !mine.is_empty() && mine.iter().all(|r| r["available"] == true && r["correct"] == true);
        let total: f64 = mine.iter().filter_map(|r| r["seconds"].as_f64()).sum();
        totals.push(json!({"kernel": kernel.name(), "all_cases_correct": all_ok,
                           "total_seconds": if all_ok { json!(total) } else { Value::Null }}));
    }
    let best = totals
        .iter()
        .filter_map(|t| Some((t["kernel"].as_str()?, t["total_seconds"].as_f64()?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, s)| json!({"kernel": k, "total_seconds": s}));
    Ok(json!({
        "bench": "matmul", "device": device_name, "sizes": sizes, "repeats": repeats,
        "operands": operands.name(),
        "error_bound": WRONG, "results": rows, "totals": totals, "fastest_correct": best,
    }))
}
