//! Greedy TDT decoding of a Burn [`TdtModel`]: the adapter between the backend-independent
//! search in [`asr_tdt::greedy`] and the model's prediction network and joint.
//!
//! Everything the search carries between steps stays on the model's device: the projected
//! encoder output (`[B * T, J]`, projected once per batch), and per utterance the projected
//! prediction output and the LSTM states. Per step the host sends the rows' indices and reads
//! back two integers per row, the arg-max token and duration, which is all that label looping
//! needs to choose the next frames. The prediction network runs only on the rows that emitted a
//! label; their new states are put back in place by one gather from `[old; new]`, which copies
//! values exactly (no arithmetic blend).

use burn::nn::LstmState;
use burn::prelude::*;

use crate::model::TdtModel;
use asr_tdt::greedy::TdtDecoderModel;

/// A tensor's values on the host as f32.
fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().expect("the data was converted to f32")
}

/// Greedy decoding state of every utterance of a batch, on the device.
pub struct DeviceState<B: Backend> {
    /// Projected prediction output `[B, J]`.
    pred: Tensor<B, 2>,
    /// LSTM state of each layer, `[B, H]` each.
    lstm: Vec<LstmState<B, 2>>,
}

/// A [`TdtModel`] with one batch's projected encoder output, as the greedy search sees it.
pub struct BurnGreedy<'a, B: Backend> {
    model: &'a TdtModel<B>,
    /// Projected encoder output, `[B * T, J]`: row `b * T + t` is frame `t` of utterance `b`.
    enc: Tensor<B, 2>,
    t_max: usize,
    device: B::Device,
}

impl<'a, B: Backend> BurnGreedy<'a, B> {
    /// The decoder of one batch whose projected encoder output is `enc_proj` `[B, T, J]`.
    pub fn new(model: &'a TdtModel<B>, enc_proj: Tensor<B, 3>, device: &B::Device) -> Self {
        let [_, t_max, _] = enc_proj.dims();
        BurnGreedy { model, enc: enc_proj.flatten::<2>(0, 1), t_max, device: device.clone() }
    }

    fn indices(&self, values: impl IntoIterator<Item = usize>) -> Tensor<B, 1, Int> {
        let v: Vec<i64> = values.into_iter().map(|x| x as i64).collect();
        let n = v.len();
        Tensor::from_data(TensorData::new(v, [n]), &self.device)
    }

    /// Joint logits `[rows, V + D]` of utterance `rows[k]` at frame `frames[k]`, on the device.
    fn logits(&self, state: &DeviceState<B>, rows: &[usize], frames: &[usize]) -> Tensor<B, 2> {
        let at = self.indices(rows.iter().zip(frames).map(|(&b, &t)| b * self.t_max + t));
        let e = self.enc.clone().select(0, at);
        let p = state.pred.clone().select(0, self.indices(rows.iter().copied()));
        self.model.joint.combine(e, p)
    }
}

impl<B: Backend> TdtDecoderModel for BurnGreedy<'_, B> {
    type State = DeviceState<B>;

    fn start(&mut self, batch: usize) -> DeviceState<B> {
        let (out, lstm) = self.model.prediction.start_step(batch, &self.device);
        DeviceState { pred: self.model.joint.project_prediction(out), lstm }
    }

    fn joint(&mut self, state: &DeviceState<B>, rows: &[usize], frames: &[usize]) -> Vec<f32> {
        host(self.logits(state, rows, frames))
    }

    fn joint_argmax(
        &mut self,
        state: &DeviceState<B>,
        rows: &[usize],
        frames: &[usize],
        vocab: usize,
    ) -> Vec<(usize, usize)> {
        let z = self.logits(state, rows, frames);
        let [r, width] = z.dims();
        let token = z.clone().narrow(1, 0, vocab).argmax(1);
        let duration = z.narrow(1, vocab, width - vocab).argmax(1);
        // One read for both: [r, 2].
        let both = Tensor::cat(vec![token, duration], 1).into_data();
        let v: Vec<i64> = both.convert::<i64>().into_vec().expect("the data was converted to i64");
        debug_assert_eq!(v.len(), 2 * r);
        v.chunks_exact(2).map(|p| (p[0] as usize, p[1] as usize)).collect()
    }

    fn advance(&mut self, state: &mut DeviceState<B>, rows: &[usize], labels: &[usize]) {
        let n = state.pred.dims()[0];
        let emitting = self.indices(rows.iter().copied());
        let prev: Vec<LstmState<B, 2>> = state
            .lstm
            .iter()
            .map(|s| {
                LstmState::new(
                    s.cell.clone().select(0, emitting.clone()),
                    s.hidden.clone().select(0, emitting.clone()),
                )
            })
            .collect();
        let (out, next) =
            self.model.prediction.step(self.indices(labels.iter().copied()), Some(prev));
        let pred = self.model.joint.project_prediction(out);
        if rows.len() == n && rows.iter().enumerate().all(|(k, &b)| k == b) {
            // Every utterance emitted, in order: the new state is whole.
            *state = DeviceState { pred, lstm: next };
            return;
        }
        // Row b of [old; new] is b's old state and row n + k the new state of rows[k]: one
        // gather puts each utterance's state where it belongs.
        let mut source: Vec<usize> = (0..n).collect();
        for (k, &b) in rows.iter().enumerate() {
            source[b] = n + k;
        }
        let source = self.indices(source);
        let place = |old: Tensor<B, 2>, new: Tensor<B, 2>| {
            Tensor::cat(vec![old, new], 0).select(0, source.clone())
        };
        state.pred = place(state.pred.clone(), pred);
        for (s, new) in state.lstm.iter_mut().zip(next) {
            *s = LstmState::new(
                place(s.cell.clone(), new.cell),
                place(s.hidden.clone(), new.hidden),
            );
        }
    }
}
