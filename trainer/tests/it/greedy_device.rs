//! Greedy decoding on the device ([`BurnGreedy`]: states kept on the device, rows gathered,
//! arg-maxes taken there, new states put back by a gather) against decoding each utterance on
//! its own with the arg-max taken on the host from the full logits (the trait's default), on a
//! randomly initialised model and a ragged batch, on the CPU backend and on wgpu.

use asr_tdt::greedy::{greedy_batch, GreedyOptions, Hypothesis, TdtDecoderModel};
use asr_trainer::{BurnGreedy, DeviceState};
use asr_trainer::{TdtModel, TrainConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

/// The same model, with the arg-max taken on the host from the logits it reads back.
struct HostArgmax<'m, 'a, B: Backend>(&'m mut BurnGreedy<'a, B>);

impl<B: Backend> TdtDecoderModel for HostArgmax<'_, '_, B> {
    type State = DeviceState<B>;
    fn start(&mut self, batch: usize) -> DeviceState<B> {
        self.0.start(batch)
    }
    fn joint(&mut self, state: &DeviceState<B>, rows: &[usize], frames: &[usize]) -> Vec<f32> {
        self.0.joint(state, rows, frames)
    }
    fn advance(&mut self, state: &mut DeviceState<B>, rows: &[usize], labels: &[usize]) {
        self.0.advance(state, rows, labels)
    }
}

/// The device path, counting the steps where only some utterances emitted a label (the states
/// of the others must be kept as they were).
struct Partial<'m, 'a, B: Backend> {
    dec: &'m mut BurnGreedy<'a, B>,
    batch: usize,
    partial: usize,
}

impl<B: Backend> TdtDecoderModel for Partial<'_, '_, B> {
    type State = DeviceState<B>;
    fn start(&mut self, batch: usize) -> DeviceState<B> {
        self.dec.start(batch)
    }
    fn joint(&mut self, state: &DeviceState<B>, rows: &[usize], frames: &[usize]) -> Vec<f32> {
        self.dec.joint(state, rows, frames)
    }
    fn joint_argmax(
        &mut self,
        state: &DeviceState<B>,
        rows: &[usize],
        frames: &[usize],
        vocab: usize,
    ) -> Vec<(usize, usize)> {
        self.dec.joint_argmax(state, rows, frames, vocab)
    }
    fn advance(&mut self, state: &mut DeviceState<B>, rows: &[usize], labels: &[usize]) {
        self.partial += usize::from(rows.len() < self.batch);
        self.dec.advance(state, rows, labels)
    }
}

fn check<B: Backend>(device: &B::Device) {
    let cfg = TrainConfig::from_toml("[model.encoder]\nn_layers = 1\n").unwrap().model;
    let vocab = 12;
    let opts =
        GreedyOptions { vocab: vocab + 1, durations: cfg.durations.clone(), max_symbols: Some(3) };
    let lens = [17usize, 5, 23, 1, 12, 23];
    let t_max = 23;
    let (mut emitted, mut partial) = (0, 0);
    for seed in 0..4u64 {
        let model = TdtModel::<B>::new(&cfg, vocab, seed, device);
        // Encoder outputs scaled up so that the joint's decisions vary from frame to frame.
        // (Unseeded: both decodings read the same tensor.)
        let enc = Tensor::<B, 3>::random(
            [lens.len(), t_max, cfg.encoder.d_model],
            Distribution::Normal(0.0, 4.0),
            device,
        );
        let proj = model.joint.project_encoder(enc);
        let mut dec = BurnGreedy::new(&model, proj.clone(), device);
        let mut counted = Partial { dec: &mut dec, batch: lens.len(), partial: 0 };
        let together = greedy_batch(&mut counted, &lens, &opts);
        partial += counted.partial;
        for (b, &len) in lens.iter().enumerate() {
            let one = proj.clone().narrow(0, b, 1).narrow(1, 0, len);
            let mut dec = BurnGreedy::new(&model, one, device);
            let alone: Hypothesis =
                greedy_batch(&mut HostArgmax(&mut dec), &[len], &opts).remove(0);
            assert_eq!(together[b], alone, "seed {seed}, utterance {b}");
            emitted += alone.tokens.len();
        }
    }
    eprintln!("{emitted} labels, {partial} steps where some utterances emitted");
    // The cases advance some utterances' states while others keep theirs.
    assert!(emitted > 20 && partial > 10, "{emitted} labels, {partial} partial steps");
}

#[test]
fn cpu_backend() {
    let _turn = crate::serial();
    check::<burn::backend::NdArray>(&Default::default());
}

#[test]
fn wgpu_backend() {
    let _turn = crate::serial();
    check::<burn::backend::Wgpu>(&Default::default());
}
