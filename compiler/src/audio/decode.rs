//! The decoder front door: the codec is told by the bytes, never by the file name, and every
//! codec comes back as a [`Stream`] (interleaved samples at the file's rate), downmixed to mono
//! by the mean of the channels ([`Decoded`]).
//!
//! | codec | decoder | module |
//! |---|---|---|
//! | FLAC | libFLAC by default ([`Decoder::Libflac`]), symphonia on request | `libflac`, `symphonia_flac` |
//! | WAV (PCM 8-32 bit, float, A-law, µ-law, extensible) | ours | `wav` |
//! | MP3, Ogg Vorbis | symphonia | `lossy` |
//! | AAC-LC in MP4/M4A or ADTS | symphonia, MP4's edit list applied here | `lossy`, `mp4` |
//! | Ogg Opus | libopus | `opus` (pages by `ogg`) |
//!
//! A FLAC stream is only kept when nothing is known to be wrong with it: the samples match the
//! MD5 that STREAMINFO records (when the encoder recorded one), every frame has STREAMINFO's
//! format, no frame was damaged, and the stream holds the samples its header announces. The
//! other codecs are held to what they can check: WAV's chunk sizes, Ogg's page CRCs and
//! end-of-stream flag, Opus's granule positions, MP4's edit list against the samples decoded,
//! any packet that fails to decode.
//!
//! A file that is not usable is a [`Reject`], not an error: the compiler counts it, reports it
//! with its reason and detail, and goes on. Damage is a reject too (the file is dropped, not
//! patched with silence), and so is a stream that ends before its headers say it does.

use std::path::Path;

pub use super::pcm::{
    downmix, md5_of, to_i16, Codec, Pcm, Reject, Stream, StreamSamples, MAX_SECONDS,
};
use super::{libflac, lossy, opus, symphonia_flac, wav};

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
    /// Bits per sample of an integer stream; `None` for float and lossy streams.
    pub bits: Option<u32>,
    /// The file's codec.
    pub codec: Codec,
}

impl Decoded {
    /// `stream` downmixed to mono.
    pub fn from_stream(stream: &Stream) -> Decoded {
        Decoded {
            samples: stream.downmix(),
            rate: stream.rate,
            channels: stream.channels,
            bits: stream.bits,
            codec: stream.codec,
        }
    }
}

/// How files are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// The FLAC decoder.
    pub flac: Decoder,
    /// Whether FLAC samples are checked against STREAMINFO's MD5.
    pub verify_md5: bool,
    /// Most audio taken from one file, in seconds ([`MAX_SECONDS`] for a file that is one
    /// utterance; more for a recording that segments are cut from).
    pub max_seconds: u64,
}

impl Default for DecodeOptions {
    fn default() -> DecodeOptions {
        DecodeOptions { flac: Decoder::default(), verify_md5: true, max_seconds: MAX_SECONDS }
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
        // The first page's first packet names the codec: it starts at byte 27 + segment count.
        let body = bytes.get(26).map_or(usize::MAX - 16, |&n| 27 + usize::from(n));
        let starts = |m: &[u8]| bytes.get(body..body + m.len()) == Some(m);
        if starts(b"OpusHead") {
            "opus"
        } else if starts(b"\x01vorbis") {
            "vorbis"
        } else if starts(b"\x7fFLAC") {
            "ogg-flac"
        } else {
            "ogg"
        }
    } else if at(0, b"ID3") {
        // FLAC and ADTS with a leading ID3v2 tag exist in the wild: look behind the tag.
        let size = bytes
            .get(6..10)
            .map_or(0, |s| s.iter().fold(0usize, |acc, &b| (acc << 7) | usize::from(b & 0x7f)));
        match bytes.get(10 + size..14 + size) {
            Some(b"fLaC") => "flac",
            Some([0xFF, b, ..]) if b & 0xF6 == 0xF0 => "adts",
            _ => "mp3",
        }
    } else if at(4, b"ftyp") {
        "mp4"
    } else if bytes.len() >= 2 && bytes[0] == 0xFF && bytes[1] & 0xF6 == 0xF0 {
        // ADTS: a 12-bit sync word and the layer bits 00, which MPEG audio reserves.
        "adts"
    } else if bytes.len() >= 2 && bytes[0] == 0xFF && bytes[1] & 0xE0 == 0xE0 {
        "mp3"
    } else {
        "unknown"
    }
}

/// Reads and decodes the audio file at `path` (FLAC with libFLAC).
pub fn decode_file(path: &Path) -> Result<Decoded, Reject> {
    decode_file_with(path, Decoder::default(), true)
}

/// Reads and decodes the audio file at `path`, FLAC with `decoder`, checking STREAMINFO's MD5
/// when `verify_md5` (and the stream records one).
pub fn decode_file_with(
    path: &Path,
    decoder: Decoder,
    verify_md5: bool,
) -> Result<Decoded, Reject> {
    let opts = DecodeOptions { flac: decoder, verify_md5, ..DecodeOptions::default() };
    Ok(Decoded::from_stream(&decode_stream(read_file(path)?, &opts)?))
}

/// The bytes of the file at `path`, or a `MissingFile` reject naming it.
pub fn read_file(path: &Path) -> Result<Vec<u8>, Reject> {
    std::fs::read(path).map_err(|e| Reject::MissingFile(format!("{}: {e}", path.display())))
}

/// Decodes audio bytes (FLAC with libFLAC), downmixed to mono.
pub fn decode(bytes: Vec<u8>) -> Result<Decoded, Reject> {
    decode_with(bytes, Decoder::default())
}

/// Decodes audio bytes, FLAC with `decoder`, downmixed to mono.
pub fn decode_with(bytes: Vec<u8>, decoder: Decoder) -> Result<Decoded, Reject> {
    let opts = DecodeOptions { flac: decoder, ..DecodeOptions::default() };
    Ok(Decoded::from_stream(&decode_stream(bytes, &opts)?))
}

/// The codec the bytes hold, or the reject for bytes asrc does not decode.
pub fn codec_of(bytes: &[u8]) -> Result<Codec, Reject> {
    let kind = sniff(bytes);
    Ok(match kind {
        "flac" => Codec::Flac,
        "wav" => Codec::Wav,
        "mp3" => Codec::Mp3,
        "vorbis" => Codec::Vorbis,
        "opus" => Codec::Opus,
        "mp4" | "adts" => Codec::Aac,
        other => {
            let head: String =
                bytes.iter().take(4).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
            let what = match other {
                "ogg-flac" => "Ogg FLAC (FLAC in Ogg pages)".to_owned(),
                "ogg" => "an Ogg stream of an unknown codec".to_owned(),
                _ if bytes.is_empty() => "an empty file".to_owned(),
                _ => format!("unknown bytes (first bytes {head})"),
            };
            return Err(Reject::UnsupportedCodec(format!(
                "{what}; asrc decodes FLAC, WAV, MP3, Ogg Vorbis, Ogg Opus and AAC"
            )));
        }
    })
}

/// Decodes audio bytes of any codec asrc reads to the stream's own samples, before the downmix.
pub fn decode_stream(bytes: Vec<u8>, opts: &DecodeOptions) -> Result<Stream, Reject> {
    let codec = codec_of(&bytes)?;
    let stream = match codec {
        Codec::Flac => Stream::from_flac(match opts.flac {
            Decoder::Libflac => libflac::decode(&bytes, opts.max_seconds, opts.verify_md5)?,
            Decoder::Symphonia => symphonia_flac::decode(bytes, opts.verify_md5)?,
        }),
        Codec::Wav => {
            let w = wav::decode(&bytes, opts.max_seconds)?;
            let (rate, channels, bits, samples) = (w.rate, w.channels, w.bits, w.samples);
            Stream { codec, rate, channels, bits, samples, md5_checked: false }
        }
        Codec::Mp3 | Codec::Vorbis | Codec::Aac => {
            let l = lossy::decode(bytes, codec, opts.max_seconds)?;
            let (rate, channels, samples) = (l.rate, l.channels, l.samples);
            Stream { codec, rate, channels, bits: None, samples, md5_checked: false }
        }
        Codec::Opus => {
            let o = opus::decode(&bytes, opts.max_seconds)?;
            let (channels, samples) = (o.channels, o.samples);
            Stream { codec, rate: opus::RATE, channels, bits: None, samples, md5_checked: false }
        }
    };
    if stream.samples.is_empty() {
        return Err(Reject::NoSamples(format!("the {} stream holds no samples", codec.name())));
    }
    Ok(stream)
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
        return Err(Reject::UnsupportedCodec(format!(
            "{kind} data (first bytes {head}), expected a FLAC stream"
        )));
    }
    match decoder {
        Decoder::Libflac => libflac::decode(&bytes, MAX_SECONDS, verify_md5),
        Decoder::Symphonia => symphonia_flac::decode(bytes, verify_md5),
    }
}
