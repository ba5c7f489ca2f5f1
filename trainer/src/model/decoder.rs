//! Prediction network (embedding + stacked LSTM, NeMo `RNNTDecoder` with `blank_as_pad`) and
//! the joint network.
//!
//! The start of a sequence is the blank. Training feeds it as zeros (NeMo's `add_sos`), and
//! the blank's embedding row is zero at initialisation and never trained (NeMo's
//! `padding_idx`). Greedy decoding feeds the blank's row as stored, as NeMo's label-looping
//! decoding (`transcribe()`'s default) does: for a model from NeMo whose row is not zero, the
//! two starts decode differently.

use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, Lstm, LstmConfig, LstmState};
use burn::prelude::*;
use burn::tensor::activation::{relu, sigmoid};

use super::config::{JointConfig, PredictionConfig};
use super::precision::Precision;

/// Embedding and stacked LSTMs over `[blank, y_1, ..., y_U]`.
#[derive(Module, Debug)]
pub struct Prediction<B: Backend> {
    embedding: Embedding<B>,
    layers: Vec<Lstm<B>>,
    blank: usize,
}

/// Per-layer LSTM states of a batch.
pub type PredState<B> = Vec<LstmState<B, 2>>;

impl<B: Backend> Prediction<B> {
    /// A fresh network for `vocab` tokens (blank is `vocab`).
    pub fn new(cfg: &PredictionConfig, vocab: usize, device: &B::Device) -> Self {
        let h = cfg.pred_hidden;
        let mut embedding = EmbeddingConfig::new(vocab + 1, h).init(device);
        // The blank's row starts at zero, as `padding_idx` makes it in NeMo; `embed` keeps its
        // gradient at zero.
        embedding.weight = embedding
            .weight
            .map(|w| w.slice_assign([vocab..vocab + 1, 0..h], Tensor::zeros([1, h], device)));
        Prediction {
            embedding,
            layers: (0..cfg.pred_rnn_layers)
                .map(|_| LstmConfig::new(h, h, true).init(device))
                .collect(),
            blank: vocab,
        }
    }

    /// The blank (and start) symbol's index.
    pub fn blank(&self) -> usize {
        self.blank
    }

    /// Embeds `labels` `[B, S]`; the blank embeds to zeros (NeMo's `blank_as_pad`).
    fn embed(&self, labels: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let keep = labels.clone().not_equal_elem(self.blank as i64).float().unsqueeze_dim(2);
        self.embedding.forward(labels) * keep
    }

    /// Outputs `[B, U + 1, H]` for targets `[B, U]` (padded with anything below the blank).
    pub fn forward(&self, targets: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, _] = targets.dims();
        let start = Tensor::<B, 2, Int>::full([b, 1], self.blank as i64, &targets.device());
        let mut x = self.embed(Tensor::cat(vec![start, targets], 1));
        for layer in &self.layers {
            x = lstm_sequence(layer, x);
        }
        x
    }

    /// One step for labels `[R]` from `state` (or the start state): output `[R, H]`.
    pub fn step(
        &self,
        labels: Tensor<B, 1, Int>,
        state: Option<PredState<B>>,
    ) -> (Tensor<B, 2>, PredState<B>) {
        let [r] = labels.dims();
        self.layers_step(self.embed(labels.reshape([r, 1])), state)
    }

    /// The first step of greedy decoding for `rows` utterances: the blank's embedding row as
    /// stored (not zeros), from the zero LSTM state.
    pub fn start_step(&self, rows: usize, device: &B::Device) -> (Tensor<B, 2>, PredState<B>) {
        let labels = Tensor::<B, 2, Int>::full([rows, 1], self.blank as i64, device);
        self.layers_step(self.embedding.forward(labels), None)
    }

    /// The LSTMs over one step's embeddings `[R, 1, H]`: output `[R, H]` and the next state.
    fn layers_step(
        &self,
        x: Tensor<B, 3>,
        state: Option<PredState<B>>,
    ) -> (Tensor<B, 2>, PredState<B>) {
        let [r, _, _] = x.dims();
        let mut x = x;
        let mut next = Vec::with_capacity(self.layers.len());
        let mut states = state.map(|s| s.into_iter().map(Some).collect::<Vec<_>>());
        for (i, layer) in self.layers.iter().enumerate() {
            let s = states.as_mut().and_then(|s| s[i].take());
            let (y, st) = layer.forward(x, s);
            x = y;
            next.push(st);
        }
        let [_, _, h] = x.dims();
        (x.reshape([r, h]), next)
    }
}

/// A whole sequence `[B, S, H_in]` through `layer` from the zero state: `[B, S, H]`, what
/// `Lstm::forward` computes for its default configuration (sigmoid gates, tanh, no clipping, as
/// `Prediction::new` builds it), with its four gates as one product: the input's projections
/// for every step at once (`[B * S, H_in] x [H_in, 4H]`) and one `[B, H] x [H, 4H]` product per
/// step, where Burn's forward runs eight small products per step. The prediction network was
/// about a fifth of a CPU forward pass at the 0.6B shape (bench/RESULTS.md, "Training step
/// against PyTorch on the CPU").
fn lstm_sequence<B: Backend>(layer: &Lstm<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let [b, s, d_in] = x.dims();
    let h = layer.d_hidden;
    let gates = [&layer.input_gate, &layer.forget_gate, &layer.output_gate, &layer.cell_gate];
    let weights = |pick: fn(&burn::nn::GateController<B>) -> &Linear<B>| {
        let w = Tensor::cat(gates.iter().map(|g| pick(g).weight.val()).collect(), 1);
        let bias: Option<Vec<Tensor<B, 1>>> =
            gates.iter().map(|g| pick(g).bias.as_ref().map(|b| b.val())).collect();
        (w, bias.map(|v| Tensor::cat(v, 0).reshape([1, 4 * h])))
    };
    let (w_in, b_in) = weights(|g| &g.input_transform);
    let (w_hid, b_hid) = weights(|g| &g.hidden_transform);
    let mut xin = x.reshape([b * s, d_in]).matmul(w_in);
    if let Some(bias) = b_in {
        xin = xin + bias;
    }
    if let Some(bias) = b_hid {
        // Both biases are constant over the steps: added once.
        xin = xin + bias;
    }
    let xin = xin.reshape([b, s, 4 * h]);
    if let Some(out) = super::host_lstm::on_host(&xin, &w_hid) {
        return out;
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(out) = super::device_lstm::on_device(&xin, &w_hid) {
        return out;
    }
    recurrence(xin, w_hid)
}

/// The recurrence over `xin` `[B, S, 4H]` (projections and biases) from the zero state, as
/// Burn operations: the form on the backends that have neither `host_lstm` nor `device_lstm`.
pub(crate) fn recurrence<B: Backend>(xin: Tensor<B, 3>, w_hid: Tensor<B, 2>) -> Tensor<B, 3> {
    let [b, s, h4] = xin.dims();
    let h = h4 / 4;
    let device = xin.device();
    let mut hidden = Tensor::<B, 2>::zeros([b, h], &device);
    let mut cell = Tensor::<B, 2>::zeros([b, h], &device);
    let mut outputs = Vec::with_capacity(s);
    for t in 0..s {
        let g = xin.clone().slice([0..b, t..t + 1, 0..4 * h]).reshape([b, 4 * h])
            + hidden.matmul(w_hid.clone());
        let gate = |k: usize| g.clone().slice([0..b, k * h..(k + 1) * h]);
        let (i, f, o) = (sigmoid(gate(0)), sigmoid(gate(1)), sigmoid(gate(2)));
        cell = f * cell + i * gate(3).tanh();
        hidden = o * cell.clone().tanh();
        outputs.push(hidden.clone().unsqueeze_dim(1));
    }
    Tensor::cat(outputs, 1)
}

/// Joint: project encoder and prediction outputs, add, ReLU, map to `V + 1 + D` logits.
#[derive(Module, Debug)]
pub struct Joint<B: Backend> {
    enc: Linear<B>,
    pred: Linear<B>,
    out: Linear<B>,
    /// The type of the products (not a parameter: checkpoints are the same whatever it is).
    #[module(skip)]
    precision: Precision,
}

impl<B: Backend> Joint<B> {
    /// A fresh joint.
    pub fn new(
        cfg: &JointConfig,
        d_enc: usize,
        d_pred: usize,
        outputs: usize,
        device: &B::Device,
    ) -> Self {
        Joint {
            enc: LinearConfig::new(d_enc, cfg.joint_hidden).init(device),
            pred: LinearConfig::new(d_pred, cfg.joint_hidden).init(device),
            out: LinearConfig::new(cfg.joint_hidden, outputs).init(device),
            precision: Precision::F32,
        }
    }

    /// This joint with its products in `precision`'s type.
    pub fn with_precision(self, precision: Precision) -> Self {
        Joint { precision, ..self }
    }

    /// The joint's widest per-node dimension: its hidden width or its outputs.
    pub fn widest(&self) -> usize {
        let [hidden, outputs] = self.out.weight.dims();
        hidden.max(outputs)
    }

    /// The output layer (`hidden -> V + 1 + D`), which the host path reads
    /// (`train::host_joint`).
    pub fn output_layer(&self) -> &Linear<B> {
        &self.out
    }

    /// Shows `visitor` the two projections' parameters (not the output layer's): those of the
    /// forward before the joint's largest tensor (`train::graph_join::join_visited`).
    pub fn visit_projections<V: burn::module::ModuleVisitor<B>>(&self, visitor: &mut V) {
        self.enc.visit(visitor);
        self.pred.visit(visitor);
    }

    /// Projects encoder outputs `[.., d_enc]`.
    pub fn project_encoder<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.precision.linear(&self.enc, x)
    }

    /// Projects prediction outputs `[.., d_pred]`.
    pub fn project_prediction<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.precision.linear(&self.pred, x)
    }

    /// Logits from projected parts that broadcast against each other.
    ///
    /// The output layer runs as a rank-2 `Linear` over the flattened leading dimensions: a
    /// rank-4 one broadcasts its weight against every `(b, t)` on the CPU backend, which
    /// materialises a `[B, T, J, outputs]` copy of it forward and backward (hundreds of MB for
    /// a small batch; `asrt-bench joint-memory`), and rank-4 `Linear`s got a wrong bias
    /// gradient on the CubeCL backend (see the encoder's subsampling).
    ///
    /// The logits are in f32 whatever the precision (greedy decoding reads them);
    /// [`Joint::lattice`] leaves the training lattice in the compute type.
    pub fn combine<const D: usize>(&self, enc: Tensor<B, D>, pred: Tensor<B, D>) -> Tensor<B, D> {
        self.precision.up(self.lattice(enc, pred))
    }

    /// [`Joint::combine`]'s logits left in the compute type (bfloat16 or float16 under mixed
    /// precision): the step's largest tensor at half the bytes, as the TDT loss reads it (its
    /// kernels accumulate in f32 whatever the logits' type).
    pub fn lattice<const D: usize>(&self, enc: Tensor<B, D>, pred: Tensor<B, D>) -> Tensor<B, D> {
        let hidden = relu(enc + pred);
        let mut dims = hidden.dims();
        let out = self.precision.linear_low(&self.out, hidden.flatten::<2>(0, D - 2));
        dims[D - 1] = out.dims()[1];
        out.reshape(dims)
    }

    /// Full lattice `[B, T, U + 1, outputs]` from `[B, T, d_enc]` and `[B, U + 1, d_pred]`.
    pub fn forward(&self, enc: Tensor<B, 3>, pred: Tensor<B, 3>) -> Tensor<B, 4> {
        let e = self.project_encoder(enc).unsqueeze_dim::<4>(2); // [B, T, 1, J]
        let p = self.project_prediction(pred).unsqueeze_dim::<4>(1); // [B, 1, U+1, J]
        self.combine(e, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};
    use burn::tensor::Distribution;

    /// The fused sequence equals Burn's `Lstm::forward` from the zero state, values and input
    /// gradients (sums in another order; on NdArray it runs the host recurrence: measured
    /// 8.9e-8 and 2.4e-7 at most).
    #[test]
    fn lstm_sequence_matches_burn_s_lstm() {
        type B = Autodiff<NdArray>;
        let device = Default::default();
        let layer = LstmConfig::new(12, 16, true).init::<B>(&device);
        let x = Tensor::<B, 3>::random([3, 7, 12], Distribution::Normal(0.0, 1.0), &device)
            .require_grad();
        let want = layer.forward(x.clone(), None).0;
        let got = lstm_sequence(&layer, x.clone());
        let gw = want.clone().sum().backward();
        let gg = got.clone().sum().backward();
        let diff = |a: Vec<f32>, b: Vec<f32>| {
            a.iter().zip(&b).fold(0f32, |m, (p, q)| m.max((p - q).abs()))
        };
        let out = diff(got.into_data().to_vec().unwrap(), want.into_data().to_vec().unwrap());
        let grad = diff(
            x.grad(&gg).unwrap().into_data().to_vec().unwrap(),
            x.grad(&gw).unwrap().into_data().to_vec().unwrap(),
        );
        eprintln!("lstm_sequence: output {out:.2e}, input gradient {grad:.2e}");
        assert!(out < 4e-7 && grad < 9e-7, "output {out}, gradient {grad}");
    }

    fn max_diff<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> (f32, f32) {
        let (a, b) =
            (a.into_data().to_vec::<f32>().unwrap(), b.into_data().to_vec::<f32>().unwrap());
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        (a.iter().zip(&b).fold(0f32, |m, (p, q)| m.max((p - q).abs())), scale)
    }

    /// The host recurrence (`host_lstm`) against the graph form (`recurrence`): the outputs,
    /// and the gradients of the projections and of the hidden weight under a weighted sum of
    /// the outputs (measured 1.2e-7, 1.8e-7 and 2.4e-7 at most over three runs); the bare
    /// backend's forward equals the tracked one's.
    #[test]
    fn host_recurrence_matches_the_graph_form_and_its_gradients() {
        type B = Autodiff<NdArray>;
        let device = Default::default();
        let (b, s, h) = (3, 9, 16);
        let normal = Distribution::Normal(0.0, 1.0);
        let xin = Tensor::<B, 3>::random([b, s, 4 * h], normal, &device).require_grad();
        let w = Tensor::<B, 2>::random([h, 4 * h], Distribution::Normal(0.0, 0.3), &device)
            .require_grad();
        let mix = Tensor::<B, 3>::random([b, s, h], normal, &device);
        let host = super::super::host_lstm::on_host(&xin, &w).expect("NdArray takes the host path");
        let graph = recurrence(xin.clone(), w.clone());
        let gh = (host.clone() * mix.clone()).sum().backward();
        let gg = (graph.clone() * mix).sum().backward();
        let (out, _) = max_diff(host.clone(), graph);
        let (dx, sx) = max_diff(xin.grad(&gh).unwrap(), xin.grad(&gg).unwrap());
        let (dw, sw) = max_diff(w.grad(&gh).unwrap(), w.grad(&gg).unwrap());
        eprintln!("host recurrence: output {out:.2e}, xin gradient {dx:.2e} of {sx:.2e}, weight gradient {dw:.2e} of {sw:.2e}");
        assert!(out < 5e-7 && dx < 5e-7 && dw < 8e-7, "{out} {dx} {dw}");
        let bare =
            super::super::host_lstm::on_host(&xin.inner(), &w.inner()).expect("bare NdArray");
        assert_eq!(bare.into_data(), host.inner().into_data());
    }
}
