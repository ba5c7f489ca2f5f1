//! The dataset layouts `asrc compile` reads besides the seed's parquet manifest and raw shards:
//! NeMo manifests (plain and tarred), WebDataset/WeNet tar shards, Kaldi data directories,
//! Hugging Face parquet, Lhotse manifests and Lhotse Shar directories.
//! Each reader turns its layout into [`ManifestRow`]s, the one row type the compile stages
//! take, with the audio named by an [`AudioRef`] and, for a cut of a longer recording, a
//! [`Segment`].
//!
//! These layouts are text (or tar headers): a reader reads all of its rows when it opens, a few
//! hundred bytes per row, and the audio stays where it is until stage 2 reads it. A line or
//! entry that cannot be read is a row too, marked `malformed`, which stage 1 drops with its
//! reason and location: a bad record is data, never the end of the compile.

pub mod hf;
pub mod kaldi;
pub mod lhotse;
pub mod nemo;
pub mod shar;
pub mod tar;
pub mod wds;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::audio::decode::Reject;
use crate::manifest::ManifestRow;
use crate::reason::Reason;

pub use self::tar::{Span, TarCache, TarError, TarIndex};

/// Where a row's audio bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AudioRef {
    /// A file.
    File(PathBuf),
    /// A member of a tar archive (its span when the reader already indexed the archive).
    Member {
        /// The archive.
        tar: PathBuf,
        /// The member's name.
        member: String,
        /// Where its bytes are, when known.
        span: Option<Span>,
    },
    /// Bytes held in the input itself (a Hugging Face `Audio` column).
    Bytes(Arc<[u8]>),
    /// A WAV file inside a Kaldi archive, starting at byte `offset` (a `wav.scp` entry
    /// `foo.ark:1234`, as `wav-copy` and kaldiio write them).
    ArkWav {
        /// The archive.
        ark: PathBuf,
        /// Where the WAV's `RIFF` header starts.
        offset: u64,
    },
    /// The standard output of a shell command run in `dir` (a Kaldi `wav.scp` pipe entry,
    /// with `--allow-pipes`).
    Pipe {
        /// The command, without its trailing `|`.
        command: String,
        /// Where it runs.
        dir: PathBuf,
    },
}

impl AudioRef {
    /// The audio bytes.
    pub fn read(&self, tars: &TarCache) -> Result<Vec<u8>, Reject> {
        match self {
            AudioRef::File(p) => crate::audio::decode::read_file(p),
            AudioRef::Member { tar, member: _, span: Some(span) } => tar::read_span(tar, *span),
            AudioRef::Member { tar, member, span: None } => tars.read_member(tar, member),
            AudioRef::ArkWav { ark, offset } => kaldi::read_ark_wav(ark, *offset),
            AudioRef::Pipe { command, dir } => run_pipe(command, dir),
            AudioRef::Bytes(b) => Ok(b.to_vec()),
        }
    }

    /// A short text naming the audio, for exact-duplicate row detection (inline bytes by
    /// length and hash, not by content).
    pub fn key(&self) -> String {
        match self {
            AudioRef::File(p) => p.display().to_string(),
            AudioRef::Member { tar, member, .. } => format!("{}:{member}", tar.display()),
            AudioRef::ArkWav { ark, offset } => format!("{}:{offset}", ark.display()),
            AudioRef::Pipe { command, dir } => format!("{} | {command}", dir.display()),
            AudioRef::Bytes(b) => {
                format!("{} bytes, xxh3 {:016x}", b.len(), xxhash_rust::xxh3::xxh3_64(b))
            }
        }
    }

    /// The file the report names: the file, the archive, or nothing for a pipe.
    pub fn file(&self) -> Option<&Path> {
        match self {
            AudioRef::File(p)
            | AudioRef::Member { tar: p, .. }
            | AudioRef::ArkWav { ark: p, .. } => Some(p),
            AudioRef::Pipe { .. } | AudioRef::Bytes(_) => None,
        }
    }

    /// The archive member the report names.
    pub fn member(&self) -> Option<&str> {
        match self {
            AudioRef::Member { member, .. } => Some(member),
            _ => None,
        }
    }
}

/// Runs a Kaldi pipe entry (`cmd |`, the `|` already removed) under `sh -c` and takes its
/// standard output as the audio file.
fn run_pipe(cmd: &str, dir: &Path) -> Result<Vec<u8>, Reject> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Reject::MissingFile(format!("running `{cmd}`: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(Reject::MissingFile(format!(
            "`{cmd}` exited with {}: {}",
            out.status,
            stderr.trim().lines().last().unwrap_or("")
        )));
    }
    Ok(out.stdout)
}

/// The dataset layouts, as `--format` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// The seed pipeline's training-ready parquet manifest.
    Seed,
    /// NeMo JSON-lines manifests (`audio_filepath`, `duration`, `text`, `offset`, `lang`).
    Nemo,
    /// NeMo tarred audio: manifests whose `audio_filepath` names a member of the tar given by
    /// `shard_id` in `--tarred-audio-filepaths`.
    NemoTarred,
    /// WebDataset/WeNet tar shards: `KEY.{wav,flac,mp3,ogg,opus}` with `KEY.txt`.
    Wds,
    /// A Kaldi data directory: `wav.scp`, `text`, and `segments`, `utt2lang`, `utt2dur` when
    /// present.
    Kaldi,
    /// Hugging Face datasets parquet, the audio inside (Common Voice, FLEURS, ...).
    Hf,
    /// Lhotse manifests: a cut set, or recordings with supervisions (`.jsonl` or `.jsonl.gz`).
    Lhotse,
    /// Lhotse Shar directories: `cuts.NNNNNN.jsonl.gz` with `recording.NNNNNN.tar` per shard.
    LhotseShar,
}

impl Format {
    /// The name `--format` takes.
    pub fn name(self) -> &'static str {
        match self {
            Format::Seed => "seed",
            Format::Nemo => "nemo",
            Format::NemoTarred => "nemo-tarred",
            Format::Wds => "wds",
            Format::Kaldi => "kaldi",
            Format::Hf => "hf",
            Format::Lhotse => "lhotse",
            Format::LhotseShar => "lhotse-shar",
        }
    }

    /// The layout of `paths`, told by their names and contents; an error when it cannot be.
    pub fn detect(paths: &[PathBuf], tarred: bool) -> Result<Format, InputError> {
        let first = paths.first().ok_or(InputError::NoInput)?;
        let name =
            first.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
        if first.is_dir() {
            if first.join("wav.scp").is_file() {
                return Ok(Format::Kaldi);
            }
            // Before WebDataset: a Shar directory holds tar archives too.
            if shar::is_shar(first) {
                return Ok(Format::LhotseShar);
            }
            if wds::tars_in(first).is_ok_and(|t| !t.is_empty()) {
                return Ok(Format::Wds);
            }
        } else if name.ends_with(".parquet") {
            let schema = hf::schema_of(first)?;
            return Ok(if hf::looks_like_hf(&schema) { Format::Hf } else { Format::Seed });
        } else if name.ends_with(".jsonl.gz") || (name.contains("cuts") && name.ends_with(".jsonl"))
        {
            return Ok(Format::Lhotse);
        } else if name.ends_with(".json") || name.ends_with(".jsonl") {
            return Ok(if tarred { Format::NemoTarred } else { Format::Nemo });
        } else if name.ends_with(".tar") || name.ends_with(".list") {
            return Ok(Format::Wds);
        }
        Err(InputError::UnknownFormat { path: first.clone() })
    }
}

/// Why an input cannot be read at all (a bad line or entry is a row, not an error).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// No input was given.
    #[error("no input given")]
    NoInput,
    /// The layout is not told by the path.
    #[error(
        "cannot tell the input layout of {path}; give --format: seed (parquet manifest), nemo \
         (JSON-lines manifests), nemo-tarred (with --tarred-audio-filepaths), wds (WebDataset \
         tar shards, a directory of them or a data.list), kaldi (a data directory with wav.scp), \
         hf (Hugging Face datasets parquet), lhotse (cuts, or recordings and supervisions, \
         .jsonl.gz), lhotse-shar (a Lhotse Shar directory: cuts.NNNNNN.jsonl.gz with \
         recording.NNNNNN.tar), or --shards DIR for the raw shard layout"
    )]
    UnknownFormat {
        /// The first input path.
        path: PathBuf,
    },
    /// A file of the input cannot be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A tar archive of the input cannot be indexed.
    #[error(transparent)]
    Tar(#[from] TarError),
    /// The input is well-formed but not usable as given.
    #[error("{path}: {message}")]
    Invalid {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong and what was expected.
        message: String,
    },
}

impl InputError {
    pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InputError + '_ {
        move |source| InputError::Io { path: path.to_path_buf(), source }
    }
}

/// A row for an entry that cannot be read: stage 1 drops it with `reason` and `detail`.
pub(crate) fn malformed(row: u64, origin: String, reason: Reason, detail: String) -> ManifestRow {
    ManifestRow {
        row,
        origin: Some(origin),
        malformed: Some((reason, detail)),
        ..Default::default()
    }
}

/// `path` resolved against `base` when relative.
pub(crate) fn resolve(base: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// The file name of `path` without its extension (for ids and source names).
pub(crate) fn stem(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}
