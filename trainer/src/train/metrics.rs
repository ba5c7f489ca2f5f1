//! Training metrics: one JSON line per optimizer step, the same steps as TensorBoard scalars,
//! and a loss-curve plot (SVG) beside them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::tensorboard::EventWriter;

/// One optimizer step's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimizer steps done, including this one.
    pub step: u64,
    /// Micro-batches done in the whole run.
    pub micro_batches: u64,
    /// Mean loss over the step's micro-batches (NaN when one was not finite; a step skipped
    /// because its f16-scaled gradients overflowed keeps its finite loss).
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Whether the step was skipped (non-finite loss or gradient; under f16-mixed also when the
    /// loss scale was lowered).
    pub skipped: bool,
    /// The loss scale the step's backward used (f16-mixed only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// Audio seconds in the step.
    pub audio_seconds: f64,
    /// Utterances in the step.
    pub utterances: u64,
    /// Audio seconds per wall second for this step.
    pub audio_seconds_per_second: f64,
    /// Utterances per language in the step.
    pub languages: BTreeMap<String, u64>,
    /// Epoch of the batch plan.
    pub epoch: u64,
    /// The step's utterances, one list per micro-batch, each utterance as [corpus, index]: the
    /// corpus's position in the training set and the utterance's index in that corpus.
    /// With several ranks: rank 0's micro-batches first, then rank 1's, and so on.
    #[serde(default)]
    pub ids: Vec<Vec<[u32; 2]>>,
    /// Ranks that trained the step.
    #[serde(default = "one_rank")]
    pub world_size: u32,
    /// Each rank's part (data wait, step time, utterances, audio seconds), in rank order.
    #[serde(default)]
    pub ranks: Vec<crate::train::parallel::RankStep>,
    /// This rank's device memory at the step's synchronisation points (rank 0's in the log),
    /// on the devices with a CubeCL pool (wgpu, CUDA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_memory: Option<super::device_memory::DeviceMemory>,
    /// This rank's training thread's wall seconds in the step by phase: queuing work for the
    /// device, and waiting for it (rank 0's in the log; [`super::host_time`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_seconds: Option<super::host_time::HostSeconds>,
    /// Validation results, on steps that validated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation: Option<serde_json::Value>,
}

fn one_rank() -> u32 {
    1
}

/// Appends metrics and redraws the plot.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
    losses: Vec<(u64, f64)>,
    /// The TensorBoard event file beside the metrics.
    events: EventWriter,
}

/// The scalars of a step as TensorBoard shows them: NeMo's names (`train_loss`,
/// `learning_rate`, `global_step`, `val_wer`), then ours.
pub fn tensorboard_scalars(m: &StepMetrics) -> Vec<(&'static str, f32)> {
    let mut s = Vec::new();
    if m.loss.is_finite() {
        s.push(("train_loss", m.loss as f32));
    }
    s.push(("learning_rate", m.lr as f32));
    s.push(("global_step", m.step as f32));
    s.push(("grad_norm", m.grad_norm as f32));
    s.push(("audio_seconds_per_second", m.audio_seconds_per_second as f32));
    let (wait, busy) = m
        .ranks
        .iter()
        .fold((0.0, 0.0), |(w, b), r| (w + r.wait_seconds, b + r.wait_seconds + r.step_seconds));
    if busy > 0.0 {
        s.push(("data_wait_share", (wait / busy) as f32));
    }
    s.push(("skipped", if m.skipped { 1.0 } else { 0.0 }));
    if let Some(d) = &m.device_memory {
        s.push(("device_memory_in_use_gb", d.in_use_bytes() as f32 / 1e9));
        s.push(("device_memory_reserved_gb", d.reserved_bytes as f32 / 1e9));
    }
    if let Some(v) = &m.validation {
        for (key, tag) in [("wer", "val_wer"), ("cer", "val_cer")] {
            if let Some(x) = v.get(key).and_then(serde_json::Value::as_f64) {
                s.push((tag, x as f32));
            }
        }
    }
    s
}

impl MetricsLog {
    /// Opens (appending) `dir/metrics.jsonl`; earlier lines up to `keep_until_step` are kept for
    /// the plot, later ones (from an interrupted run being resumed) are dropped.
    pub fn open(dir: &Path, keep_until_step: u64) -> std::io::Result<MetricsLog> {
        let path = dir.join("metrics.jsonl");
        let mut kept = Vec::new();
        let mut losses = Vec::new();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        {
            // A line that does not parse is the torn last line of a killed run: its step is
            // repeated after the resume, so it is dropped with the other lines past the resume.
            for line in text.lines() {
                if let Ok(m) = serde_json::from_str::<StepMetrics>(line) {
                    if m.step <= keep_until_step {
                        if m.loss.is_finite() {
                            losses.push((m.step, m.loss));
                        }
                        kept.push(line.to_owned());
                    }
                }
            }
        }
        let mut file = std::fs::File::create(&path)?;
        for line in kept {
            writeln!(file, "{line}")?;
        }
        let events = EventWriter::create(dir)?;
        Ok(MetricsLog { path, file, losses, events })
    }

    /// Appends a step, to the metrics and to the TensorBoard events.
    pub fn push(&mut self, m: &StepMetrics) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.file, m)?;
        self.file.write_all(b"\n")?;
        self.events.scalars(m.step, &tensorboard_scalars(m))?;
        if m.loss.is_finite() {
            self.losses.push((m.step, m.loss));
        }
        Ok(())
    }

    /// Writes `loss.svg` beside the metrics.
    pub fn plot(&self) -> std::io::Result<()> {
        let svg = loss_svg(&self.losses);
        let path = self.path.with_file_name("loss.svg");
        std::fs::write(path, svg)
    }
}

/// A line plot of loss against step, as a standalone SVG document.
pub fn loss_svg(points: &[(u64, f64)]) -> String {
    let (w, h, m) = (640.0, 360.0, 48.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    if points.is_empty() {
        s.push_str("<text x=\"20\" y=\"30\">no finite loss yet</text>\n</svg>\n");
        return s;
    }
    let x0 = points[0].0 as f64;
    let x1 = (points[points.len() - 1].0 as f64).max(x0 + 1.0);
    let lo = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max).max(lo + 1e-9);
    let px = |x: f64| m + (x - x0) / (x1 - x0) * (w - 2.0 * m);
    let py = |y: f64| h - m - (y - lo) / (hi - lo) * (h - 2.0 * m);
    let line: Vec<String> =
        points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x as f64), py(y))).collect();
    s.push_str(&format!(
        "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n",
        line.join(" ")
    ));
    s.push_str(&format!(
        "<line x1=\"{m}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <text x=\"{m}\" y=\"{t}\">step {x0}</text><text x=\"{r}\" y=\"{t}\" text-anchor=\"end\">step {x1}</text>\n\
         <text x=\"4\" y=\"{m}\">{hi:.3}</text><text x=\"4\" y=\"{b}\">{lo:.3}</text>\n\
         <text x=\"{c}\" y=\"20\" text-anchor=\"middle\">training loss</text>\n</svg>\n",
        b = h - m,
        r = w - m,
        t = h - m + 18.0,
        c = w / 2.0,
    ));
    s
}
