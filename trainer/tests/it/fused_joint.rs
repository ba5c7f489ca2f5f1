//! `train.fused_batch_size`: the joint and loss in parts of a micro-batch give the gradient of the
//! whole micro-batch at once, parameter by parameter (the identity the parts rely on: the
//! gradient of a sum is the sum of gradients, and the chain rule through the joint's projected
//! inputs). Checked on the CPU backend for parts of 1, 2 and 3 utterances of a 5-utterance
//! batch with ragged lengths, with both loss reductions that depend on the whole batch; and the
//! same for `train.joint = "auto"`, the output layer and loss on the host (`asr_tdt::joint`).
//! Measured: every parameter's gradient within 2.3e-7 of its largest entry (parts of 2; the host
//! path 2.0e-7); bound 1.1e-6.

use asr_trainer::{
    assemble, AudioFormat, DataSpec, ShapePolicy, TdtModel, TrainConfig, Trainer, TrainingSet,
};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;

type Ad = burn::backend::Autodiff<burn::backend::NdArray>;
type Inner = burn::backend::NdArray;

/// Every parameter's gradient, in the model's parameter order (parameter ids differ between
/// two models built alike, their order does not).
struct Collect<'a> {
    grads: &'a GradientsParams,
    out: Vec<Option<Vec<f32>>>,
}

impl ModuleVisitor<Ad> for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
        let g = self.grads.get::<Inner, D>(param.id);
        self.out.push(g.map(|g| g.into_data().to_vec().unwrap()));
    }
}

fn collect(model: &TdtModel<Ad>, grads: &GradientsParams) -> Vec<Option<Vec<f32>>> {
    let mut c = Collect { grads, out: Vec::new() };
    model.visit(&mut c);
    c.out
}

/// The largest difference between two ways of computing one parameter's gradient, relative to
/// its largest entry.
const BOUND: f32 = 1.1e-6;

#[test]
fn parts_of_a_micro_batch_give_the_whole_batch_gradient() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let set = TrainingSet::open(&[DataSpec::new(crate::parallel::corpus(dir.path(), 12))]).unwrap();
    let vocab = set.tokenizer().0 as usize;
    // Five utterances of different lengths: each part is cropped to its own longest lengths.
    let batch = assemble(&set, &[0, 3, 5, 7, 10], ShapePolicy::default(), AudioFormat::I16);
    assert!(batch.token_lens.iter().min() < batch.token_lens.iter().max());
    for reduction in ["mean_batch", "mean_volume"] {
        let cfg = |joint: &str, part: usize| {
            TrainConfig::from_toml(&format!(
                "[model.encoder]\nn_layers = 1\n[train]\nfused_batch_size = {part}\n\
                 joint = \"{joint}\"\n[loss]\nreduction = \"{reduction}\"\n"
            ))
            .unwrap()
        };
        let grads = |joint: &str, part: usize| {
            let mut t = Trainer::<Ad>::new(cfg(joint, part), vocab, Default::default()).unwrap();
            let g = t.gradients_at(std::slice::from_ref(&batch), &[3], 2.0).unwrap();
            assert_eq!(t.loss.calls, 4, "one loss branch drawn per micro-batch");
            (collect(&t.model, &g.grads), g.loss, g.finite)
        };
        let (whole, loss, finite) = grads("graph", 0);
        assert!(loss.is_finite() && finite == 1);
        // Parts of 1, 2 and 3 utterances in Burn's graph, and the host path (`auto` on this CPU
        // backend: the output layer and loss in `asr_tdt::joint`, one utterance at a time).
        for (joint, part) in [("graph", 1), ("graph", 2), ("graph", 3), ("auto", 0)] {
            let (parts, part_loss, _) = grads(joint, part);
            let label =
                if joint == "auto" { "the host joint".into() } else { format!("parts of {part}") };
            assert!(
                (part_loss - loss).abs() <= 1e-6 * loss.abs(),
                "{reduction}, {label}: loss {part_loss} vs {loss}"
            );
            assert_eq!(parts.len(), whole.len());
            let (mut worst, mut params) = (0f32, 0);
            for (k, (a, b)) in whole.iter().zip(&parts).enumerate() {
                match (a, b) {
                    (Some(a), Some(b)) => {
                        let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
                        assert!(scale > 0.0, "parameter {k} has a zero gradient");
                        let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                        worst = worst.max(diff / scale);
                        params += 1;
                    }
                    (None, None) => {}
                    _ => panic!("{reduction}, {label}: parameter {k} on one side only"),
                }
            }
            eprintln!(
                "{reduction}, {label}: {params} parameters, largest relative difference \
                 {worst:.2e}"
            );
            let none: Vec<usize> = (0..whole.len()).filter(|&k| whole[k].is_none()).collect();
            // The BatchNorm's running mean and variance are visited as parameters but have none.
            assert_eq!(params + 2, whole.len(), "parameters without a gradient: {none:?}");
            assert!(worst < BOUND, "{reduction}, {label}: {worst:.3e}");
        }
    }
}
