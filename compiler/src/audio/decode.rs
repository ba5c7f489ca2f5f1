//! FLAC decoding: any sample rate, 1 to 8 channels, 4 to 32 bits, downmixed to mono by the mean
//! of the channels.
//!
//! Two decoders: libFLAC, the reference decoder, by default ([`Decoder::Libflac`], module
//! `libflac`), and symphonia, in pure Rust ([`Decoder::Symphonia`]). Both return the stream's
//! integer samples ([`decode_pcm`]), which [`decode`] downmixes. A decoded stream is only kept
//! when nothing is known to be wrong with it: the samples match the MD5 that STREAMINFO records
//! (when the encoder recorded one), every frame has STREAMINFO's format, no frame was damaged,
//! and the stream holds the samples its header announces.
//!
//! A file that is not usable is a [`Reject`], not an error: the compiler counts it, reports it
//! with its reason and detail, and goes on. Corrupt frames are rejects too (the file is dropped,
//! not patched with silence), and so is a stream that ends before the sample count its header
//! announces.

use std::path::Path;

use super::libflac;
pub use super::pcm::{downmix, md5_of, to_i16, Pcm, Reject, MAX_SECONDS};
use super::symphonia_flac;

/// Which FLAC decoder `asrc` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Decoder {
    /// libFLAC, the reference decoder: every valid stream, MD5 checked (the default).
    #[default]
    Libflac,
    /// symphonia, pure Rust: 1 to 8 channels, up to 24 bits, MD5 checked here; rejects 32-bit
    /// streams and fails some valid ones (see README, "Audio").
    Symphonia,
}

impl Decoder {
    /// The decoder's name, as the command line and the report spell it.
    pub fn name(self) -> &'static str {
        match self {
            Decoder::Libflac => "libflac",
            Decoder::Symphonia => "symphonia",
        }
    }
}

/// Decoded audio, downmixed to mono.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// Mono samples in [-1, 1).
    pub samples: Vec<f32>,
    /// Sample rate of the file.
    pub rate: u32,
    /// Channels of the file.
    pub channels: u32,
    /// Bits per sample of the file.
    pub bits: u32,
}

impl Decoded {
    /// `pcm` downmixed to mono.
    fn from_pcm(pcm: &Pcm) -> Decoded {
        Decoded { samples: downmix(pcm), rate: pcm.rate, channels: pcm.channels, bits: pcm.bits }
    }
}

/// The container a file's first bytes announce.
fn sniff(bytes: &[u8]) -> &'static str {
    let at = |o: usize, m: &[u8]| bytes.get(o..o + m.len()) == Some(m);
    if at(0, b"fLaC") {
        "flac"
    } else if at(0, b"RIFF") && at(8, b"WAVE") {
        "wav"
    } else if at(0, b"OggS") {
        "ogg"
    } else if at(0, b"ID3") {
        // FLAC with a leading ID3v2 tag exists in the wild: look behind the tag.
        let size = bytes
            .get(6..10)
            .map_or(0, |s| s.iter().fold(0usize, |acc, &b| (acc << 7) | usize::from(b & 0x7f)));
        if bytes.get(10 + size..14 + size) == Some(b"fLaC") {
            "flac"
        } else {
            "mp3"
        }
    } else if at(4, b"ftyp") {
        "mp4"
    } else if bytes.len() >= 2 && bytes[0] == 0xFF && bytes[1] & 0xE0 == 0xE0 {
        "mp3"
    } else {
        "unknown"
    }
}

/// Reads and decodes the FLAC file at `path` with libFLAC.
pub fn decode_file(path: &Path) -> Result<Decoded, Reject> {
    decode_file_with(path, Decoder::default(), true)
}

/// Reads and decodes the FLAC file at `path` with `decoder`, checking STREAMINFO's MD5 when
/// `verify_md5` (and the stream records one).
pub fn decode_file_with(
    path: &Path,
    decoder: Decoder,
    verify_md5: bool,
) -> Result<Decoded, Reject> {
    let pcm = decode_pcm_with(read_file(path)?, decoder, verify_md5)?;
    Ok(Decoded::from_pcm(&pcm))
}

/// The bytes of the file at `path`, or a `MissingFile` reject naming it.
pub fn read_file(path: &Path) -> Result<Vec<u8>, Reject> {
    std::fs::read(path).map_err(|e| Reject::MissingFile(format!("{}: {e}", path.display())))
}

/// Decodes FLAC bytes with libFLAC, downmixed to mono.
pub fn decode(bytes: Vec<u8>) -> Result<Decoded, Reject> {
    decode_with(bytes, Decoder::default())
}

/// Decodes FLAC bytes with `decoder`, downmixed to mono.
pub fn decode_with(bytes: Vec<u8>, decoder: Decoder) -> Result<Decoded, Reject> {
    Ok(Decoded::from_pcm(&decode_pcm(bytes, decoder)?))
}

/// Decodes FLAC bytes to the stream's interleaved integer samples, before any downmix: what
/// `flac -d` writes and what STREAMINFO's MD5 covers (checked).
pub fn decode_pcm(bytes: Vec<u8>, decoder: Decoder) -> Result<Pcm, Reject> {
    decode_pcm_with(bytes, decoder, true)
}

/// [`decode_pcm`], checking STREAMINFO's MD5 only when `verify_md5`: the check is about a third
/// of the decoding time (bench/RESULTS.md); without it a damaged file is still caught by the
/// frames' CRCs, but not a wrong decode.
pub fn decode_pcm_with(bytes: Vec<u8>, decoder: Decoder, verify_md5: bool) -> Result<Pcm, Reject> {
    let kind = sniff(&bytes);
    if kind != "flac" {
        let head: String =
            bytes.iter().take(4).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
        return Err(Reject::NotFlac(format!(
            "{kind} data (first bytes {head}), expected a FLAC stream"
        )));
    }
    match decoder {
        Decoder::Libflac => libflac::decode(&bytes, MAX_SECONDS, verify_md5),
        Decoder::Symphonia => symphonia_flac::decode(bytes, verify_md5),
    }
}
