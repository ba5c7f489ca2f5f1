//! What a compile is asked to do: the input, the output, and the options that change what the
//! corpus holds (and the few that do not: threads, chunk size, report path).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::CompileError;
use crate::audio::decode::Decoder;
use crate::inputs::hf::HfColumns;
use crate::inputs::Format;
use crate::tokenize::LangPrefix;

/// What to compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A training-ready manifest (parquet).
    Manifest(PathBuf),
    /// A directory of raw shards (`metadata.parquet` + `audio_index.parquet` each).
    Shards(PathBuf),
    /// Another dataset layout (`inputs`): NeMo manifests, NeMo tarred, WebDataset shards, a
    /// Kaldi directory, Hugging Face parquet, Lhotse manifests.
    Dataset {
        /// The layout.
        format: Format,
        /// Its paths (manifests, archives, list files, the data directory).
        paths: Vec<PathBuf>,
    },
}

impl Input {
    /// The first path of the input.
    pub(super) fn path(&self) -> &Path {
        match self {
            Input::Manifest(p) | Input::Shards(p) => p,
            Input::Dataset { paths, .. } => paths.first().map_or(Path::new(""), |p| p.as_path()),
        }
    }

    /// The layout's name, as the corpus's parameters record it.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Input::Manifest(_) => "manifest",
            Input::Shards(_) => "shards",
            Input::Dataset { format, .. } => format.name(),
        }
    }
}

/// Everything `compile` needs.
#[derive(Debug, Clone)]
pub struct CompileOptions {
    /// The input.
    pub input: Input,
    /// The corpus to write.
    pub output: PathBuf,
    /// SentencePiece model.
    pub tokenizer: PathBuf,
    /// Base directory for relative audio paths (default: the manifest's directory).
    pub audio_root: Option<PathBuf>,
    /// When the `<|lang|>` prefix is tokenized.
    pub lang_prefix: LangPrefix,
    /// Token sequences are cut at this length.
    pub max_tokens: usize,
    /// Rows whose claimed duration is below this are dropped (`filtered_duration`).
    pub min_duration: Option<f64>,
    /// Rows whose claimed duration is above this are dropped (`filtered_duration`).
    pub max_duration: Option<f64>,
    /// Rows whose quality score is below this are dropped (`filtered_quality`; shards only).
    pub min_quality: Option<f64>,
    /// A claimed duration further than this from the decoded one is flagged.
    pub duration_tolerance: f64,
    /// Whether transcripts may change a row's language.
    pub retag: bool,
    /// The FLAC decoder.
    pub decoder: Decoder,
    /// Whether decoded samples are checked against STREAMINFO's MD5.
    pub verify_md5: bool,
    /// Compile only part `I` of `N` (0-based): rows `I R / N .. (I + 1) R / N` of the `R` input
    /// rows, deduplicated against the rows before them; `asrc merge` joins the parts.
    pub part: Option<(u32, u32)>,
    /// Rows per chunk.
    pub chunk_rows: usize,
    /// Worker threads.
    pub jobs: usize,
    /// Where the JSON-lines report goes.
    pub entries_path: PathBuf,
    /// Source name given to every row of a shard input.
    pub shard_source: String,
    /// Source name given to every row of a dataset input (default: its file or directory
    /// name).
    pub source: Option<String>,
    /// NeMo tarred audio pattern (`--tarred-audio-filepaths`).
    pub tarred_audio_filepaths: Option<String>,
    /// Whether Kaldi `cmd |` entries and Lhotse `command` sources are run.
    pub allow_pipes: bool,
    /// Column choices of a Hugging Face parquet input.
    pub columns: HfColumns,
}

impl CompileOptions {
    /// Defaults for everything but the paths.
    pub fn new(input: Input, output: PathBuf, tokenizer: PathBuf) -> CompileOptions {
        let entries_path = report_paths(&output).1;
        // The shard root's name; a root without one (`.`, `..`, `/`) gives its rows the source
        // name "shards".
        let shard_source = input
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "shards".into());
        CompileOptions {
            input,
            output,
            tokenizer,
            audio_root: None,
            lang_prefix: LangPrefix::Auto,
            max_tokens: 512,
            min_duration: None,
            max_duration: None,
            min_quality: None,
            duration_tolerance: 0.2,
            retag: true,
            decoder: Decoder::default(),
            verify_md5: true,
            part: None,
            chunk_rows: 256,
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            entries_path,
            shard_source,
            source: None,
            tarred_audio_filepaths: None,
            allow_pipes: false,
            columns: HfColumns::default(),
        }
    }

    /// Rejects option values no compile can run with.
    pub(super) fn check(&self) -> Result<(), CompileError> {
        if self.jobs == 0 {
            return Err(CompileError::Options("--jobs must be at least 1".into()));
        }
        if self.max_tokens == 0 {
            return Err(CompileError::Options("--max-tokens must be at least 1".into()));
        }
        if let Some((i, n)) = self.part {
            if n == 0 || i >= n {
                return Err(CompileError::Options(format!(
                    "--part {i}/{n}: the part must be below the part count (0/{n} .. {}/{n})",
                    n.saturating_sub(1)
                )));
            }
        }
        if !matches!(self.input, Input::Shards(_)) && self.min_quality.is_some() {
            return Err(CompileError::Options(
                "--min-quality needs --shards input: only the raw shard layout has a quality \
                 column"
                    .into(),
            ));
        }
        let tarred = matches!(self.input, Input::Dataset { format: Format::NemoTarred, .. });
        if tarred != self.tarred_audio_filepaths.is_some() {
            return Err(CompileError::Options(if tarred {
                "--format nemo-tarred needs --tarred-audio-filepaths (e.g. \
                 'audio__OP_0..7_CL_.tar')"
                    .into()
            } else {
                "--tarred-audio-filepaths goes with NeMo tarred manifests (--format nemo-tarred)"
                    .into()
            }));
        }
        Ok(())
    }

    /// The parameters stored in the corpus's metadata: only what changes its content, so that
    /// the same input gives the same bytes whatever the thread count.
    pub(super) fn corpus_params(&self) -> serde_json::Value {
        #[derive(Serialize)]
        struct Params<'a> {
            tool: &'a str,
            version: &'a str,
            input_kind: &'a str,
            input: String,
            tokenizer: String,
            lang_prefix: LangPrefix,
            max_tokens: usize,
            min_duration: Option<f64>,
            max_duration: Option<f64>,
            min_quality: Option<f64>,
            retag: bool,
            decoder: &'a str,
            verify_md5: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            part: Option<String>,
            resampler: &'a str,
        }
        // Names only, no directories: the same input compiled from elsewhere gives the same
        // bytes. A path without a final name (`--shards .`) is recorded as unnamed; the tokenizer
        // was opened as a file, so it always has one.
        const UNNAMED: &str = "";
        let name = |p: &Path| p.file_name().map_or(UNNAMED.into(), |n| n.to_string_lossy().into());
        let p = Params {
            tool: "asrc",
            version: env!("CARGO_PKG_VERSION"),
            input_kind: self.input.kind(),
            input: name(self.input.path()),
            tokenizer: name(&self.tokenizer),
            lang_prefix: self.lang_prefix,
            max_tokens: self.max_tokens,
            min_duration: self.min_duration,
            max_duration: self.max_duration,
            min_quality: self.min_quality,
            retag: self.retag,
            decoder: self.decoder.name(),
            verify_md5: self.verify_md5,
            part: self.part.map(|(i, n)| format!("{i}/{n}")),
            resampler:
                "Kaiser-windowed sinc by FFT, flat to 0.925 B, 110 dB from 0.99 B, to 16 kHz",
        };
        serde_json::to_value(p)
            .expect("a struct of strings, numbers and options serializes to a JSON object")
    }
}

/// The default report paths next to a corpus: `<corpus>.report.json` and
/// `<corpus>.report.jsonl`.
pub fn report_paths(output: &Path) -> (PathBuf, PathBuf) {
    let with = |suffix: &str| {
        let mut s = output.as_os_str().to_owned();
        s.push(suffix);
        PathBuf::from(s)
    };
    (with(".report.json"), with(".report.jsonl"))
}
