//! Command-line interface of `asrc` (clap derive types only; behaviour is in `commands`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueHint};

/// Compile ASR manifests into indexed, memory-mappable corpora, and check corpora.
#[derive(Debug, Parser)]
#[command(name = "asrc", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Compile a dataset into one corpus file: clean transcripts, fix language labels, drop
    /// duplicates and broken audio, decode (FLAC, WAV, MP3, Ogg Vorbis, Ogg Opus, AAC), cut segments,
    /// downmix, resample to 16 kHz, tokenize, write.
    ///
    /// Inputs (--format, told from the path when left out): the seed's parquet manifest (seed),
    /// NeMo JSON-lines manifests (nemo; `offset` cuts a segment), NeMo tarred manifests
    /// (nemo-tarred, with --tarred-audio-filepaths), WebDataset/WeNet tar shards (wds: .tar
    /// files, a directory of them or a data.list), a Kaldi data directory (kaldi: wav.scp, text,
    /// segments, utt2lang), Hugging Face datasets parquet with the audio inside (hf: Common
    /// Voice, FLEURS, ...), Lhotse cuts or recordings + supervisions (lhotse), a Lhotse Shar
    /// directory (lhotse-shar: each cut's audio read from its recording.NNNNNN.tar), or the raw
    /// shard layout (--shards DIR).
    ///
    /// Rejected rows are data, not failures: each is listed with its reason in
    /// <CORPUS>.report.jsonl and counted in <CORPUS>.report.json, and the exit status is 0
    /// unless more than --max-reject-fraction of the rows were dropped (then 1; the corpus and
    /// the report are still written). Exit status 2: the input, the tokenizer or the output
    /// cannot be used (the message names the file and, for a schema problem, the column).
    #[command(after_help = "Examples:\n  \
        asrc compile manifest.parquet --tokenizer spm.model -o corpus.asrcorpus\n  \
        asrc compile --shards /data/raw --tokenizer spm.model -o corpus.asrcorpus \\\n      \
        --min-duration 0.5 --max-duration 20 --min-quality 0.8\n  \
        asrc compile manifest.parquet --tokenizer spm.model -o c.asrcorpus --max-reject-fraction 0.01\n  \
        asrc compile train_manifest.json dev_manifest.json --tokenizer spm.model -o c.asrcorpus\n  \
        asrc compile tarred_audio_manifest.json --format nemo-tarred \\\n      \
        --tarred-audio-filepaths 'audio__OP_0..7_CL_.tar' --tokenizer spm.model -o c.asrcorpus\n  \
        asrc compile shards/data.list --tokenizer spm.model -o c.asrcorpus\n  \
        asrc compile data/train --format kaldi --tokenizer spm.model -o c.asrcorpus\n  \
        asrc compile cv/train-*.parquet --tokenizer spm.model -o c.asrcorpus\n  \
        asrc compile cuts_train.jsonl.gz --tokenizer spm.model -o c.asrcorpus\n  \
        asrc compile shar/train --tokenizer spm.model -o c.asrcorpus   (a Lhotse Shar directory)\n\n\
        Reasons a row is dropped: null_segment_id, duplicate_row, reused_segment_id,\n  \
        duplicate_audio, filtered_duration, filtered_quality, null_text, empty_text, no_language,\n  \
        no_audio_index, malformed_line, pipe_refused, missing_file, missing_member,\n  \
        unsupported_codec, corrupt_flac, truncated_flac, corrupt_audio, truncated_audio,\n  \
        segment_beyond_end, no_samples, unsupported_audio, format_change, tokenize_error,\n  \
        unstorable.\n\
        Kept rows may be retagged (language changed) or flagged: unknown_language, tag_mismatch,\n  \
        duration_mismatch, truncated_tokens.")]
    Compile(Box<CompileArgs>),
    /// Check that a corpus file is valid: structure, every checksum, every cross-reference.
    ///
    /// Exit status: 0 when the corpus is valid, 1 when it is not (the message names the section,
    /// the utterance or byte offset, and what was expected), 2 when it cannot be read at all or
    /// the command line is wrong.
    #[command(after_help = "Examples:\n  asrc validate corpus.asrcorpus\n  \
                            asrc validate --json corpus.asrcorpus | jq .report.hours")]
    Validate(ValidateArgs),
    /// Summarise a corpus: hours per language, duration histogram, token statistics.
    #[command(after_help = "Examples:\n  asrc inspect corpus.asrcorpus\n  \
                            asrc inspect --json corpus.asrcorpus | jq .languages")]
    Inspect(InspectArgs),
    /// Print one JSON object per utterance (index, segment id, language, source, text, token
    /// ids, samples); with --pcm-dir also write each utterance's audio as a 16 kHz WAV file.
    #[command(after_help = "Examples:\n  asrc dump corpus.asrcorpus | head\n  \
                            asrc dump corpus.asrcorpus --start 100 --limit 10 --pcm-dir /tmp/pcm")]
    Dump(DumpArgs),
    /// Re-tokenize a corpus with another SentencePiece model, copying its audio, transcripts,
    /// languages and sources unchanged (nothing is decoded): a new vocabulary costs a read and a
    /// write of the corpus instead of a compile.
    ///
    /// An utterance the new model cannot tokenize is left out and listed on stderr; the exit
    /// status is 0 unless the input, the tokenizer or the output cannot be used (2).
    #[command(after_help = "Examples:\n  \
        asrc retokenize corpus.asrcorpus --tokenizer new.model -o corpus-new.asrcorpus\n  \
        asrc retokenize corpus.asrcorpus --tokenizer nemo.model --lang-prefix never -o c2.asrcorpus")]
    Retokenize(RetokenizeArgs),
    /// Decode audio files (FLAC, WAV, MP3, Ogg Vorbis, Ogg Opus, AAC) as `asrc compile` does and say
    /// what it would do with each: the codec, the stream's format and length, and the reject
    /// reason if it would drop the file; with --md5,
    /// the MD5 of the decoded samples (before any downmix or resampling: what STREAMINFO's MD5
    /// and `flac -d` cover).
    ///
    /// Exit status: 0 when every file would be kept, 1 when one would be rejected, 2 on bad
    /// usage.
    #[command(after_help = "Examples:\n  asrc probe a.flac b.flac --md5\n  \
                            asrc probe --json --decoder symphonia audio/*.flac")]
    Probe(ProbeArgs),
    /// Join the parts of a compile (`asrc compile --part I/N`, one per array task) into the
    /// corpus one compile of the whole input writes, byte for byte: parts in order, and an
    /// utterance whose audio repeats an earlier part's dropped (first part wins).
    ///
    /// Refused, with nothing written, when a part is missing, two files are the same part, or
    /// the files come from different compiles (tokenizer, format or parameters differ).
    #[command(after_help = "Examples:\n  \
        sbatch --array=0-15 --wrap 'asrc compile m.parquet --tokenizer spm.model \\\n      \
        --part $SLURM_ARRAY_TASK_ID/16 -o parts/p$SLURM_ARRAY_TASK_ID.asrcorpus'\n  \
        asrc merge parts/p*.asrcorpus -o corpus.asrcorpus")]
    Merge(MergeArgs),
}

/// Arguments of `asrc inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Corpus file.
    #[arg(value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub corpus: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `asrc dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Corpus file.
    #[arg(value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub corpus: PathBuf,
    /// First utterance to print.
    #[arg(long, default_value_t = 0)]
    pub start: usize,
    /// Most utterances to print (all by default).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Also write each printed utterance's audio (16 kHz, mono, 16-bit WAV) to
    /// DIR/<index>.wav, the index zero-padded to 8 digits: DIR/00000042.wav for utterance 42.
    /// Missing directories are created.
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    pub pcm_dir: Option<PathBuf>,
}

/// Arguments of `asrc probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Audio files: FLAC, WAV, MP3, Ogg Vorbis, Ogg Opus, AAC in MP4/M4A or ADTS (the codec is
    /// told by the bytes).
    #[arg(value_name = "FILE", required = true, value_hint = ValueHint::FilePath)]
    pub files: Vec<PathBuf>,
    /// Also print the MD5 of the decoded samples.
    #[arg(long)]
    pub md5: bool,
    /// One JSON object per file instead of text.
    #[arg(long)]
    pub json: bool,
    /// FLAC decoder (as `asrc compile --decoder`).
    #[arg(long, value_enum, default_value_t = crate::audio::decode::Decoder::Libflac)]
    pub decoder: crate::audio::decode::Decoder,
}

/// Arguments of `asrc merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The parts, in any order.
    #[arg(value_name = "PART", required = true, value_hint = ValueHint::FilePath)]
    pub parts: Vec<PathBuf>,
    /// Corpus to write (missing directories are created).
    #[arg(short, long, value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub output: PathBuf,
}

/// Arguments of `asrc retokenize`.
#[derive(Debug, Args)]
pub struct RetokenizeArgs {
    /// Corpus to read.
    #[arg(value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub corpus: PathBuf,
    /// The new SentencePiece model: a `.model` file, or a NeMo `.nemo` (its tokenizer).
    #[arg(long, value_name = "MODEL", value_hint = ValueHint::FilePath)]
    pub tokenizer: PathBuf,
    /// Corpus to write (a new file; missing directories are created).
    #[arg(short, long, value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub output: PathBuf,
    /// Tokenize `<|lang|> text` or the text alone. `auto`: the prefix when the new model has
    /// the tag as one piece.
    #[arg(long, value_enum, default_value_t = crate::tokenize::LangPrefix::Auto)]
    pub lang_prefix: crate::tokenize::LangPrefix,
    /// Cut token sequences at this length.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
}

/// Arguments of `asrc validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Corpus file to check.
    #[arg(value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub corpus: PathBuf,
    /// Print one JSON object (valid, error, report) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Only apply the structural checks done when a corpus is opened (header, section table,
    /// offsets, metadata): milliseconds instead of one full read of the file.
    #[arg(long)]
    pub structure_only: bool,
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }

    #[test]
    fn compile_help_lists_every_reason() {
        use clap::CommandFactory;
        let cli = super::Cli::command();
        let help = cli.find_subcommand("compile").unwrap().get_after_help().unwrap().to_string();
        for r in crate::reason::Reason::ALL {
            let listed = r.kind() == crate::reason::Kind::Retagged || help.contains(r.name());
            assert!(listed, "{} missing from asrc compile --help", r.name());
        }
    }
}

/// Arguments of `asrc compile`.
#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The dataset: a seed parquet manifest (segment_id, shard_id, text, duration, lang,
    /// tar_member_name, tar_path, source; the audio is member tar_member_name of tar_path when
    /// that archive exists, else dirname(tar_path)/tar_member_name), NeMo manifests, WebDataset
    /// shards or a list of them, a Kaldi data directory, Hugging Face parquet files, Lhotse
    /// manifests, Lhotse Shar directories (see --format).
    #[arg(value_name = "INPUT", value_hint = ValueHint::AnyPath, required_unless_present = "shards", conflicts_with = "shards")]
    pub inputs: Vec<PathBuf>,
    /// The input's layout (default: told from the path: .parquet is hf when it has an audio
    /// column of bytes, else seed; .jsonl.gz lhotse; .json/.jsonl nemo (nemo-tarred with
    /// --tarred-audio-filepaths); a directory with cuts.*.jsonl.gz and recording.*.tar
    /// lhotse-shar; .tar/.list or a directory of .tar files wds; a directory with wav.scp
    /// kaldi).
    #[arg(long, value_enum)]
    pub format: Option<crate::inputs::Format>,
    /// NeMo tarred audio: the archives, in NeMo's pattern (`audio__OP_0..7_CL_.tar` or
    /// `audio_{0..7}.tar`); each manifest line's shard_id picks one.
    #[arg(long, value_name = "PATTERN")]
    pub tarred_audio_filepaths: Option<String>,
    /// Run the `cmd |` entries of a Kaldi wav.scp and Lhotse `command` sources (under sh -c, in
    /// the data directory); without this they are dropped as pipe_refused.
    #[arg(long)]
    pub allow_pipes: bool,
    /// Hugging Face parquet: the id column (default: the first of id, segment_id, utt_id, path,
    /// audio_id; none: FILE:ROW).
    #[arg(long, value_name = "COLUMN", help_heading = "Hugging Face parquet")]
    pub id_column: Option<String>,
    /// Hugging Face parquet: the transcript column (default: the first of text, sentence,
    /// transcription, normalized_text, raw_transcription, transcript).
    #[arg(long, value_name = "COLUMN", help_heading = "Hugging Face parquet")]
    pub text_column: Option<String>,
    /// Hugging Face parquet: the language column (default: the first of lang, language,
    /// locale; codes or English names).
    #[arg(long, value_name = "COLUMN", help_heading = "Hugging Face parquet")]
    pub lang_column: Option<String>,
    /// Hugging Face parquet: the duration column, seconds (default: duration, if present).
    #[arg(long, value_name = "COLUMN", help_heading = "Hugging Face parquet")]
    pub duration_column: Option<String>,
    /// Hugging Face parquet: the audio column, a datasets Audio struct (bytes, path) or binary
    /// (default: audio).
    #[arg(long, value_name = "COLUMN", help_heading = "Hugging Face parquet")]
    pub audio_column: Option<String>,
    /// Read the raw shard layout instead: every directory below DIR holding metadata.parquet
    /// and audio_index.parquet (joined on segment_id), with the FLAC files beside them.
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    pub shards: Option<PathBuf>,
    /// Corpus file to write (atomically: a failed compile leaves no corpus behind); missing
    /// directories are created.
    #[arg(short, long, value_name = "CORPUS", value_hint = ValueHint::FilePath)]
    pub output: PathBuf,
    /// SentencePiece model: a `.model` file, or a NeMo `.nemo` whose tokenizer is used (the
    /// corpus then trains and evaluates that model); it is embedded in the corpus.
    #[arg(long, value_name = "MODEL", value_hint = ValueHint::FilePath)]
    pub tokenizer: PathBuf,
    /// Base directory for relative audio paths (default: the manifest's directory).
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    pub audio_root: Option<PathBuf>,
    /// Tokenize `<|lang|> text` (the pipeline's form) or the text alone. `auto`: the prefix
    /// when the model has the tag as one piece.
    #[arg(long, value_enum, default_value_t = crate::tokenize::LangPrefix::Auto)]
    pub lang_prefix: crate::tokenize::LangPrefix,
    /// Cut token sequences at this length (counted in the report as truncated_tokens).
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Drop rows whose claimed duration is below this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub min_duration: Option<f64>,
    /// Drop rows whose claimed duration is above this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub max_duration: Option<f64>,
    /// Drop rows whose tx_quality_score is below this (--shards input only).
    #[arg(long, value_name = "SCORE")]
    pub min_quality: Option<f64>,
    /// Flag rows whose claimed duration differs from the decoded audio by more than this.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.2)]
    pub duration_tolerance: f64,
    /// Keep every row's (normalised) language label; do not retag from the transcript.
    #[arg(long)]
    pub no_retag: bool,
    /// FLAC decoder: libflac (the reference decoder, every valid stream, MD5 checked) or
    /// symphonia (pure Rust, up to 24 bits, MD5 checked; fails some valid streams).
    #[arg(long, value_enum, default_value_t = crate::audio::decode::Decoder::Libflac)]
    pub decoder: crate::audio::decode::Decoder,
    /// Compile only part I of N (0-based, e.g. 3/16): a contiguous range of the input's rows,
    /// deduplicated against the rows before it, for a Slurm array; `asrc merge` joins the parts
    /// into the corpus one compile would have written.
    #[arg(long, value_name = "I/N", value_parser = parse_part)]
    pub part: Option<(u32, u32)>,
    /// Do not check decoded samples against the MD5 the FLAC header records (about a third of
    /// the decoding time; frame CRCs still catch damaged files, but not a wrong decode).
    #[arg(long)]
    pub no_md5_check: bool,
    /// Exit 1 when more than this fraction of the rows is dropped.
    #[arg(long, value_name = "FRACTION")]
    pub max_reject_fraction: Option<f64>,
    /// Worker threads for decoding, resampling and tokenizing (default: all cores).
    #[arg(short, long)]
    pub jobs: Option<usize>,
    /// Rows read and processed together (bounds memory: one chunk of decoded audio).
    #[arg(long, default_value_t = 256, hide_short_help = true)]
    pub chunk_rows: usize,
    /// Source name of every row, for inputs other than the seed manifest (which has a source
    /// column). Default: the shard root's, Kaldi or Lhotse Shar directory's or first archive's
    /// name, or each NeMo manifest's file stem.
    #[arg(long, value_name = "NAME")]
    pub source: Option<String>,
    /// Summary report path (default: <CORPUS>.report.json); the row list goes to the same
    /// path with .jsonl.
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub report: Option<PathBuf>,
    /// No progress bar.
    #[arg(short, long)]
    pub quiet: bool,
}

/// `I/N` as two numbers (that `I < N` is `CompileOptions::check`'s rule).
fn parse_part(s: &str) -> Result<(u32, u32), String> {
    let (i, n) = s.split_once('/').ok_or_else(|| format!("{s:?}: expected I/N, e.g. 0/8"))?;
    let parse = |x: &str| x.trim().parse::<u32>().map_err(|e| format!("{s:?}: {x:?}: {e}"));
    Ok((parse(i)?, parse(n)?))
}
