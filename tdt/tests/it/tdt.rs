//! The TDT loss against independent truth: brute-force enumeration of every alignment in
//! float64, finite differences, NeMo's golden values, identities; greedy decoding on scripted
//! joints.

use asr_tdt::batch::{self, BatchInput};
use asr_tdt::cpu::{rnnt_utterance, tdt_utterance, Dims};
use asr_tdt::greedy::{greedy_batch, GreedyOptions, Hypothesis, TdtDecoderModel};
use asr_tdt::{Reduction, TdtError, TdtOptions};

use asr_corpus::synth::SplitMix64;

fn lse(xs: &[f64]) -> f64 {
    let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// Which arcs a brute-force lattice allows: TDT (every arc, duration factor) or the RNN-T
/// restriction (blank d = 1, label d = 0, no duration factor, no sigma).
#[derive(Clone, Copy)]
enum Lattice {
    Tdt,
    Rnnt,
}

/// log P(y|x) by enumerating every complete path. `logits[t][u]` is one node's `V + D` values.
fn brute_log_p(
    logits: &[Vec<Vec<f64>>],
    v: usize,
    targets: &[usize],
    durs: &[usize],
    sigma: f64,
    lattice: Lattice,
) -> f64 {
    let t_n = logits.len();
    let u_n = targets.len();
    let tok = |t: usize, u: usize, k: usize| {
        let z = &logits[t][u];
        z[k] - lse(&z[..v])
    };
    let dur = |t: usize, u: usize, i: usize| {
        let z = &logits[t][u];
        z[v + i] - lse(&z[v..])
    };
    let mut complete = Vec::new();
    // Depth-first over (t, u, log-probability so far).
    let mut stack = vec![(0usize, 0usize, 0.0f64)];
    while let Some((t, u, acc)) = stack.pop() {
        match lattice {
            Lattice::Tdt => {
                for (i, &d) in durs.iter().enumerate() {
                    let wd = dur(t, u, i);
                    if d > 0 {
                        let w = acc + tok(t, u, v - 1) - sigma + wd;
                        if t + d < t_n {
                            stack.push((t + d, u, w));
                        } else if t + d == t_n && u == u_n {
                            complete.push(w);
                        }
                    }
                    if u < u_n && t + d < t_n {
                        stack.push((t + d, u + 1, acc + tok(t, u, targets[u]) - sigma + wd));
                    }
                }
            }
            Lattice::Rnnt => {
                let w = acc + tok(t, u, v - 1);
                if t + 1 < t_n {
                    stack.push((t + 1, u, w));
                } else if u == u_n {
                    complete.push(w);
                }
                if u < u_n {
                    stack.push((t, u + 1, acc + tok(t, u, targets[u])));
                }
            }
        }
    }
    lse(&complete)
}

/// Random logits for one utterance block `[t_max][u_max + 1][width]`, values in [-2, 2] that are
/// exactly representable as f32.
fn random_block(rng: &mut SplitMix64, t_max: usize, u_max: usize, width: usize) -> Vec<f32> {
    (0..t_max * (u_max + 1) * width).map(|_| (rng.next_f64() * 4.0 - 2.0) as f32).collect()
}

fn nested(block: &[f32], t: usize, u_max: usize, width: usize, u: usize) -> Vec<Vec<Vec<f64>>> {
    (0..t)
        .map(|ti| {
            (0..=u)
                .map(|ui| {
                    let at = (ti * (u_max + 1) + ui) * width;
                    block[at..at + width].iter().map(|&x| f64::from(x)).collect()
                })
                .collect()
        })
        .collect()
}

fn opts(durations: &[usize], sigma: f64) -> TdtOptions {
    TdtOptions { durations: durations.to_vec(), sigma, omega: 0.0, ..TdtOptions::default() }
}

#[test]
fn tdt_matches_brute_force_and_finite_differences() {
    let mut rng = SplitMix64::new(11);
    let duration_sets: [&[usize]; 6] =
        [&[0, 1, 2], &[1, 2, 3], &[0, 1, 2, 3, 4], &[1], &[0, 1], &[0, 2, 3]];
    let v = 4; // three tokens + blank
    let mut checked = 0;
    for durs in duration_sets {
        for t in 1..=4usize {
            for u in 0..=2usize {
                let (t_max, u_max) = (t + 1, u + 1); // padding on both axes
                let width = v + durs.len();
                let block = random_block(&mut rng, t_max, u_max, width);
                let targets: Vec<u32> = (0..u).map(|_| rng.below(3) as u32).collect();
                let dims = Dims { t_max, u_max, vocab: v, n_dur: durs.len(), t, u };
                let o = opts(durs, 0.05);
                let mut grad = vec![0f32; block.len()];
                let cost = tdt_utterance(&block, &dims, &targets, &o, Some(&mut grad));
                let tg: Vec<usize> = targets.iter().map(|&x| x as usize).collect();
                let truth = -brute_log_p(
                    &nested(&block, t, u_max, width, u),
                    v,
                    &tg,
                    durs,
                    0.05,
                    Lattice::Tdt,
                );
                if truth.is_infinite() {
                    assert!(
                        cost.is_infinite() && grad.iter().all(|&g| g == 0.0),
                        "{durs:?} T={t} U={u}"
                    );
                    continue;
                }
                assert!(
                    (cost - truth).abs() < 1e-6 * truth.abs().max(1.0),
                    "{durs:?} T={t} U={u}: {cost} vs {truth}"
                );
                // Finite differences of the brute-force loss, for every logit of the valid region.
                let h = 1e-4;
                for ti in 0..t {
                    for ui in 0..=u {
                        for k in 0..width {
                            let at = (ti * (u_max + 1) + ui) * width + k;
                            let f = |delta: f64| {
                                let mut n = nested(&block, t, u_max, width, u);
                                n[ti][ui][k] += delta;
                                -brute_log_p(&n, v, &tg, durs, 0.05, Lattice::Tdt)
                            };
                            let fd = (f(h) - f(-h)) / (2.0 * h);
                            assert!(
                                (f64::from(grad[at]) - fd).abs() < 2e-5,
                                "{durs:?} T={t} U={u} t={ti} u={ui} k={k}: {} vs {fd}",
                                grad[at]
                            );
                        }
                    }
                }
                // Padding: zero gradient.
                for ti in 0..t_max {
                    for ui in 0..=u_max {
                        if ti >= t || ui > u {
                            let at = (ti * (u_max + 1) + ui) * width;
                            assert!(grad[at..at + width].iter().all(|&g| g == 0.0));
                        }
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 50, "only {checked} possible cases");
}

#[test]
fn rnnt_matches_the_restricted_lattice() {
    let mut rng = SplitMix64::new(5);
    let v = 5;
    for t in 1..=4usize {
        for u in 0..=3usize {
            let block = random_block(&mut rng, t, u, v);
            let targets: Vec<u32> = (0..u).map(|_| rng.below(4) as u32).collect();
            let dims = Dims { t_max: t, u_max: u, vocab: v, n_dur: 0, t, u };
            let mut grad = vec![0f32; block.len()];
            let cost = rnnt_utterance(&block, &dims, &targets, Some(&mut grad));
            let tg: Vec<usize> = targets.iter().map(|&x| x as usize).collect();
            let truth = -brute_log_p(&nested(&block, t, u, v, u), v, &tg, &[], 0.0, Lattice::Rnnt);
            assert!((cost - truth).abs() < 1e-6 * truth.max(1.0), "T={t} U={u}");
            let grad_sum: f64 = grad.iter().map(|&g| f64::from(g)).sum();
            assert!(grad_sum.abs() < 1e-4, "softmax gradients sum to zero per node");
        }
    }
}

/// NeMo `TestTDTLoss.test_case_fixed_case_act_label`: zero logits [1, 3, 2, 7], durations
/// [0, 1, 2], sigma 0.05, labels [[0]] (3 tokens + blank), reduction sum.
#[test]
fn nemo_tdt_golden_values() {
    let block = vec![0f32; 3 * 2 * 7];
    let dims = Dims { t_max: 3, u_max: 1, vocab: 4, n_dur: 3, t: 3, u: 1 };
    let mut grad = vec![0f32; block.len()];
    let cost = tdt_utterance(&block, &dims, &[0], &opts(&[0, 1, 2], 0.05), Some(&mut grad));
    assert!((cost - 4.155739).abs() <= 1e-6 * 4.155739, "cost {cost}");
    let expected: [[f64; 7]; 6] = [
        [-0.64962804, 0.25, 0.25, 0.14962798, 0.2672583, -0.16792619, -0.09933221],
        [0.01651875, 0.01651875, 0.01651875, -0.04955626, 0.022025, -0.01227201, -0.009753],
        [-0.04892651, 0.01714851, 0.01714851, 0.01462949, -0.01143234, -0.01143234, 0.02286467],
        [0.12531489, 0.12531489, 0.12531489, -0.37594467, 0.16708651, 0.13027048, -0.29735702],
        [-0.02572276, 0.00857425, 0.00857425, 0.00857425, -0.02286468, 0.01143234, 0.01143234],
        [0.13388914, 0.13388914, 0.13388914, -0.40166742, 0.17851885, -0.35703772, 0.17851885],
    ];
    for (row, exp) in expected.iter().enumerate() {
        for (k, &e) in exp.iter().enumerate() {
            let g = f64::from(grad[row * 7 + k]);
            assert!((g - e).abs() <= 1e-6 + 1e-4 * e.abs(), "node {row} logit {k}: {g} vs {e}");
        }
    }
}

/// NeMo `TestRNNTLossPytorch.test_case_small` (blank 0 there; blank is last here, so classes
/// are rotated).
#[test]
fn nemo_rnnt_golden_values() {
    let acts: [[[f32; 5]; 3]; 2] = [
        [[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.6, 0.1, 0.1], [0.1, 0.1, 0.2, 0.8, 0.1]],
        [[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.2, 0.1, 0.1], [0.7, 0.1, 0.2, 0.1, 0.1]],
    ];
    let expected: [[[f64; 5]; 3]; 2] = [
        [
            [-0.13116688, -0.3999269, 0.17703125, 0.17703125, 0.17703125],
            [-0.18572757, 0.12247056, -0.18168412, 0.12247056, 0.12247056],
            [-0.32091254, 0.06269141, 0.06928472, 0.12624499, 0.06269141],
        ],
        [
            [0.05456069, -0.21824276, 0.05456069, 0.05456069, 0.05456069],
            [0.12073959, 0.12073959, -0.48295835, 0.12073959, 0.12073959],
            [-0.6925882, 0.16871116, 0.18645467, 0.16871116, 0.16871116],
        ],
    ];
    // NeMo class k -> our class (k + 4) % 5: blank 0 -> 4, token k -> k - 1.
    let ours = |k: usize| (k + 4) % 5;
    let mut block = vec![0f32; 2 * 3 * 5];
    for t in 0..2 {
        for u in 0..3 {
            for k in 0..5 {
                block[(t * 3 + u) * 5 + ours(k)] = acts[t][u][k];
            }
        }
    }
    let dims = Dims { t_max: 2, u_max: 2, vocab: 5, n_dur: 0, t: 2, u: 2 };
    let mut grad = vec![0f32; block.len()];
    let cost = rnnt_utterance(&block, &dims, &[0, 1], Some(&mut grad));
    assert!((cost - 4.495666).abs() <= 1e-6 * 4.495666, "cost {cost}");
    for t in 0..2 {
        for u in 0..3 {
            for k in 0..5 {
                let g = f64::from(grad[(t * 3 + u) * 5 + ours(k)]);
                assert!((g - expected[t][u][k]).abs() <= 1e-6, "t={t} u={u} k={k}: {g}");
            }
        }
    }
}

#[test]
fn ragged_batch_equals_one_by_one_and_ignores_padding() {
    let mut rng = SplitMix64::new(3);
    let (b, t_max, u_max, v) = (4usize, 7usize, 4usize, 6usize);
    let durs = [0usize, 1, 2, 3, 4];
    let width = v + durs.len();
    let frame_lens = [7usize, 3, 5, 1];
    let target_lens = [4usize, 2, 0, 1];
    let mut logits = random_block(&mut rng, b * t_max, u_max, width);
    let targets: Vec<u32> = (0..b * u_max).map(|_| rng.below((v - 1) as u64) as u32).collect();
    // Garbage in the padding must not matter.
    let block = t_max * (u_max + 1) * width;
    for bi in 0..b {
        for t in 0..t_max {
            for u in 0..=u_max {
                if t >= frame_lens[bi] || u > target_lens[bi] {
                    let at = bi * block + (t * (u_max + 1) + u) * width;
                    logits[at..at + width].fill(f32::NAN);
                }
            }
        }
    }
    let o = TdtOptions { reduction: Reduction::MeanBatch, ..opts(&durs, 0.02) };
    let input = BatchInput {
        logits: &logits,
        batch: b,
        t_max,
        u_max,
        vocab: v,
        n_dur: durs.len(),
        targets: &targets,
        frame_lens: &frame_lens,
        target_lens: &target_lens,
    };
    let out = batch::loss(&input, &o, false, true).unwrap();
    let grads = out.grads.unwrap();
    for bi in 0..b {
        // The same utterance alone, cropped to its own lengths.
        let (t, u) = (frame_lens[bi], target_lens[bi]);
        let mut own = Vec::new();
        for ti in 0..t {
            for ui in 0..=u {
                let at = bi * block + (ti * (u_max + 1) + ui) * width;
                own.extend_from_slice(&logits[at..at + width]);
            }
        }
        let dims = Dims { t_max: t, u_max: u, vocab: v, n_dur: durs.len(), t, u };
        let mut g = vec![0f32; own.len()];
        let c = tdt_utterance(&own, &dims, &targets[bi * u_max..bi * u_max + u], &o, Some(&mut g));
        assert!(c.is_finite());
        assert_eq!(out.costs[bi], c, "utterance {bi}");
        for ti in 0..t {
            for ui in 0..=u {
                let at = bi * block + (ti * (u_max + 1) + ui) * width;
                assert_eq!(
                    &grads[at..at + width],
                    &g[(ti * (u + 1) + ui) * width..(ti * (u + 1) + ui + 1) * width]
                );
            }
        }
    }
    assert!(grads.iter().all(|g| g.is_finite()), "padding gradient must be zero, not NaN");
    let (loss, factors) = batch::reduce(&out.costs, &target_lens, Reduction::MeanBatch);
    assert!((loss - out.costs.iter().sum::<f64>() / 4.0).abs() < 1e-12);
    assert_eq!(factors, vec![0.25; 4]);
    let (vol, _) = batch::reduce(&out.costs, &target_lens, Reduction::MeanVolume);
    assert!((vol - out.costs.iter().sum::<f64>() / 7.0).abs() < 1e-12);
}

#[test]
fn impossible_alignments_give_inf_or_zero_never_nan() {
    // Durations without 0 cannot emit 3 labels in 2 frames.
    let v = 3;
    let durs = [1usize, 2];
    let block = vec![0.5f32; 2 * 4 * (v + 2)];
    let dims = Dims { t_max: 2, u_max: 3, vocab: v, n_dur: 2, t: 2, u: 3 };
    let mut g = vec![1f32; block.len()];
    let c = tdt_utterance(&block, &dims, &[0, 1, 0], &opts(&durs, 0.0), Some(&mut g));
    assert_eq!(c, f64::INFINITY);
    assert!(g.iter().all(|&x| x == 0.0));
    let o = TdtOptions { zero_infinity: true, ..opts(&durs, 0.0) };
    let input = BatchInput {
        logits: &block,
        batch: 1,
        t_max: 2,
        u_max: 3,
        vocab: v,
        n_dur: 2,
        targets: &[0, 1, 0],
        frame_lens: &[2],
        target_lens: &[3],
    };
    let out = batch::loss(&input, &o, false, true).unwrap();
    assert_eq!(out.costs, vec![0.0]);
}

#[test]
fn fastemit_and_clamp_change_only_token_gradients() {
    let mut rng = SplitMix64::new(8);
    let (t, u, v) = (4usize, 2usize, 4usize);
    let durs = [0usize, 1, 2];
    let width = v + 3;
    let block = random_block(&mut rng, t, u, width);
    let dims = Dims { t_max: t, u_max: u, vocab: v, n_dur: 3, t, u };
    let mut g0 = vec![0f32; block.len()];
    let mut g1 = vec![0f32; block.len()];
    let c0 = tdt_utterance(&block, &dims, &[1, 2], &opts(&durs, 0.02), Some(&mut g0));
    let o1 = TdtOptions { fastemit_lambda: 0.01, ..opts(&durs, 0.02) };
    let c1 = tdt_utterance(&block, &dims, &[1, 2], &o1, Some(&mut g1));
    assert!((c1 - c0 * 1.01).abs() < 1e-9);
    for node in 0..t * (u + 1) {
        let r = node * width;
        assert_eq!(&g0[r + v..r + width], &g1[r + v..r + width], "duration gradients unchanged");
    }
    assert!(g0.iter().zip(&g1).any(|(a, b)| a != b));
    let o2 = TdtOptions { clamp: 0.05, ..opts(&durs, 0.02) };
    let mut g2 = vec![0f32; block.len()];
    tdt_utterance(&block, &dims, &[1, 2], &o2, Some(&mut g2));
    for node in 0..t * (u + 1) {
        let r = node * width;
        assert!(g2[r..r + v].iter().all(|x| x.abs() <= 0.05 + 1e-7));
        assert_eq!(&g0[r + v..r + width], &g2[r + v..r + width]);
    }
}

#[test]
fn bad_inputs_are_errors() {
    let block = vec![0f32; 2 * 2 * 6];
    let good = BatchInput {
        logits: &block,
        batch: 1,
        t_max: 2,
        u_max: 1,
        vocab: 3,
        n_dur: 3,
        targets: &[0],
        frame_lens: &[2],
        target_lens: &[1],
    };
    let o = opts(&[0, 1, 2], 0.0);
    assert!(batch::loss(&good, &o, false, true).is_ok());
    let err =
        |input: &BatchInput<'_>, o: &TdtOptions| batch::loss(input, o, false, true).unwrap_err();
    assert_eq!(
        err(&BatchInput { targets: &[2], ..good }, &o),
        TdtError::Target { utterance: 0, position: 0, id: 2, blank: 2 },
        "blank as target"
    );
    assert_eq!(
        err(&BatchInput { frame_lens: &[3], ..good }, &o),
        TdtError::UtteranceLengths { utterance: 0, frames: 3, targets: 1, t_max: 2, u_max: 1 }
    );
    assert_eq!(
        err(&BatchInput { n_dur: 2, ..good }, &o),
        TdtError::DurationLogits { logits: 2, durations: 3 }
    );
    assert_eq!(err(&good, &opts(&[1, 0], 0.0)), TdtError::Durations(vec![1, 0]));
    assert_eq!(err(&good, &opts(&[0], 0.0)), TdtError::NoAdvance(vec![0]));
    assert_eq!(err(&good, &TdtOptions { omega: 1.5, ..o.clone() }), TdtError::Omega(1.5));
}

/// A scripted model: the joint's answer depends on (utterance, frame, labels emitted so far).
struct Scripted {
    vocab: usize,
    n_dur: usize,
    /// (token, duration index) for (utterance, frame, history length); blank/duration-1 otherwise.
    script: fn(usize, usize, usize) -> (usize, usize),
    joint_calls: usize,
}

impl TdtDecoderModel for Scripted {
    type State = Vec<usize>;
    fn start(&mut self, batch: usize) -> Vec<usize> {
        vec![0; batch]
    }
    fn joint(&mut self, state: &Vec<usize>, rows: &[usize], frames: &[usize]) -> Vec<f32> {
        self.joint_calls += 1;
        let mut out = Vec::new();
        for (&b, &t) in rows.iter().zip(frames) {
            let (tok, di) = (self.script)(b, t, state[b]);
            let mut z = vec![0f32; self.vocab + self.n_dur];
            z[tok] = 5.0;
            z[self.vocab + di] = 5.0;
            out.extend(z);
        }
        out
    }
    fn advance(&mut self, state: &mut Vec<usize>, rows: &[usize], _labels: &[usize]) {
        for &b in rows {
            state[b] += 1;
        }
    }
}

fn decode(
    script: fn(usize, usize, usize) -> (usize, usize),
    frames: &[usize],
    max_symbols: Option<usize>,
) -> Vec<Hypothesis> {
    let mut m = Scripted { vocab: 5, n_dur: 5, script, joint_calls: 0 };
    let o = GreedyOptions { vocab: 5, durations: vec![0, 1, 2, 3, 4], max_symbols };
    greedy_batch(&mut m, frames, &o)
}

#[test]
fn greedy_emits_duration_zero_labels_on_one_frame() {
    // Frame 0: labels 1 then 2 (duration 0), then 3 with duration 2; frame 2: blank with
    // duration 3 jumps past the end (T = 4).
    let script = |_b: usize, t: usize, h: usize| match (t, h) {
        (0, 0) => (1, 0),
        (0, 1) => (2, 0),
        (0, 2) => (3, 2),
        _ => (4, 3),
    };
    let h = &decode(script, &[4], Some(10))[0];
    assert_eq!(h.tokens, vec![1, 2, 3]);
    assert_eq!(h.frames, vec![0, 0, 0]);
    assert_eq!(h.durations, vec![0, 0, 2]);
}

#[test]
fn greedy_forces_blank_duration_zero_to_one() {
    // Always blank with duration 0: must advance one frame per step and terminate.
    let h = &decode(|_, _, _| (4, 0), &[6], None)[0];
    assert!(h.tokens.is_empty());
    // A label appears at frame 3: it is found because each blank advanced exactly one frame.
    let h = &decode(|_, t, h| if t == 3 && h == 0 { (2, 1) } else { (4, 0) }, &[6], None)[0];
    assert_eq!((h.tokens.clone(), h.frames.clone()), (vec![2], vec![3]));
}

#[test]
fn greedy_respects_max_symbols() {
    let h = &decode(|_, _, _| (0, 0), &[2], Some(3))[0];
    assert_eq!(h.tokens, vec![0; 6]);
    assert_eq!(h.frames, vec![0, 0, 0, 1, 1, 1]);
    // The last label is kept even when its duration jumps past the end.
    let h = &decode(|_, t, _| if t == 1 { (3, 4) } else { (4, 1) }, &[3], Some(3))[0];
    assert_eq!((h.tokens.clone(), h.frames.clone()), (vec![3], vec![1]));
}

#[test]
fn greedy_batch_equals_one_by_one() {
    let script = |b: usize, t: usize, h: usize| match (b + t + h) % 4 {
        0 => ((b + h) % 4, 0),
        1 => (4, 2),
        2 => ((t + 1) % 4, 1),
        _ => (4, 0),
    };
    let frames = [9usize, 4, 13, 1];
    let together = decode(script, &frames, Some(2));
    for (b, &f) in frames.iter().enumerate() {
        // Utterance b alone: shift the script so it sees itself as utterance b.
        let alone = {
            let mut m = Scripted { vocab: 5, n_dur: 5, script, joint_calls: 0 };
            let o =
                GreedyOptions { vocab: 5, durations: vec![0, 1, 2, 3, 4], max_symbols: Some(2) };
            let mut lens = vec![0usize; frames.len()];
            lens[b] = f;
            greedy_batch(&mut m, &lens, &o).swap_remove(b)
        };
        assert_eq!(together[b], alone, "utterance {b}");
    }
}

pub(crate) use burn_op::check_backward;

mod burn_op {
    use asr_tdt::batch::{self, BatchInput};
    use asr_tdt::op::{tdt_costs, TdtLoss, TdtProblem};
    use asr_tdt::{Reduction, TdtOptions};
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::{Tensor, TensorData};

    use super::{random_block, SplitMix64};

    type Ad = Autodiff<NdArray>;

    fn case() -> (Vec<f32>, Vec<u32>, [usize; 3], [usize; 3]) {
        let mut rng = SplitMix64::new(21);
        let logits = random_block(&mut rng, 3 * 5, 3, 6 + 5);
        let targets: Vec<u32> = (0..9).map(|_| rng.below(5) as u32).collect();
        (logits, targets, [5, 2, 4], [3, 1, 0])
    }

    /// [`case`]'s batch as the CPU loss reads it.
    fn case_input<'a>(
        logits: &'a [f32],
        targets: &'a [u32],
        frames: &'a [usize],
        lens: &'a [usize],
    ) -> BatchInput<'a> {
        BatchInput {
            logits,
            batch: 3,
            t_max: 5,
            u_max: 3,
            vocab: 6,
            n_dur: 5,
            targets,
            frame_lens: frames,
            target_lens: lens,
        }
    }

    /// The autodiff gradient equals the closed-form gradient times the reduction factor, on any
    /// autodiff backend whose inner backend implements the TDT operation.
    pub(crate) fn check_backward<B>(device: &B::Device)
    where
        B: burn::tensor::backend::AutodiffBackend + asr_tdt::op::TdtBackend,
    {
        let (logits, targets, frames, lens) = case();
        let options =
            TdtOptions { omega: 0.0, reduction: Reduction::MeanVolume, ..TdtOptions::default() };
        let x = Tensor::<B, 4>::from_data(TensorData::new(logits.clone(), [3, 5, 4, 11]), device)
            .require_grad();
        let mut loss = TdtLoss::new(options.clone(), 7).unwrap();
        let out = loss.forward(x.clone(), &targets, &frames, &lens).unwrap();
        assert!(!out.rnnt);
        let grads = out.loss.backward();
        let g: Vec<f32> = x.grad(&grads).unwrap().into_data().to_vec().unwrap();

        let input = case_input(&logits, &targets, &frames, &lens);
        let direct = batch::loss(&input, &options, false, true).unwrap();
        let (expected_loss, factors) = batch::reduce(&direct.costs, &lens, Reduction::MeanVolume);
        let got_loss: f32 = out.loss.into_data().to_vec::<f32>().unwrap()[0];
        assert!((f64::from(got_loss) - expected_loss).abs() < 1e-5 * expected_loss);
        let dg = direct.grads.unwrap();
        let block = 5 * 4 * 11;
        for (i, (&a, &b)) in g.iter().zip(&dg).enumerate() {
            let want = f64::from(b) * factors[i / block];
            assert!((f64::from(a) - want).abs() < 1e-6, "logit {i}: {a} vs {want}");
        }
    }

    #[test]
    fn autodiff_backward_is_the_closed_form_gradient_times_the_reduction() {
        check_backward::<Ad>(&Default::default());
    }

    /// On the CPU backend a gradient asked of logits nothing else holds is written over them
    /// (no second logits-sized buffer) and equals the out-of-place gradient exactly; logits
    /// still held elsewhere are left as they were.
    #[test]
    fn cpu_gradient_is_written_over_unshared_logits() {
        use asr_tdt::op::TdtBackend;
        use burn::backend::ndarray::NdArrayTensor;
        use burn::tensor::TensorPrimitive;

        let (logits, targets, frames, lens) = case();
        let options = TdtOptions { omega: 0.0, ..TdtOptions::default() };
        let problem = TdtProblem {
            targets: targets.clone(),
            u_max: 3,
            frame_lens: frames.to_vec(),
            target_lens: lens.to_vec(),
            options: options.clone(),
            rnnt: false,
        };
        let input = case_input(&logits, &targets, &frames, &lens);
        let direct = batch::loss(&input, &options, false, true).unwrap();
        // Values of a primitive of any rank (the data carries its own shape).
        let host = |t: NdArrayTensor| -> Vec<f32> {
            Tensor::<NdArray, 1>::from_primitive(TensorPrimitive::Float(t))
                .into_data()
                .to_vec()
                .unwrap()
        };
        let address = |t: &NdArrayTensor| match t {
            NdArrayTensor::F32(s) => s.view().as_ptr() as usize,
            _ => panic!("expected f32"),
        };
        let tensor = |data: &[f32]| {
            let t = Tensor::<NdArray, 4>::from_data(
                TensorData::new(data.to_vec(), [3, 5, 4, 11]),
                &Default::default(),
            );
            match t.into_primitive() {
                TensorPrimitive::Float(p) => p,
                TensorPrimitive::QFloat(_) => unreachable!(),
            }
        };
        for rnnt in [false, true] {
            let problem = TdtProblem { rnnt, ..problem.clone() };
            let direct = if rnnt {
                batch::loss(&input, &options, true, true).unwrap()
            } else {
                direct.clone()
            };
            let unshared = tensor(&logits);
            let at = address(&unshared);
            let (costs, grad) = NdArray::tdt_forward(unshared, &problem, true).unwrap();
            let grad = grad.unwrap();
            assert_eq!(address(&grad), at, "rnnt {rnnt}: the gradient was not written in place");
            let g = host(grad);
            assert_eq!(g, direct.grads.clone().unwrap(), "rnnt {rnnt}");
            let want: Vec<f32> = direct.costs.iter().map(|&c| c as f32).collect();
            assert_eq!(host(costs), want, "rnnt {rnnt}");

            // Shared logits: the other holder still reads the logits afterwards.
            let shared = tensor(&logits);
            let keep = shared.clone();
            let (_, grad) = NdArray::tdt_forward(shared, &problem, true).unwrap();
            let g = host(grad.unwrap());
            assert_eq!(g, direct.grads.clone().unwrap());
            assert_eq!(host(keep), logits);
        }
    }

    /// The same check on a GPU: run by hand on a machine with CUDA
    /// (`cargo test -p asr-trainer --features cuda -- --ignored cuda`).
    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs a CUDA device"]
    fn cuda_autodiff_backward_is_the_closed_form_gradient_times_the_reduction() {
        check_backward::<Autodiff<burn::backend::Cuda>>(&Default::default());
    }

    #[test]
    fn plain_backend_costs_match_and_omega_draws_are_reproducible() {
        let (logits, targets, frames, lens) = case();
        let device = Default::default();
        let x = Tensor::<NdArray, 4>::from_data(
            TensorData::new(logits.clone(), [3, 5, 4, 11]),
            &device,
        );
        let problem = TdtProblem {
            targets: targets.clone(),
            u_max: 3,
            frame_lens: frames.to_vec(),
            target_lens: lens.to_vec(),
            options: TdtOptions::default(),
            rnnt: false,
        };
        let costs: Vec<f32> = tdt_costs(x.clone(), &problem).unwrap().into_data().to_vec().unwrap();
        assert_eq!(costs.len(), 3);
        // The generic host path (what a device backend without a kernel uses) agrees with the
        // in-place CPU path, costs and gradients.
        use burn::tensor::TensorPrimitive;
        let prim = || x.clone().into_primitive().tensor();
        let (c1, g1) = asr_tdt::op::host_forward::<NdArray>(prim(), &problem, true).unwrap();
        let (c2, g2) =
            <NdArray as asr_tdt::op::TdtBackend>::tdt_forward(prim(), &problem, true).unwrap();
        let data = |p| Tensor::<NdArray, 1>::from_primitive(TensorPrimitive::Float(p)).into_data();
        let data4 = |p| Tensor::<NdArray, 4>::from_primitive(TensorPrimitive::Float(p)).into_data();
        assert_eq!(data(c1), data(c2));
        assert_eq!(data4(g1.unwrap()), data4(g2.unwrap()));
        assert!(costs.iter().all(|c| c.is_finite() && *c > 0.0));

        // omega = 0.5: both branches occur, the same ones for the same seed and call number.
        let options = TdtOptions { omega: 0.5, ..TdtOptions::default() };
        let a = TdtLoss::new(options.clone(), 99).unwrap();
        let b = TdtLoss::new(options, 99).unwrap();
        let branches: Vec<bool> = (0..200).map(|n| a.rnnt_branch(n)).collect();
        assert_eq!(branches, (0..200).map(|n| b.rnnt_branch(n)).collect::<Vec<_>>());
        let share = branches.iter().filter(|&&r| r).count();
        assert!((70..130).contains(&share), "{share} of 200 draws below omega 0.5");

        // The RNN-T branch leaves the duration logits without gradient.
        let mut loss = TdtLoss::new(TdtOptions { omega: 1.0, ..TdtOptions::default() }, 1).unwrap();
        let x = Tensor::<Ad, 4>::from_data(TensorData::new(logits, [3, 5, 4, 11]), &device)
            .require_grad();
        let out = loss.forward(x.clone(), &targets, &frames, &lens).unwrap();
        assert!(out.rnnt);
        let g: Vec<f32> = x.grad(&out.loss.backward()).unwrap().into_data().to_vec().unwrap();
        assert!(g.chunks(11).all(|node| node[6..].iter().all(|&d| d == 0.0)));
        assert!(g.iter().any(|&v| v != 0.0));
    }
}
