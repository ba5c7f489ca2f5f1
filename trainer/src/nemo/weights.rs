//! The map between NeMo's state-dict keys and this model's parameters, both ways.
//!
//! Every NeMo tensor of a FastConformer-TDT model is one [`Entry`]: its key, its shape, and the
//! parameter(s) of ours it becomes. Layouts differ in three ways only: PyTorch keeps linear and
//! convolution weights as `[out, in, taps...]` where we keep `[taps..., out]`-style `[in, out]`
//! (a transpose of the 2-D view), and an LSTM layer's four gates are stacked in one `[4H, in]`
//! matrix (PyTorch's order i, f, g, o) where Burn has one linear map per gate. The
//! preprocessor's window and filterbank are constants we compute; they are checked against the
//! file on import and written on export. BatchNorm's `num_batches_tracked` is not kept.

use std::collections::{BTreeMap, HashMap};

use burn::module::ParamId;
use burn::prelude::*;
use burn_store::{ModuleSnapshot, TensorSnapshot};

use super::torch_file::TorchTensor;
use super::ImportError;
use crate::model::encoder::encoded_len;
use crate::model::mel::{hann_window, mel_filterbank};
use crate::model::{ModelConfig, TdtModel};

/// How one NeMo tensor becomes (part of) one parameter of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Same shape and order.
    Same,
    /// NeMo `[n0, rest...]` is ours `[prod(rest), n0]`.
    Transpose,
    /// Rows `g*H..(g+1)*H` of NeMo's `[4H, in]`, transposed: ours `[in, H]`.
    GateRows(usize),
    /// Elements `g*H..(g+1)*H` of NeMo's `[4H]`.
    GateSlice(usize),
}

/// One NeMo tensor and what it is here.
#[derive(Debug, Clone)]
pub struct Entry {
    /// NeMo's key.
    pub key: String,
    /// NeMo's shape.
    pub shape: Vec<usize>,
    parts: Vec<(String, Layout)>,
}

/// BatchNorm's step counter, present in NeMo's state dicts and not kept here.
pub const NUM_BATCHES_TRACKED: &str = "num_batches_tracked";
/// The preprocessor's constant tensors.
pub const WINDOW_KEY: &str = "preprocessor.featurizer.window";
/// The mel filterbank, `[1, features, n_fft / 2 + 1]`.
pub const FILTERBANK_KEY: &str = "preprocessor.featurizer.fb";

struct Builder(Vec<Entry>);

impl Builder {
    fn one(&mut self, key: String, shape: Vec<usize>, ours: String, layout: Layout) {
        self.0.push(Entry { key, shape, parts: vec![(ours, layout)] });
    }

    /// A PyTorch `Linear` (or 1x1 convolution of `extra` trailing singleton dims) as a Burn
    /// `Linear`.
    fn linear(&mut self, nemo: &str, ours: &str, d_in: usize, d_out: usize, bias: bool) {
        self.one(
            format!("{nemo}.weight"),
            vec![d_out, d_in],
            format!("{ours}.weight"),
            Layout::Transpose,
        );
        if bias {
            self.one(format!("{nemo}.bias"), vec![d_out], format!("{ours}.bias"), Layout::Same);
        }
    }

    fn conv_1x1(&mut self, nemo: &str, ours: &str, d_in: usize, d_out: usize, dims: usize) {
        let mut shape = vec![d_out, d_in];
        shape.resize(dims, 1);
        self.one(format!("{nemo}.weight"), shape, format!("{ours}.weight"), Layout::Transpose);
        self.one(format!("{nemo}.bias"), vec![d_out], format!("{ours}.bias"), Layout::Same);
    }

    fn layer_norm(&mut self, nemo: &str, ours: &str, d: usize) {
        self.one(format!("{nemo}.weight"), vec![d], format!("{ours}.gamma"), Layout::Same);
        self.one(format!("{nemo}.bias"), vec![d], format!("{ours}.beta"), Layout::Same);
    }
}

/// Output width of the joint: vocabulary, blank, durations.
fn joint_outputs(cfg: &ModelConfig, vocab: usize) -> usize {
    vocab + 1 + cfg.durations.len()
}

/// Every parameter tensor of a NeMo FastConformer-TDT with this configuration, in NeMo's order.
pub fn entries(cfg: &ModelConfig, vocab: usize) -> Vec<Entry> {
    let e = &cfg.encoder;
    let (d, c) = (e.d_model, e.subsampling_conv_channels);
    let stages = e.subsampling_factor.trailing_zeros() as usize;
    // The mel bands left after subsampling (it strides over them as over frames).
    let f = encoded_len(e, cfg.preprocessor.features);
    let mut b = Builder(Vec::new());
    let pre = "encoder.pre_encode";
    let sub = "encoder.subsampling";
    b.linear(&format!("{pre}.out"), &format!("{sub}.out"), c * f, d, true);
    b.one(
        format!("{pre}.conv.0.weight"),
        vec![c, 1, 3, 3],
        format!("{sub}.first.weight"),
        Layout::Transpose,
    );
    b.one(format!("{pre}.conv.0.bias"), vec![c], format!("{sub}.first.bias"), Layout::Same);
    for s in 1..stages {
        let (dw, pw) = (2 + 3 * (s - 1), 3 + 3 * (s - 1));
        b.one(
            format!("{pre}.conv.{dw}.weight"),
            vec![c, 1, 3, 3],
            format!("{sub}.depthwise.{}.weight", s - 1),
            Layout::Transpose,
        );
        b.one(
            format!("{pre}.conv.{dw}.bias"),
            vec![c],
            format!("{sub}.depthwise.{}.bias", s - 1),
            Layout::Same,
        );
        b.conv_1x1(&format!("{pre}.conv.{pw}"), &format!("{sub}.pointwise.{}", s - 1), c, c, 4);
    }
    for n in 0..e.n_layers {
        let (nl, ol) = (format!("encoder.layers.{n}"), format!("encoder.layers.{n}"));
        b.layer_norm(&format!("{nl}.norm_feed_forward1"), &format!("{ol}.norm_ff1"), d);
        b.linear(
            &format!("{nl}.feed_forward1.linear1"),
            &format!("{ol}.ff1.up"),
            d,
            e.ff_dim,
            true,
        );
        b.linear(
            &format!("{nl}.feed_forward1.linear2"),
            &format!("{ol}.ff1.down"),
            e.ff_dim,
            d,
            true,
        );
        b.layer_norm(&format!("{nl}.norm_conv"), &format!("{ol}.norm_conv"), d);
        b.conv_1x1(
            &format!("{nl}.conv.pointwise_conv1"),
            &format!("{ol}.conv.pointwise1"),
            d,
            2 * d,
            3,
        );
        b.one(
            format!("{nl}.conv.depthwise_conv.weight"),
            vec![d, 1, e.conv_kernel_size],
            format!("{ol}.conv.depthwise.weight"),
            Layout::Transpose,
        );
        b.one(
            format!("{nl}.conv.depthwise_conv.bias"),
            vec![d],
            format!("{ol}.conv.depthwise.bias"),
            Layout::Same,
        );
        for (nk, ok) in [
            ("weight", "gamma"),
            ("bias", "beta"),
            ("running_mean", "running_mean"),
            ("running_var", "running_var"),
        ] {
            b.one(
                format!("{nl}.conv.batch_norm.{nk}"),
                vec![d],
                format!("{ol}.conv.norm.{ok}"),
                Layout::Same,
            );
        }
        b.conv_1x1(
            &format!("{nl}.conv.pointwise_conv2"),
            &format!("{ol}.conv.pointwise2"),
            d,
            d,
            3,
        );
        b.layer_norm(&format!("{nl}.norm_self_att"), &format!("{ol}.norm_att"), d);
        let (h, dk) = (e.n_heads, d / e.n_heads);
        for bias in ["pos_bias_u", "pos_bias_v"] {
            b.one(
                format!("{nl}.self_attn.{bias}"),
                vec![h, dk],
                format!("{ol}.att.{bias}"),
                Layout::Same,
            );
        }
        for (nk, ok) in
            [("linear_q", "q"), ("linear_k", "k"), ("linear_v", "v"), ("linear_out", "out")]
        {
            b.linear(&format!("{nl}.self_attn.{nk}"), &format!("{ol}.att.{ok}"), d, d, true);
        }
        b.linear(&format!("{nl}.self_attn.linear_pos"), &format!("{ol}.att.pos"), d, d, false);
        b.layer_norm(&format!("{nl}.norm_feed_forward2"), &format!("{ol}.norm_ff2"), d);
        b.linear(
            &format!("{nl}.feed_forward2.linear1"),
            &format!("{ol}.ff2.up"),
            d,
            e.ff_dim,
            true,
        );
        b.linear(
            &format!("{nl}.feed_forward2.linear2"),
            &format!("{ol}.ff2.down"),
            e.ff_dim,
            d,
            true,
        );
        b.layer_norm(&format!("{nl}.norm_out"), &format!("{ol}.norm_out"), d);
    }
    let hp = cfg.decoder.pred_hidden;
    b.one(
        "decoder.prediction.embed.weight".into(),
        vec![vocab + 1, hp],
        "prediction.embedding.weight".into(),
        Layout::Same,
    );
    // PyTorch stacks an LSTM's gates as input, forget, cell (g), output.
    const GATES: [&str; 4] = ["input_gate", "forget_gate", "cell_gate", "output_gate"];
    for l in 0..cfg.decoder.pred_rnn_layers {
        let nemo = "decoder.prediction.dec_rnn.lstm";
        for (part, transform) in [("ih", "input_transform"), ("hh", "hidden_transform")] {
            let gates = |what: &str, layout: fn(usize) -> Layout| -> Vec<(String, Layout)> {
                (0..4)
                    .map(|g| {
                        (
                            format!("prediction.layers.{l}.{}.{transform}.{what}", GATES[g]),
                            layout(g),
                        )
                    })
                    .collect()
            };
            b.0.push(Entry {
                key: format!("{nemo}.weight_{part}_l{l}"),
                shape: vec![4 * hp, hp],
                parts: gates("weight", Layout::GateRows),
            });
            b.0.push(Entry {
                key: format!("{nemo}.bias_{part}_l{l}"),
                shape: vec![4 * hp],
                parts: gates("bias", Layout::GateSlice),
            });
        }
    }
    let j = cfg.joint.joint_hidden;
    b.linear("joint.pred", "joint.pred", hp, j, true);
    b.linear("joint.enc", "joint.enc", d, j, true);
    b.linear(JOINT_OUT, "joint.out", j, joint_outputs(cfg, vocab), true);
    b.0
}

/// NeMo's key of the joint's output layer: `joint_net` is `[ReLU, Linear]` when
/// `jointnet.dropout` is 0, as this model (and its export) has it.
const JOINT_OUT: &str = "joint.joint_net.1";
/// The same layer's key in a NeMo model trained with joint dropout (`[ReLU, Dropout, Linear]`).
const JOINT_OUT_WITH_DROPOUT: &str = "joint.joint_net.2";

/// The key `key` may be stored under in a NeMo state dict, besides itself.
fn alternative(key: &str) -> Option<String> {
    let rest = key.strip_prefix(JOINT_OUT)?.strip_prefix('.')?;
    Some(format!("{JOINT_OUT_WITH_DROPOUT}.{rest}"))
}

/// NeMo's shape of our part: `(values, shape)` of ours from NeMo's row-major `values`.
fn to_ours(layout: Layout, shape: &[usize], values: &[f32]) -> (Vec<f32>, Vec<usize>) {
    match layout {
        Layout::Same => (values.to_vec(), shape.to_vec()),
        Layout::Transpose => {
            let (rows, cols) = (shape[0], shape[1..].iter().product::<usize>());
            (transpose(values, rows, cols), vec![cols, rows])
        }
        Layout::GateRows(g) => {
            let (h, cols) = (shape[0] / 4, shape[1]);
            (transpose(&values[g * h * cols..(g + 1) * h * cols], h, cols), vec![cols, h])
        }
        Layout::GateSlice(g) => {
            let h = shape[0] / 4;
            (values[g * h..(g + 1) * h].to_vec(), vec![h])
        }
    }
}

/// `[rows, cols]` to `[cols, rows]`.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

/// The front end's window as NeMo's featurizer keeps it, in f32.
fn hann(win: usize) -> Vec<f32> {
    hann_window(win).into_iter().map(|x| x as f32).collect()
}

/// Our filterbank in NeMo's layout `[1, features, bins]`.
fn filterbank(cfg: &ModelConfig) -> (Vec<f32>, Vec<usize>) {
    let p = &cfg.preprocessor;
    let bins = p.n_fft / 2 + 1;
    let fb = mel_filterbank(p.sample_rate, p.n_fft, p.features);
    let mut out = vec![0f32; bins * p.features];
    for k in 0..bins {
        for m in 0..p.features {
            out[m * bins + k] = fb[k * p.features + m] as f32;
        }
    }
    (out, vec![1, p.features, bins])
}

/// What loading a state dict did besides setting every parameter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeightReport {
    /// NeMo tensors set.
    pub tensors: usize,
    /// Parameters (scalars) set.
    pub parameters: usize,
    /// Keys ignored on purpose (BatchNorm step counters, a hybrid model's CTC head), by prefix.
    pub ignored: BTreeMap<String, usize>,
    /// Keys with no meaning here that `allow_unmapped` let through.
    pub unmapped: Vec<String>,
}

/// A state dict's tensors as f32: key to (shape, values).
pub type StateDict = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads a PyTorch state dict file (`torch.save`'s zip container, or a legacy pickle) with
/// burn-store's reader; non-float tensors (step counters) are kept by shape only.
pub fn read_state_dict(path: &std::path::Path, source: &str) -> Result<StateDict, ImportError> {
    let r = burn_store::pytorch::PytorchReader::new(path)
        .map_err(|e| ImportError::StateDict { file: source.to_owned(), detail: e.to_string() })?;
    let mut out = StateDict::new();
    for (key, snap) in r.into_tensors() {
        if !snap.dtype.is_float() {
            out.insert(key, (snap.shape.to_vec(), Vec::new()));
            continue;
        }
        let data = snap.to_data().map_err(|e| ImportError::StateDict {
            file: source.to_owned(),
            detail: format!("{key}: {e:?}"),
        })?;
        let shape = data.shape.to_vec();
        let values = data.convert::<f32>().to_vec::<f32>().map_err(|e| ImportError::StateDict {
            file: source.to_owned(),
            detail: format!("{key}: {e:?}"),
        })?;
        out.insert(key, (shape, values));
    }
    Ok(out)
}

/// Reads the state dict of a `.nemo` archive: the member is copied to a temporary file (the
/// zip container is read from a file).
pub fn read_archive_state_dict(archive: &asr_nemo::Archive) -> Result<StateDict, ImportError> {
    let source = format!("{}:{}", archive.path().display(), asr_nemo::WEIGHTS_MEMBER);
    let tmp = tempfile::NamedTempFile::new().map_err(|e| ImportError::Io {
        action: "creating a temporary file for",
        path: archive.path().to_owned(),
        source: e,
    })?;
    let copied = archive.with_weights(|r| {
        let mut w = std::io::BufWriter::new(tmp.as_file());
        std::io::copy(r, &mut w).and_then(|_| std::io::Write::flush(&mut w))
    })?;
    copied.map_err(|e| {
        ImportError::Nemo(asr_nemo::NemoError::Tar {
            path: archive.path().to_owned(),
            detail: format!("reading {}: {e}", asr_nemo::WEIGHTS_MEMBER),
        })
    })?;
    read_state_dict(tmp.path(), &source)
}

/// Options of [`load`].
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Keys to ignore, by prefix, with the reason (a hybrid model's `ctc_decoder.`).
    pub ignore_prefixes: Vec<(String, String)>,
    /// Let keys that map to nothing through (listed in the report) instead of failing.
    pub allow_unmapped: bool,
}

/// Sets every parameter of `model` from NeMo state dict `sd`. Fails, naming the key, on a
/// missing key, a shape that differs (both shapes named), a preprocessor constant that differs
/// from ours, or (unless allowed) a key that maps to nothing.
pub fn load<B: Backend>(
    model: TdtModel<B>,
    cfg: &ModelConfig,
    vocab: usize,
    sd: &StateDict,
    opts: &LoadOptions,
) -> Result<(TdtModel<B>, WeightReport), ImportError> {
    let mut report = WeightReport::default();
    let mut tensors = Vec::new();
    let mut used = std::collections::HashSet::new();
    for mut entry in entries(cfg, vocab) {
        if !sd.contains_key(&entry.key) {
            if let Some(alt) = alternative(&entry.key).filter(|a| sd.contains_key(a)) {
                entry.key = alt;
            }
        }
        let Some((shape, values)) = sd.get(&entry.key) else {
            return Err(ImportError::MissingKey { key: entry.key, shape: entry.shape });
        };
        if *shape != entry.shape {
            return Err(ImportError::Shape {
                key: entry.key,
                expected: entry.shape,
                found: shape.clone(),
            });
        }
        report.tensors += 1;
        report.parameters += values.len();
        for (path, layout) in &entry.parts {
            let (v, s) = to_ours(*layout, shape, values);
            tensors.push((path.clone(), TensorData::new(v, s)));
        }
        used.insert(entry.key);
    }
    check_constant(sd, WINDOW_KEY, &hann(cfg.preprocessor.window_size), 1e-6)?;
    let (fb, _) = filterbank(cfg);
    check_constant(sd, FILTERBANK_KEY, &fb, 1e-6)?;
    let model = apply_tensors(model, tensors)?;
    let mut unmapped: Vec<String> = Vec::new();
    let mut keys: Vec<&String> = sd.keys().collect();
    keys.sort();
    for key in keys {
        if used.contains(key) || key == WINDOW_KEY || key == FILTERBANK_KEY {
            continue;
        }
        if key.ends_with(NUM_BATCHES_TRACKED) {
            *report
                .ignored
                .entry(format!("*.{NUM_BATCHES_TRACKED} (BatchNorm step counters)"))
                .or_default() += 1;
            continue;
        }
        if let Some((_, why)) =
            opts.ignore_prefixes.iter().find(|(p, _)| key.starts_with(p.as_str()))
        {
            *report.ignored.entry(why.clone()).or_default() += 1;
            continue;
        }
        unmapped.push(key.clone());
    }
    if !unmapped.is_empty() && !opts.allow_unmapped {
        return Err(ImportError::Unmapped { keys: unmapped });
    }
    report.unmapped = unmapped;
    Ok((model, report))
}

/// Sets every parameter of `model` from `tensors` (our paths, our layouts). The tensors come
/// from our own table or our own model, so a path or shape that does not fit is a bug here.
pub(crate) fn apply_tensors<B: Backend>(
    mut model: TdtModel<B>,
    tensors: Vec<(String, TensorData)>,
) -> Result<TdtModel<B>, ImportError> {
    let snaps = tensors
        .into_iter()
        .map(|(path, data)| {
            let stack = path.split('.').map(str::to_owned).collect();
            TensorSnapshot::from_data(data, stack, Vec::new(), ParamId::new())
        })
        .collect();
    let result = model.apply(snaps, None, None, false);
    if !result.errors.is_empty() || !result.missing.is_empty() || !result.unused.is_empty() {
        return Err(ImportError::Internal(format!(
            "parameter map and model disagree: errors {:?}, parameters not set {:?}, unknown paths {:?}",
            result.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            result.missing.iter().map(|m| &m.0).collect::<Vec<_>>(),
            result.unused
        )));
    }
    Ok(model)
}

fn check_constant(sd: &StateDict, key: &str, ours: &[f32], tol: f32) -> Result<(), ImportError> {
    let Some((_, theirs)) = sd.get(key) else {
        return Err(ImportError::MissingKey { key: key.to_owned(), shape: vec![ours.len()] });
    };
    if theirs.len() != ours.len() {
        return Err(ImportError::Constant {
            key: key.to_owned(),
            detail: format!(
                "{} values, expected {} for this configuration",
                theirs.len(),
                ours.len()
            ),
        });
    }
    let scale = ours.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    if let Some((i, (a, b))) =
        ours.iter().zip(theirs).enumerate().find(|(_, (a, b))| (*a - *b).abs() > tol * scale)
    {
        return Err(ImportError::Constant {
            key: key.to_owned(),
            detail: format!(
                "value {i} is {b}, this front end computes {a} (a front end other than a Slaney \
                 mel filterbank with a symmetric Hann window is not supported)"
            ),
        });
    }
    Ok(())
}

/// The model's weights as a NeMo state dict, in NeMo's key order.
pub fn state_dict<B: Backend>(
    model: &TdtModel<B>,
    cfg: &ModelConfig,
    vocab: usize,
) -> Result<Vec<(String, TorchTensor)>, ImportError> {
    let mut ours: HashMap<String, (Vec<usize>, Vec<f32>)> = HashMap::new();
    for snap in model.collect(None, None, false) {
        let data = snap.to_data().map_err(|e| ImportError::Internal(format!("{e:?}")))?;
        let shape = data.shape.to_vec();
        let values = data
            .convert::<f32>()
            .to_vec::<f32>()
            .map_err(|e| ImportError::Internal(format!("{}: {e:?}", snap.full_path())))?;
        ours.insert(snap.full_path(), (shape, values));
    }
    let p = &cfg.preprocessor;
    let (fb, fb_shape) = filterbank(cfg);
    let mut out = vec![
        (
            WINDOW_KEY.to_owned(),
            TorchTensor::F32 { shape: vec![p.window_size], values: hann(p.window_size) },
        ),
        (FILTERBANK_KEY.to_owned(), TorchTensor::F32 { shape: fb_shape, values: fb }),
    ];
    for entry in entries(cfg, vocab) {
        let n: usize = entry.shape.iter().product();
        let mut values = vec![0f32; n];
        for (path, layout) in &entry.parts {
            let Some((_, v)) = ours.get(path) else {
                return Err(ImportError::Internal(format!("no parameter {path}")));
            };
            match *layout {
                Layout::Same => values.copy_from_slice(v),
                Layout::Transpose => {
                    let (rows, cols) = (entry.shape[0], n / entry.shape[0]);
                    values.copy_from_slice(&transpose(v, cols, rows));
                }
                Layout::GateRows(g) => {
                    let (h, cols) = (entry.shape[0] / 4, entry.shape[1]);
                    values[g * h * cols..(g + 1) * h * cols]
                        .copy_from_slice(&transpose(v, cols, h));
                }
                Layout::GateSlice(g) => {
                    let h = entry.shape[0] / 4;
                    values[g * h..(g + 1) * h].copy_from_slice(v);
                }
            }
        }
        let is_bn_var = entry.key.ends_with("batch_norm.running_var");
        out.push((entry.key.clone(), TorchTensor::F32 { shape: entry.shape, values }));
        if is_bn_var {
            let key = entry.key.replace("running_var", NUM_BATCHES_TRACKED);
            out.push((key, TorchTensor::I64 { shape: vec![], values: vec![0] }));
        }
    }
    Ok(out)
}

/// The paths of a model's tensors (`encoder.layers.0.conv.norm.running_mean`, ...), in module
/// order: the order of [`crate::checkpoint::parameters`].
pub fn parameter_paths<B: Backend>(model: &TdtModel<B>) -> Vec<String> {
    model.collect(None, None, false).iter().map(TensorSnapshot::full_path).collect()
}

/// Trainable parameters of a model with this configuration, counted from the map as PyTorch's
/// `model.parameters()` counts them (BatchNorm running statistics are buffers, not counted).
pub fn parameter_count(cfg: &ModelConfig, vocab: usize) -> usize {
    entries(cfg, vocab)
        .iter()
        .filter(|e| !e.key.ends_with("running_mean") && !e.key.ends_with("running_var"))
        .map(|e| e.shape.iter().product::<usize>())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    #[test]
    fn every_parameter_is_mapped_once_and_export_inverts_import() {
        let cfg = ModelConfig::tiny();
        let vocab = 37;
        let device = Default::default();
        let a = TdtModel::<NdArray>::new(&cfg, vocab, 1, &device);
        let sd: StateDict = state_dict(&a, &cfg, vocab)
            .unwrap()
            .into_iter()
            .map(|(k, t)| match t {
                TorchTensor::F32 { shape, values } => (k, (shape, values)),
                TorchTensor::I64 { shape, .. } => (k, (shape, Vec::new())),
            })
            .collect();
        let b = TdtModel::<NdArray>::new(&cfg, vocab, 2, &device);
        let (b, report) = load(b, &cfg, vocab, &sd, &LoadOptions::default()).unwrap();
        assert!(report.unmapped.is_empty());
        let count: usize = a.num_params();
        assert_eq!(report.parameters, count, "the map covers every parameter");
        let pa = a.collect(None, None, false);
        let pb = b.collect(None, None, false);
        assert_eq!(pa.len(), pb.len());
        for (x, y) in pa.iter().zip(&pb) {
            assert_eq!(x.full_path(), y.full_path());
            assert_eq!(
                x.to_data().unwrap().to_vec::<f32>().unwrap(),
                y.to_data().unwrap().to_vec::<f32>().unwrap(),
                "{}",
                x.full_path()
            );
        }
    }
}
