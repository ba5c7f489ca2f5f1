//! What every decoder returns: the stream's integer samples ([`Pcm`]), or why a file has none
//! ([`Reject`]); and what is done with samples whichever decoder made them (downmix, MD5,
//! 16-bit conversion, the length check against the header).

use md5::{Digest, Md5};

use crate::reason::Reason;

/// Most audio taken from one file, in seconds: a corpus utterance holds at most 10 minutes
/// (SPEC.md section 7); a second more lets the format limit, not the decoder, name the reject.
pub const MAX_SECONDS: u64 = 601;

/// Interleaved integer samples as the stream stores them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pcm {
    /// Interleaved samples, `channels` per frame, at the stream's bit depth (sign-extended).
    pub samples: Vec<i32>,
    /// Sample rate in Hz.
    pub rate: u32,
    /// Channels.
    pub channels: u32,
    /// Bits per sample.
    pub bits: u32,
    /// Whether the decoder compared the samples with STREAMINFO's MD5 (false when the MD5 is
    /// zero: the encoder did not record one).
    pub md5_checked: bool,
}

/// Why an audio file was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    /// The file does not exist or cannot be read.
    MissingFile(String),
    /// The bytes are another format (`wav`, `ogg`, `mp3`, `mp4`) or none recognised.
    NotFlac(String),
    /// The FLAC stream is damaged: a frame fails to decode or the headers are invalid.
    CorruptFlac(String),
    /// The stream ends before the sample count its header announces.
    TruncatedFlac(String),
    /// The stream decodes to no samples.
    NoSamples(String),
    /// A valid FLAC this compiler does not take (a bit depth the chosen decoder cannot read).
    Unsupported(String),
    /// The sample rate, channel count or bit depth changes between frames.
    FormatChange(String),
    /// More audio than a corpus utterance may hold.
    TooLong(String),
}

impl Reject {
    /// What exactly is wrong, for the report.
    pub fn detail(&self) -> &str {
        match self {
            Reject::MissingFile(d)
            | Reject::NotFlac(d)
            | Reject::CorruptFlac(d)
            | Reject::TruncatedFlac(d)
            | Reject::NoSamples(d)
            | Reject::Unsupported(d)
            | Reject::FormatChange(d)
            | Reject::TooLong(d) => d,
        }
    }

    /// A frame whose `what` (rate, channel count, bit depth) is `frame` where STREAMINFO says
    /// `stream`, at sample `at` (either decoder).
    pub(crate) fn format_change(
        what: &str,
        frame: u32,
        stream: u32,
        at: impl std::fmt::Display,
    ) -> Reject {
        Reject::FormatChange(format!(
            "the {what} changes mid-stream: {frame} in the frame at sample {at}, {stream} in \
             STREAMINFO; the file holds more than one format and is not kept in part"
        ))
    }

    /// The decoded samples do not match STREAMINFO's MD5 (either decoder).
    pub(crate) fn md5_mismatch() -> Reject {
        Reject::CorruptFlac(
            "the decoded samples do not match the MD5 that STREAMINFO records".into(),
        )
    }

    /// The reason's name, as the report counts it.
    pub fn reason(&self) -> Reason {
        match self {
            Reject::MissingFile(_) => Reason::MissingFile,
            Reject::NotFlac(_) => Reason::NotFlac,
            Reject::CorruptFlac(_) => Reason::CorruptFlac,
            Reject::TruncatedFlac(_) => Reason::TruncatedFlac,
            Reject::NoSamples(_) => Reason::NoSamples,
            Reject::Unsupported(_) => Reason::UnsupportedAudio,
            Reject::FormatChange(_) => Reason::FormatChange,
            Reject::TooLong(_) => Reason::Unstorable,
        }
    }
}

/// Checks the samples per channel decoded against the count STREAMINFO announces (0: unknown),
/// for either decoder: fewer is a truncation, more is not kept either (`flac -d` stops at the
/// announced count; which part is right is not known).
pub(crate) fn check_length(frames: u64, announced: u64) -> Result<(), Reject> {
    if announced != 0 && frames < announced {
        return Err(Reject::TruncatedFlac(format!(
            "decoded {frames} of the {announced} samples per channel the header announces"
        )));
    }
    if announced != 0 && frames > announced {
        return Err(Reject::CorruptFlac(format!(
            "the stream holds {frames} samples per channel, more than the {announced} its header \
             announces"
        )));
    }
    Ok(())
}

/// The mean of the channels, scaled to [-1, 1) by the bit depth (in f64, so that a 32-bit or
/// 8-channel sum loses nothing before the one rounding to f32).
pub fn downmix(pcm: &Pcm) -> Vec<f32> {
    let channels = pcm.channels.max(1) as usize;
    let scale = 1.0 / (f64::from(1u32 << (pcm.bits.clamp(1, 32) - 1)) * channels as f64);
    if channels == 1 {
        return pcm.samples.iter().map(|&v| (f64::from(v) * scale) as f32).collect();
    }
    pcm.samples
        .chunks_exact(channels)
        .map(|frame| (frame.iter().map(|&v| f64::from(v)).sum::<f64>() * scale) as f32)
        .collect()
}

/// The MD5 of the samples as FLAC defines it: each sample little-endian in (bits + 7) / 8 bytes,
/// interleaved.
pub fn md5_of(pcm: &Pcm) -> [u8; 16] {
    let width = pcm.bits.div_ceil(8).clamp(1, 4) as usize;
    let mut hasher = Md5::new();
    let mut buf = Vec::with_capacity(4096 * width);
    for chunk in pcm.samples.chunks(4096) {
        buf.clear();
        for &v in chunk {
            buf.extend_from_slice(&v.to_le_bytes()[..width]);
        }
        hasher.update(&buf);
    }
    hasher.finalize().into()
}

/// Mono f32 in [-1, 1) to 16-bit PCM: scaled by 32768, rounded, clamped. 16-bit sources come
/// back unchanged.
pub fn to_i16(samples: &[f32]) -> Vec<i16> {
    samples
        .iter()
        .map(|&x| {
            // Round half away from zero without a libm call: in f64 the sum is exact, so
            // truncation rounds exactly as `f32::round` would.
            let v = f64::from(x) * 32768.0;
            (v + 0.5f64.copysign(v)).clamp(-32768.0, 32767.0) as i16
        })
        .collect()
}
