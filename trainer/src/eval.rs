//! Evaluation: greedy TDT decoding of a corpus with a trained model, word and character error
//! rates per language. Hypothesis ids become text through the corpus's own SentencePiece model,
//! read here from its bytes (a small protobuf reader: the trainer links no SentencePiece library).

use std::collections::BTreeMap;

use asr_corpus::Corpus;
use burn::nn::LstmState;
use burn::prelude::*;
use serde::Serialize;

use crate::model::mel::MelFrontend;
use crate::model::{ModelConfig, TdtModel};
use crate::tdt::greedy::{greedy_batch, GreedyOptions, TdtDecoderModel};

/// A SentencePiece piece's type (sentencepiece_model.proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    /// Ordinary text.
    Normal,
    /// `<unk>`.
    Unknown,
    /// `<s>`, `</s>`: no text.
    Control,
    /// User-defined symbols such as `<|hi|>`.
    UserDefined,
    /// Unused.
    Unused,
    /// `<0xAB>`: one byte.
    Byte,
}

/// The pieces of a SentencePiece model, for detokenization.
#[derive(Debug, Clone)]
pub struct Pieces {
    pieces: Vec<(String, PieceType)>,
}

fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// One protobuf field: number, wire type, length-delimited payload, varint value.
type Field<'a> = (u64, u8, &'a [u8], u64);

/// Walks the fields of one protobuf message.
fn fields(b: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let key = varint(b, &mut at)?;
        let (field, wire) = (key >> 3, (key & 7) as u8);
        match wire {
            0 => {
                let v = varint(b, &mut at)?;
                out.push((field, wire, &b[0..0], v));
            }
            1 => {
                at = at.checked_add(8).filter(|&e| e <= b.len())?;
            }
            2 => {
                let len = usize::try_from(varint(b, &mut at)?).ok()?;
                let end = at.checked_add(len).filter(|&e| e <= b.len())?;
                out.push((field, wire, &b[at..end], 0));
                at = end;
            }
            5 => {
                at = at.checked_add(4).filter(|&e| e <= b.len())?;
            }
            _ => return None,
        }
    }
    Some(out)
}

impl Pieces {
    /// Reads the pieces of a serialized `ModelProto`.
    pub fn parse(model: &[u8]) -> Result<Pieces, String> {
        let bad = || "the corpus's tokenizer is not a readable SentencePiece model".to_owned();
        let mut pieces = Vec::new();
        for (field, wire, body, _) in fields(model).ok_or_else(bad)? {
            if field != 1 || wire != 2 {
                continue;
            }
            let mut text = String::new();
            let mut kind = PieceType::Normal;
            for (f, w, b, v) in fields(body).ok_or_else(bad)? {
                match (f, w) {
                    (1, 2) => text = String::from_utf8_lossy(b).into_owned(),
                    (3, 0) => {
                        kind = match v {
                            2 => PieceType::Unknown,
                            3 => PieceType::Control,
                            4 => PieceType::UserDefined,
                            5 => PieceType::Unused,
                            6 => PieceType::Byte,
                            _ => PieceType::Normal,
                        }
                    }
                    _ => {}
                }
            }
            pieces.push((text, kind));
        }
        if pieces.is_empty() {
            return Err(bad());
        }
        Ok(Pieces { pieces })
    }

    /// Number of pieces.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Text of token ids: pieces joined, `▁` as a space, control pieces and `<|xx|>` language
    /// tags dropped, byte pieces decoded, whitespace collapsed.
    pub fn decode(&self, ids: &[usize]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            let Some((p, kind)) = self.pieces.get(id) else { continue };
            match kind {
                PieceType::Control | PieceType::Unused => {}
                PieceType::UserDefined if p.starts_with("<|") && p.ends_with("|>") => {}
                PieceType::Byte => {
                    if let Some(b) = p.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                        if let Ok(v) = u8::from_str_radix(b, 16) {
                            bytes.push(v);
                        }
                    }
                }
                PieceType::Unknown => bytes.extend_from_slice(" \u{2047} ".as_bytes()),
                _ => bytes.extend_from_slice(p.replace('\u{2581}', " ").as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

/// Edit distance between two sequences.
pub fn edit_distance<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, x) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(x != y)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// Error counts of one language.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ErrorRates {
    /// Utterances.
    pub utterances: u64,
    /// Word edits and reference words.
    pub word_errors: u64,
    /// Reference words.
    pub words: u64,
    /// Character edits.
    pub char_errors: u64,
    /// Reference characters.
    pub chars: u64,
    /// word_errors / words.
    pub wer: f64,
    /// char_errors / chars.
    pub cer: f64,
}

impl ErrorRates {
    fn add(&mut self, reference: &str, hypothesis: &str) {
        let rw: Vec<&str> = reference.split_whitespace().collect();
        let hw: Vec<&str> = hypothesis.split_whitespace().collect();
        let rc: Vec<char> = reference.chars().collect();
        let hc: Vec<char> = hypothesis.chars().collect();
        self.utterances += 1;
        self.word_errors += edit_distance(&rw, &hw) as u64;
        self.words += rw.len() as u64;
        self.char_errors += edit_distance(&rc, &hc) as u64;
        self.chars += rc.len() as u64;
        self.wer = self.word_errors as f64 / self.words.max(1) as f64;
        self.cer = self.char_errors as f64 / self.chars.max(1) as f64;
    }
}

/// One decoded utterance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decoded {
    /// Corpus index.
    pub index: usize,
    /// Language.
    pub language: String,
    /// Reference text.
    pub reference: String,
    /// Hypothesis text.
    pub hypothesis: String,
}

/// Evaluation results.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Evaluation {
    /// Per language.
    pub languages: BTreeMap<String, ErrorRates>,
    /// All utterances.
    pub overall: ErrorRates,
    /// Every utterance's texts.
    pub utterances: Vec<Decoded>,
}

/// Greedy decoding state: per utterance, the projected prediction output and LSTM states.
struct RowState {
    pred: Vec<f32>,
    h: Vec<Vec<f32>>,
    c: Vec<Vec<f32>>,
}

struct Decoder<'a, B: Backend> {
    model: &'a TdtModel<B>,
    enc: Vec<f32>,
    t_max: usize,
    joint: usize,
    device: B::Device,
}

impl<B: Backend> Decoder<'_, B> {
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
        let pred = self
            .model
            .joint
            .project_prediction(out)
            .into_data()
            .to_vec::<f32>()
            .unwrap_or_default();
        let host = |t: Tensor<B, 2>| t.into_data().to_vec::<f32>().unwrap_or_default();
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

impl<B: Backend> TdtDecoderModel for Decoder<'_, B> {
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
        self.model.joint.combine(e, p).into_data().to_vec::<f32>().unwrap_or_default()
    }

    fn advance(&mut self, state: &mut Vec<RowState>, rows: &[usize], labels: &[usize]) {
        let prev: Vec<&RowState> = rows.iter().map(|&b| &state[b]).collect();
        let next = self.run_step(labels, Some(prev));
        for (&b, s) in rows.iter().zip(next) {
            state[b] = s;
        }
    }
}

/// Decodes `indices` of `corpus` in batches of at most `batch_seconds` of audio.
pub fn evaluate<B: Backend>(
    model: &TdtModel<B>,
    cfg: &ModelConfig,
    corpus: &Corpus,
    indices: &[usize],
    batch_seconds: f64,
    device: &B::Device,
) -> Result<Evaluation, String> {
    let pieces = Pieces::parse(corpus.tokenizer_model())?;
    let vocab = corpus.metadata().tokenizer.vocab_size as usize;
    let frontend = MelFrontend::<B>::new(&cfg.preprocessor, device);
    let opts =
        GreedyOptions { vocab: vocab + 1, durations: cfg.durations.clone(), max_symbols: Some(10) };
    let mut order = indices.to_vec();
    order.sort_by_key(|&i| corpus.num_samples()[i]);
    let mut out = Evaluation::default();
    let rate = f64::from(corpus.header().sample_rate);
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len()
            && (end + 1 - start) as f64 * f64::from(corpus.num_samples()[order[end]]) / rate
                <= batch_seconds
        {
            end += 1;
        }
        let batch = &order[start..end];
        let lens: Vec<u32> = batch.iter().map(|&i| corpus.num_samples()[i]).collect();
        let max = lens.iter().copied().max().unwrap_or(0) as usize;
        let mut pcm = vec![0i16; batch.len() * max];
        for (row, &i) in pcm.chunks_exact_mut(max.max(1)).zip(batch) {
            let x = corpus.pcm(i);
            row[..x.len()].copy_from_slice(x);
        }
        let (feats, frame_lens) = frontend.forward(&pcm, batch.len(), &lens, None, device);
        let (enc, enc_lens) = model.encode(cfg, feats, &frame_lens);
        let t_max = enc.dims()[1];
        let proj = model.joint.project_encoder(enc);
        let joint = proj.dims()[2];
        let enc = proj.into_data().to_vec::<f32>().map_err(|e| format!("{e:?}"))?;
        let mut dec = Decoder { model, enc, t_max, joint, device: device.clone() };
        let hyps = greedy_batch(&mut dec, &enc_lens, &opts);
        for (&i, h) in batch.iter().zip(hyps) {
            let reference = corpus.text(i).map_err(|e| e.to_string())?.1;
            let hypothesis = pieces.decode(&h.tokens);
            let language = corpus.language_code(i).to_owned();
            out.languages.entry(language.clone()).or_default().add(&reference, &hypothesis);
            out.overall.add(&reference, &hypothesis);
            out.utterances.push(Decoded { index: i, language, reference, hypothesis });
        }
        start = end;
    }
    out.utterances.sort_by_key(|d| d.index);
    Ok(out)
}

/// Decodes the first `limit` utterances of `corpus` (all with `None`) with a checkpoint's model
/// on the CPU backend.
pub fn evaluate_checkpoint_cpu(
    ckpt: &std::path::Path,
    corpus: &Corpus,
    limit: Option<usize>,
    batch_seconds: f64,
) -> Result<Evaluation, String> {
    type Cpu = burn::backend::NdArray;
    let state = crate::train::checkpoint::load_state(ckpt)?;
    let vocab = corpus.metadata().tokenizer.vocab_size as usize;
    if vocab != state.vocab {
        return Err(format!(
            "the corpus has a vocabulary of {vocab}, the checkpoint {}",
            state.vocab
        ));
    }
    let device = Default::default();
    let model = TdtModel::<Cpu>::new(&state.config.model, vocab, 0, &device);
    let model = crate::train::checkpoint::load_model(ckpt, model, &device)?;
    let n = limit.unwrap_or(corpus.len()).min(corpus.len());
    let indices: Vec<usize> = (0..n).collect();
    evaluate(&model, &state.config.model, corpus, &indices, batch_seconds, &device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_substitutions_insertions_deletions() {
        assert_eq!(edit_distance(&["a", "b", "c"], &["a", "x", "c", "d"]), 2);
        assert_eq!(edit_distance::<char>(&[], &['a', 'b']), 2);
        assert_eq!(
            edit_distance(&['k', 'i', 't', 't', 'e', 'n'], &['s', 'i', 't', 't', 'i', 'n', 'g']),
            3
        );
    }
}
