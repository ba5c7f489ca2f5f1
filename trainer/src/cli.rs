//! Command-line interface of `asrt` (clap derive types only; behaviour is in `commands`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueHint};

use crate::device::DeviceArgs;

use asr_plan::sampler::{SamplerConfig, SamplerMode, DEFAULT_BOUNDARIES};
use asr_plan::shape::ShapePolicy;

/// Plan, feed and train ASR models from corpus files.
#[derive(Debug, Parser)]
#[command(name = "asrt", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what an epoch's batch plan will do, before any GPU starts.
    ///
    /// Builds the bucketed, temperature-balanced plan (--mode temperature: per-language quotas
    /// that realise the target shares; --mode seed: the Python sampler's weighted order over every
    /// utterance; then duration buckets, greedy packing to --max-batch-seconds, cost-sorted
    /// dealing to ranks, trimming to --grad-accum, per-rank shuffle) and reports batches and
    /// hours per bucket, language, source and (for several corpora) corpus shares (corpus,
    /// target, realised, repeats), padding, per-step cost imbalance across ranks and the largest
    /// batch. --batches prints one rank's batches instead.
    #[command(after_help = "Examples:\n  asrt plan corpus.asrcorpus --world-size 8\n  \
                            asrt plan a.asrcorpus b.asrcorpus --source-temperature 0.5\n  \
                            asrt plan --config train.toml   # its [[data]], sampler and shape\n  \
                            asrt plan corpus.asrcorpus --world-size 8 --rank 3 --batches > rank3.json\n  \
                            asrt plan corpus.asrcorpus --json | jq .imbalance_worst")]
    Plan(PlanArgs),
    /// Train a FastConformer-TDT model on one or more corpora (CPU, or CUDA when built with
    /// --features cuda).
    ///
    /// Several corpora (on the command line, or as a [[data]] list in the config with a weight
    /// and language/source overrides per corpus) form one training set: they must share a
    /// tokenizer, sample rate and format version; utterance ids are [corpus, index].
    ///
    /// Progress counts micro-batches and optimizer steps separately (one optimizer step is
    /// train.grad_accum micro-batches). Writes OUT/metrics.jsonl (one line per optimizer step:
    /// loss, lr, grad norm, audio seconds per second, languages, the [corpus, index] ids of each
    /// micro-batch), OUT/loss.svg and
    /// OUT/checkpoints/step-N/ every train.checkpoint_every steps; --resume continues from the
    /// newest checkpoint exactly where it stopped.
    #[command(after_help = "Examples:\n  asrt train corpus.asrcorpus --out runs/tiny\n  \
        asrt train parts/p0.asrcorpus parts/p1.asrcorpus --out runs/tiny\n  \
        asrt train corpus.asrcorpus --config train.toml --out runs/big --device cuda:0\n  \
        asrt train corpus.asrcorpus --out runs/tiny --resume --max-steps 2000\n\n\
        A config file overrides any field of the preset, with NeMo-like names:\n  \
        preset = \"tiny\"            # or \"parakeet-tdt-0.6b\"\n  \
        [model.encoder]\n  n_layers = 4\n  [optim]\n  lr = 1e-3\n  warmup_steps = 100\n  \
        unfreeze_step = 0\n  [train]\n  max_steps = 1000\n  grad_accum = 4\n  \
        checkpoint_every = 100\n  [sampler]\n  mode = \"temperature\"\n  max_batch_seconds = 90.0\n  temperature = 0.3\n  \
        # source_temperature = 0.5   # also balance sources inside each language\n  \
        [[data]]                    # the training set, instead of CORPUS arguments\n  \
        path = \"cv-de.asrcorpus\"    # relative to this file\n  \
        [[data]]\n  path = \"podcasts.asrcorpus\"\n  weight = 2.0                # counts twice when shares are drawn\n  \
        language = \"de\"             # every utterance counts as German\n  source = \"podcasts\"")]
    Train(TrainArgs),
    /// Decode a corpus greedily with a trained checkpoint; WER and CER per language.
    #[command(after_help = "Examples:\n  asrt eval corpus.asrcorpus --checkpoint runs/tiny\n  \
        asrt eval corpus.asrcorpus --checkpoint runs/tiny/checkpoints/step-00000100 --json")]
    Eval(EvalArgs),
    /// Import a NeMo `.nemo` FastConformer-TDT model (Parakeet-TDT) into a model directory.
    ///
    /// Reads model_config.yaml (architecture, front end, durations, loss options), the state
    /// dict (every key mapped to a parameter, BatchNorm running statistics included) and the
    /// SentencePiece tokenizer. CTC-only and duration-less RNN-T models are refused; a hybrid
    /// TDT-CTC model imports its TDT part and names what was ignored. Any key that maps to no
    /// parameter, a missing key or a wrong shape is an error naming the key. The directory is
    /// written complete or not at all. `asrt train --init` and `asrt eval --checkpoint` take the
    /// directory or the `.nemo` itself; compile corpora with `asrc compile --tokenizer MODEL.nemo`.
    #[command(after_help = "Examples:
  asrt import parakeet-tdt-0.6b-v2.nemo -o models/parakeet
  \
        asrc compile manifest.parquet --tokenizer parakeet-tdt-0.6b-v2.nemo -o train.asrcorpus
  \
        asrt train train.asrcorpus --config finetune.toml --init models/parakeet --out runs/ft")]
    Import(ImportArgs),
    /// Export a checkpoint (or an imported model) as a `.nemo` that NeMo loads, or as a
    /// directory that Hugging Face transformers loads.
    ///
    /// --format nemo (default): model_config.yaml for NeMo's EncDecRNNTBPEModel (TDT loss,
    /// greedy TDT decoding), the state dict in PyTorch's format and the tokenizer, so that
    /// `ASRModel.restore_from("model.nemo")` and the NeMo, Riva and sherpa tools take the model.
    /// --format hf: config.json, generation_config.json, model.safetensors,
    /// processor_config.json, tokenizer.json and tokenizer_config.json, for transformers'
    /// `ParakeetForTDT.from_pretrained(DIR)` and `AutoProcessor.from_pretrained(DIR)`.
    /// The tokenizer comes from the training set's first corpus, or --tokenizer. An existing
    /// output is refused unless --force; the output appears whole or not at all.
    #[command(after_help = "Examples:
  asrt export runs/ft -o parakeet-ft.nemo
  \
        asrt export runs/ft --format hf -o parakeet-ft-hf
  \
        asrt export runs/ft/checkpoints/step-00002000 -o ft-2000.nemo --tokenizer train.asrcorpus")]
    Export(ExportArgs),
    /// Transcribe audio with a model: audio files (FLAC, WAV, MP3, Ogg Vorbis, Ogg Opus, AAC,
    /// told by their bytes), directories of them, NeMo manifests or corpora.
    ///
    /// Writes NeMo-style JSON lines (default): the input's fields (a manifest line's, or
    /// audio_filepath and duration), pred_text, the token ids, and token, word and segment
    /// times in seconds and encoder frames from the TDT durations, as NeMo's
    /// transcribe(timestamps=True) gives them; or plain text, or SRT subtitles. With references
    /// (a manifest's text, a corpus) WER and CER are printed. Audio is decoded, segmented
    /// (manifest offset and duration) and resampled exactly as asrc compile does it. A file that
    /// cannot be read is reported and the others are transcribed; the exit status is then 1.
    /// Audio longer than --max-seconds is refused, not chunked: the encoder attends over the
    /// whole utterance, so memory grows with the square of its length.
    #[command(after_help = "Examples:\n  \
        asrt transcribe call.wav --checkpoint runs/ft\n  \
        asrt transcribe recordings/ --checkpoint model.nemo -o transcripts.jsonl\n  \
        asrt transcribe test_manifest.json --checkpoint runs/ft --device cuda:0\n  \
        asrt transcribe talk.mp3 --checkpoint runs/ft --format srt > talk.srt")]
    Transcribe(TranscribeArgs),
}

/// What `asrt transcribe` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TranscriptFormat {
    /// One JSON object per input, NeMo's manifest style, with timestamps.
    Jsonl,
    /// The text alone (with several inputs: NAME<TAB>TEXT).
    Text,
    /// SubRip subtitles, one cue per segment (several inputs: one file each in --output DIR).
    Srt,
}

/// Arguments of `asrt transcribe`.
#[derive(Debug, Clone, Args)]
pub struct TranscribeArgs {
    /// Audio files, directories (searched for .flac .wav .mp3 .ogg .opus .oga), NeMo manifests
    /// (.json/.jsonl: audio_filepath, offset, duration, text), or corpora (.asrcorpus).
    #[arg(value_name = "INPUT", required = true, value_hint = ValueHint::AnyPath)]
    pub inputs: Vec<PathBuf>,
    /// A checkpoint directory, a training output directory (its newest checkpoint), a model
    /// directory written by `asrt import`, or a `.nemo` file.
    #[arg(long, value_name = "MODEL", value_hint = ValueHint::AnyPath)]
    pub checkpoint: PathBuf,
    /// The tokenizer (a .model, a .nemo or a corpus), when the model carries none (default:
    /// the checkpoint's first corpus's); checked against the model's by hash and size.
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub tokenizer: Option<PathBuf>,
    /// What to write.
    #[arg(long, value_enum, default_value_t = TranscriptFormat::Jsonl)]
    pub format: TranscriptFormat,
    /// Write here instead of standard output (a directory for --format srt).
    #[arg(short, long, value_name = "PATH", value_hint = ValueHint::AnyPath)]
    pub output: Option<PathBuf>,
    /// Audio seconds per decoding batch.
    #[arg(long, default_value_t = 60.0)]
    pub batch_seconds: f64,
    /// Longest input taken, in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub max_seconds: f64,
    /// Where to decode (one device).
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Arguments of `asrt import`.
#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    /// The `.nemo` file.
    #[arg(value_name = "MODEL.nemo", value_hint = ValueHint::FilePath)]
    pub model: PathBuf,
    /// The model directory to write (must not exist).
    #[arg(short, long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    pub out: PathBuf,
    /// Import even when state-dict keys map to no parameter (they are listed).
    #[arg(long)]
    pub allow_unmapped: bool,
}

/// What `asrt export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// A `.nemo` archive for NeMo.
    Nemo,
    /// A directory for Hugging Face transformers (`ParakeetForTDT`).
    Hf,
}

/// Arguments of `asrt export`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// A checkpoint directory, a training output directory (its newest checkpoint), or a model
    /// directory written by `asrt import`.
    #[arg(value_name = "CHECKPOINT", value_hint = ValueHint::DirPath)]
    pub checkpoint: PathBuf,
    /// The `.nemo` (--format nemo) or directory (--format hf) to write.
    #[arg(short, long, value_name = "OUT", value_hint = ValueHint::AnyPath)]
    pub out: PathBuf,
    /// What to write.
    #[arg(long, value_enum, default_value = "nemo")]
    pub format: ExportFormat,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// Where the tokenizer comes from: a corpus, a `.nemo` or a SentencePiece `.model` (it must
    /// be the one the model was trained with).
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub tokenizer: Option<PathBuf>,
}

/// Arguments of `asrt train`.
#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    /// Training corpora (one training set; or none, and a [[data]] list in the config).
    #[arg(value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub corpus: Vec<PathBuf>,
    /// TOML configuration (preset, model, optim, train, sampler, loss sections).
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub config: Option<PathBuf>,
    /// Output directory.
    #[arg(long, value_name = "DIR", default_value = "runs/asrt", value_hint = ValueHint::DirPath)]
    pub out: PathBuf,
    /// Continue from the newest checkpoint in OUT/checkpoints.
    #[arg(long)]
    pub resume: bool,
    /// Override train.max_steps.
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Override train.precision: f32, bf16-mixed or f16-mixed (matrix products in the half
    /// type, weights and optimizer state in f32; f16 scales the loss dynamically). The device
    /// must compute in that type: cpu (NdArray) does neither, flex does both, CUDA both.
    #[arg(long, value_name = "P")]
    pub precision: Option<crate::model::precision::Precision>,
    /// Stop (with a checkpoint) after this many optimizer steps, keeping the schedule of
    /// max_steps (for splitting a run).
    #[arg(long)]
    pub stop_at: Option<u64>,
    /// Validation corpus (same tokenizer): decoded every train.val_every steps (first
    /// train.val_utterances utterances); WER and CER go into the metrics line.
    #[arg(long, value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub val_corpus: Option<PathBuf>,
    /// Where to run.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Start from these weights: a `.nemo` file, a directory written by `asrt import`, or a
    /// training checkpoint. The model configuration is the model's (the config file's [model]
    /// section is replaced) and so are the loss options the config file does not set; the
    /// corpora must be compiled with its tokenizer (checked by hash and size).
    #[arg(long, value_name = "MODEL", value_hint = ValueHint::AnyPath)]
    pub init: Option<PathBuf>,
    /// With --init MODEL.nemo: import even when state-dict keys map to no parameter.
    #[arg(long, requires = "init")]
    pub allow_unmapped: bool,
    /// No progress bar.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Arguments of `asrt eval`.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// Corpus to decode.
    #[arg(value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub corpus: PathBuf,
    /// A checkpoint directory, a training output directory (its newest checkpoint), a model
    /// directory written by `asrt import`, or a `.nemo` file.
    #[arg(long, value_name = "DIR", value_hint = ValueHint::AnyPath)]
    pub checkpoint: PathBuf,
    /// Decode only the first N utterances.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Audio seconds per decoding batch.
    #[arg(long, default_value_t = 60.0)]
    pub batch_seconds: f64,
    /// Print JSON (rates per language, overall, and every utterance's texts).
    #[arg(long)]
    pub json: bool,
    /// Where to decode (one device).
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Options of the epoch plan, shared by every command that plans.
#[derive(Debug, Clone, Args)]
pub struct SamplerArgs {
    /// temperature: each language's share of the epoch is its target share (small languages
    /// upsampled, large ones downsampled); seed: every utterance once per epoch, the Python
    /// sampler's batches, so the epoch's mix is the corpus's whatever the temperature.
    #[arg(long, value_enum, default_value_t = SamplerMode::Temperature)]
    pub mode: SamplerMode,
    /// Duration bucket boundaries in seconds, ascending (a duration equal to a boundary goes to
    /// the higher bucket).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_BOUNDARIES.to_vec())]
    pub boundaries: Vec<f64>,
    /// Language temperature: language weight count^T; 1 keeps natural frequencies, 0 makes all
    /// languages equal.
    #[arg(long, default_value_t = 0.3)]
    pub temperature: f64,
    /// Temperature mode: also give each source its quota inside each language, sources weighted
    /// (count x corpus weight)^T (1: by size, 0: equal). Unset: sources are not balanced.
    #[arg(long)]
    pub source_temperature: Option<f64>,
    /// Audio seconds per micro-batch (an utterance longer than this forms its own batch).
    #[arg(long, default_value_t = 90.0)]
    pub max_batch_seconds: f64,
    /// Seed; epoch E draws from a generator seeded with seed + E.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Shortest batches first for this many optimizer steps at the start of each epoch.
    #[arg(long, default_value_t = 0)]
    pub curriculum_steps: u64,
    /// Number of data-parallel ranks.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub world_size: u32,
    /// Micro-batches per optimizer step; each rank's batch count is trimmed to a multiple.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub grad_accum: u32,
    /// Round padded audio lengths up to a multiple of this many seconds (0: exact), bounding the
    /// number of distinct shapes a GPU backend compiles for.
    #[arg(long, default_value_t = 0.0)]
    pub audio_quantum_seconds: f64,
    /// Round padded token lengths up to a multiple of this (0: exact).
    #[arg(long, default_value_t = 0)]
    pub token_quantum: u32,
}

impl SamplerArgs {
    /// The sampler configuration these options describe.
    pub fn config(&self) -> SamplerConfig {
        SamplerConfig {
            mode: self.mode,
            boundaries: self.boundaries.clone(),
            temperature: self.temperature,
            max_batch_seconds: self.max_batch_seconds,
            seed: self.seed,
            curriculum_steps: self.curriculum_steps,
            source_temperature: self.source_temperature,
        }
    }

    /// The padding policy these options describe.
    pub fn shape(&self) -> ShapePolicy {
        ShapePolicy {
            audio_quantum_seconds: self.audio_quantum_seconds,
            token_quantum: self.token_quantum,
        }
    }
}

/// Arguments of `asrt plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Corpus files (one training set; or none, and --config with a [[data]] list).
    #[arg(value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub corpus: Vec<PathBuf>,
    /// Epoch to plan.
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    /// Rank whose batches --batches prints.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// Print the rank's micro-batches (utterance indices, in order, null for an idle slot; with
    /// several corpora, [corpus, index] pairs) as JSON instead of the report.
    #[arg(long)]
    pub batches: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Plan what `asrt train --config FILE` will run: sampler, [shape], train.grad_accum and the
    /// [[data]] list come from this training config (the options they replace may then not be
    /// given).
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath, conflicts_with_all = [
        "mode", "boundaries", "temperature", "source_temperature", "max_batch_seconds", "seed",
        "curriculum_steps", "grad_accum", "audio_quantum_seconds", "token_quantum",
    ])]
    pub config: Option<PathBuf>,
    /// Plan options.
    #[command(flatten)]
    pub sampler: SamplerArgs,
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
