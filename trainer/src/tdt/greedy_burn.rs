//! Greedy TDT decoding of a Burn [`TdtModel`]: the adapter between the backend-independent
//! search in [`super::greedy`] and the model's prediction network and joint. The encoder output
//! is projected once per batch; each decoding step runs the prediction network on the rows that
//! emitted a label.

use burn::nn::LstmState;
use burn::prelude::*;

use super::greedy::TdtDecoderModel;
use crate::model::TdtModel;

/// A tensor's values on the host as f32.
fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().expect("the data was converted to f32")
}

/// Greedy decoding state of one utterance.
pub struct RowState {
    pred: Vec<f32>,
    h: Vec<Vec<f32>>,
    c: Vec<Vec<f32>>,
}

/// A [`TdtModel`] with one batch's projected encoder output, as the greedy search sees it.
pub struct BurnGreedy<'a, B: Backend> {
    model: &'a TdtModel<B>,
    enc: Vec<f32>,
    t_max: usize,
    joint: usize,
    device: B::Device,
}

impl<'a, B: Backend> BurnGreedy<'a, B> {
    /// The decoder of one batch whose projected encoder output is `enc_proj` `[B, T, J]`.
    pub fn new(model: &'a TdtModel<B>, enc_proj: Tensor<B, 3>, device: &B::Device) -> Self {
        let [_, t_max, joint] = enc_proj.dims();
        BurnGreedy { model, enc: host(enc_proj), t_max, joint, device: device.clone() }
    }

    fn run_step(&self, labels: &[usize], prev: Option<Vec<&RowState>>) -> Vec<RowState> {
        let r = labels.len();
        let ids: Vec<i64> = labels.iter().map(|&l| l as i64).collect();
        let labels = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [r]), &self.device);
        let state = prev.map(|rows| {
            let layers = rows[0].h.len();
            let hdim = rows[0].h[0].len();
            (0..layers)
                .map(|l| {
                    let h: Vec<f32> = rows.iter().flat_map(|s| s.h[l].iter().copied()).collect();
                    let c: Vec<f32> = rows.iter().flat_map(|s| s.c[l].iter().copied()).collect();
                    LstmState::new(
                        Tensor::from_data(TensorData::new(c, [r, hdim]), &self.device),
                        Tensor::from_data(TensorData::new(h, [r, hdim]), &self.device),
                    )
                })
                .collect()
        });
        let (out, next) = self.model.prediction.step(labels, state);
        let pred = host(self.model.joint.project_prediction(out));
        let hs: Vec<Vec<f32>> = next.iter().map(|s| host(s.hidden.clone())).collect();
        let cs: Vec<Vec<f32>> = next.iter().map(|s| host(s.cell.clone())).collect();
        let hdim = hs.first().map_or(0, |h| h.len() / r.max(1));
        (0..r)
            .map(|k| RowState {
                pred: pred[k * self.joint..(k + 1) * self.joint].to_vec(),
                h: hs.iter().map(|h| h[k * hdim..(k + 1) * hdim].to_vec()).collect(),
                c: cs.iter().map(|c| c[k * hdim..(k + 1) * hdim].to_vec()).collect(),
            })
            .collect()
    }
}

impl<B: Backend> TdtDecoderModel for BurnGreedy<'_, B> {
    type State = Vec<RowState>;

    fn start(&mut self, batch: usize) -> Vec<RowState> {
        let blank = self.model.prediction_blank();
        self.run_step(&vec![blank; batch], None)
    }

    fn joint(&mut self, state: &Vec<RowState>, rows: &[usize], frames: &[usize]) -> Vec<f32> {
        let (r, j) = (rows.len(), self.joint);
        let mut e = Vec::with_capacity(r * j);
        let mut p = Vec::with_capacity(r * j);
        for (&b, &t) in rows.iter().zip(frames) {
            let at = (b * self.t_max + t) * j;
            e.extend_from_slice(&self.enc[at..at + j]);
            p.extend_from_slice(&state[b].pred);
        }
        let e = Tensor::<B, 2>::from_data(TensorData::new(e, [r, j]), &self.device);
        let p = Tensor::<B, 2>::from_data(TensorData::new(p, [r, j]), &self.device);
        host(self.model.joint.combine(e, p))
    }

    fn advance(&mut self, state: &mut Vec<RowState>, rows: &[usize], labels: &[usize]) {
        let prev: Vec<&RowState> = rows.iter().map(|&b| &state[b]).collect();
        let next = self.run_step(labels, Some(prev));
        for (&b, s) in rows.iter().zip(next) {
            state[b] = s;
        }
    }
}
