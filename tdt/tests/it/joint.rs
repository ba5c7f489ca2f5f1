//! The joint's output layer and the loss on the host (`asr_tdt::joint`) against an oracle built
//! from the padded lattice: logits summed in float64 for every padded node, the batch loss of
//! `batch::loss` over them, and the chain rule through the output layer and the ReLU written
//! out in float64 loops.

use asr_tdt::batch::{self, BatchInput};
use asr_tdt::joint::{joint_loss, JointInput};
use asr_tdt::{TdtError, TdtOptions};

use asr_corpus::synth::SplitMix64;

/// A ragged batch up to the joint's output layer; padding holds random values (never read).
struct Problem {
    enc: Vec<f32>,
    pred: Vec<f32>,
    weight: Vec<f32>,
    bias: Vec<f32>,
    targets: Vec<u32>,
    frame_lens: Vec<usize>,
    target_lens: Vec<usize>,
    t_max: usize,
    u_max: usize,
    hidden: usize,
    outputs: usize,
}

fn problem(seed: u64, n_dur: usize) -> Problem {
    sized(seed, n_dur, (9, 5, 7, 11), vec![9, 4, 7, 2], vec![5, 2, 0, 1])
}

/// A batch of `(t_max, u_max, hidden, vocab)` and the given lengths.
fn sized(
    seed: u64,
    n_dur: usize,
    (t_max, u_max, hidden, vocab): (usize, usize, usize, usize),
    frame_lens: Vec<usize>,
    target_lens: Vec<usize>,
) -> Problem {
    let mut rng = SplitMix64::new(seed);
    let mut draw = |n: usize, scale: f64| -> Vec<f32> {
        (0..n).map(|_| ((rng.next_f64() * 2.0 - 1.0) * scale) as f32).collect()
    };
    let b = frame_lens.len();
    let outputs = vocab + n_dur;
    let enc = draw(b * t_max * hidden, 1.0);
    let pred = draw(b * (u_max + 1) * hidden, 1.0);
    let weight = draw(hidden * outputs, 1.0);
    let bias = draw(outputs, 0.5);
    let targets = draw(b * u_max, 1.0)
        .iter()
        .map(|&x| ((x + 1.0) * 0.5 * (vocab - 1) as f32) as u32 % (vocab as u32 - 1))
        .collect();
    Problem {
        enc,
        pred,
        weight,
        bias,
        targets,
        frame_lens,
        target_lens,
        t_max,
        u_max,
        hidden,
        outputs,
    }
}

impl Problem {
    fn input(&self, with_bias: bool) -> JointInput<'_> {
        JointInput {
            enc: &self.enc,
            pred: &self.pred,
            weight: &self.weight,
            bias: with_bias.then_some(&self.bias[..]),
            batch: self.frame_lens.len(),
            t_max: self.t_max,
            u_max: self.u_max,
            hidden: self.hidden,
            outputs: self.outputs,
            targets: &self.targets,
            frame_lens: &self.frame_lens,
            target_lens: &self.target_lens,
        }
    }

    fn hidden_at(&self, b: usize, t: usize, u: usize) -> Vec<f64> {
        let j = self.hidden;
        (0..j)
            .map(|k| {
                let e = f64::from(self.enc[(b * self.t_max + t) * j + k]);
                let p = f64::from(self.pred[(b * (self.u_max + 1) + u) * j + k]);
                (e + p).max(0.0)
            })
            .collect()
    }
}

/// The oracle's costs and the float64 gradients of `sum_b w[b] cost_b`: enc, pred, weight, bias.
fn oracle(
    p: &Problem,
    opts: &TdtOptions,
    rnnt: bool,
    with_bias: bool,
    w: &[f64],
) -> (Vec<f64>, [Vec<f64>; 4]) {
    let (bn, j, o, u1) = (p.frame_lens.len(), p.hidden, p.outputs, p.u_max + 1);
    let mut logits = Vec::with_capacity(bn * p.t_max * u1 * o);
    for b in 0..bn {
        for t in 0..p.t_max {
            for u in 0..u1 {
                let h = p.hidden_at(b, t, u);
                for c in 0..o {
                    let bias = if with_bias { f64::from(p.bias[c]) } else { 0.0 };
                    let z: f64 = (0..j).map(|k| h[k] * f64::from(p.weight[k * o + c])).sum();
                    logits.push((z + bias) as f32);
                }
            }
        }
    }
    let n_dur = opts.durations.len();
    let input = BatchInput {
        logits: &logits,
        batch: bn,
        t_max: p.t_max,
        u_max: p.u_max,
        vocab: o - n_dur,
        n_dur,
        targets: &p.targets,
        frame_lens: &p.frame_lens,
        target_lens: &p.target_lens,
    };
    let out = batch::loss(&input, opts, rnnt, true).unwrap();
    let g = out.grads.unwrap();
    let mut d = [vec![0.0; p.enc.len()], vec![0.0; p.pred.len()], vec![0.0; j * o], vec![0.0; o]];
    for b in 0..bn {
        for t in 0..p.t_max {
            for u in 0..u1 {
                let h = p.hidden_at(b, t, u);
                let row = &g[((b * p.t_max + t) * u1 + u) * o..][..o];
                for c in 0..o {
                    let gc = w[b] * f64::from(row[c]);
                    d[3][c] += gc;
                    for k in 0..j {
                        d[2][k * o + c] += h[k] * gc;
                    }
                }
                for k in 0..j {
                    if h[k] > 0.0 {
                        let dh: f64 = (0..o)
                            .map(|c| w[b] * f64::from(row[c]) * f64::from(p.weight[k * o + c]))
                            .sum();
                        d[0][(b * p.t_max + t) * j + k] += dh;
                        d[1][(b * u1 + u) * j + k] += dh;
                    }
                }
            }
        }
    }
    (out.costs, d)
}

/// Largest difference relative to the largest oracle entry.
fn rel(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    got.iter().zip(want).fold(0f64, |m, (g, w)| m.max((f64::from(*g) - w).abs())) / scale
}

/// TDT (durations 0..2, sigma) and RNN-T branches, with and without a bias, ragged lengths, an
/// utterance with no targets and random values in the padding: costs and every gradient agree
/// with the oracle. Measured: costs 2.9e-8 relative, gradients 9.8e-8 of their largest entry
/// (bounds 4.8x and 4.6x those).
#[test]
fn host_joint_matches_the_padded_lattice_and_the_chain_rule() {
    let w = [0.25, 1.0, 0.5, 2.0];
    let mut worst = (0f64, 0f64);
    for (rnnt, with_bias, seed) in [(false, true, 1), (false, false, 2), (true, true, 3)] {
        let durations = [0, 1, 2];
        let opts = TdtOptions {
            durations: durations.to_vec(),
            sigma: 0.05,
            omega: 0.0,
            ..TdtOptions::default()
        };
        let p = problem(seed, durations.len());
        let (want_costs, want) = oracle(&p, &opts, rnnt, with_bias, &w);
        let got = joint_loss(&p.input(with_bias), &opts, rnnt, Some(&w)).unwrap();
        for (b, (c, e)) in got.costs.iter().zip(&want_costs).enumerate() {
            let r = (c - e).abs() / e.abs().max(1.0);
            worst.0 = worst.0.max(r);
            assert!(r < 1.4e-7, "rnnt {rnnt} bias {with_bias}: utterance {b} cost {c} vs {e}");
        }
        let g = got.grads.unwrap();
        for (name, got, want) in [
            ("encoder", &g.enc, &want[0]),
            ("prediction", &g.pred, &want[1]),
            ("weight", &g.weight, &want[2]),
            ("bias", &g.bias, &want[3]),
        ] {
            if name == "bias" && !with_bias {
                // The bias gradient is computed whether or not the layer has one.
                continue;
            }
            let r = rel(got, want);
            worst.1 = worst.1.max(r);
            assert!(r < 4.5e-7, "rnnt {rnnt} bias {with_bias}: {name} gradient off by {r:.2e}");
        }
        // Without weights: the same costs, no gradient.
        let costs = joint_loss(&p.input(with_bias), &opts, rnnt, None).unwrap();
        assert!(costs.grads.is_none());
        assert_eq!(costs.costs, got.costs);
    }
    eprintln!("host joint: costs {:.2e} relative, gradients {:.2e}", worst.0, worst.1);
}

#[test]
fn impossible_utterances_are_inf_or_zero_and_add_no_gradient() {
    // Durations 0 and 2 only: every path covers an even number of frames, so the 9- and 7-frame
    // utterances (0 and 2) have no alignment; the 4- and 2-frame ones do.
    let opts = TdtOptions { durations: vec![0, 2], omega: 0.0, ..TdtOptions::default() };
    let p = problem(4, 2);
    let w = [1.0; 4];
    let got = joint_loss(&p.input(true), &opts, false, Some(&w)).unwrap();
    let finite: Vec<bool> = got.costs.iter().map(|c| c.is_finite()).collect();
    assert_eq!(finite, [false, true, false, true], "{:?}", got.costs);
    let g = got.grads.unwrap();
    let rows = p.t_max * p.hidden;
    for b in [0, 2] {
        assert!(g.enc[b * rows..(b + 1) * rows].iter().all(|&x| x == 0.0), "utterance {b}");
    }
    assert!(g.enc[rows..2 * rows].iter().any(|&x| x != 0.0));
    let zero = TdtOptions { zero_infinity: true, ..opts };
    let got = joint_loss(&p.input(true), &zero, false, Some(&w)).unwrap();
    assert_eq!((got.costs[0], got.costs[2]), (0.0, 0.0));
    assert!(got.costs[1] > 0.0 && got.costs[3] > 0.0, "{:?}", got.costs);
}

#[test]
fn inputs_of_the_wrong_size_are_errors_naming_them() {
    let opts = TdtOptions { durations: vec![0, 1, 2], omega: 0.0, ..TdtOptions::default() };
    let p = problem(5, 3);
    let short = &p.weight[1..];
    let input = JointInput { weight: short, ..p.input(true) };
    match joint_loss(&input, &opts, false, None) {
        Err(TdtError::JointValues { what: "output weight", got, expected }) => {
            assert_eq!((got, expected), (p.weight.len() - 1, p.weight.len()));
        }
        other => panic!("{other:?}"),
    }
    let input =
        JointInput { outputs: 3, weight: &p.weight[..p.hidden * 3], bias: None, ..p.input(true) };
    assert!(matches!(joint_loss(&input, &opts, false, None), Err(TdtError::LogitsShape { .. })));
    let long = [9, 4, 7, 10];
    let input = JointInput { frame_lens: &long, ..p.input(true) };
    assert!(matches!(
        joint_loss(&input, &opts, false, None),
        Err(TdtError::UtteranceLengths { utterance: 3, .. })
    ));
    let w = [1.0; 3];
    assert!(matches!(
        joint_loss(&p.input(true), &opts, false, Some(&w)),
        Err(TdtError::FactorCount { factors: 3, utterances: 4 })
    ));
}

/// Exact resume compares bits: the gradients must not depend on the thread count or on which
/// thread ran which utterance. The second batch is one utterance whose products are large
/// enough for `gemm` to split them over the threads (`m n k` above its threshold, 48 * 48 * 256).
#[test]
fn gradients_are_the_same_bits_on_any_thread_count() {
    let opts = TdtOptions { durations: vec![0, 1, 2], omega: 0.0, ..TdtOptions::default() };
    let small = (problem(6, 3), vec![0.5, 1.0, 0.25, 2.0]);
    let large = (sized(7, 3, (40, 12, 64, 200), vec![40], vec![12]), vec![0.5]);
    let (m, n, k) = (40 * 13, 203, 64);
    assert!(m * n * k > 48 * 48 * 256);
    for (p, w) in [&small, &large] {
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let g = pool.install(|| joint_loss(&p.input(true), &opts, false, Some(w)).unwrap());
            let costs: Vec<u64> = g.costs.iter().map(|c| c.to_bits()).collect();
            let g = g.grads.unwrap();
            (costs, g.enc, g.pred, g.weight, g.bias)
        };
        let one = run(1);
        for threads in [2, 3, 8] {
            assert!(run(threads) == one, "{threads} threads, batch of {}", w.len());
        }
    }
}
