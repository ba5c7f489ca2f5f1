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

/// The codecs asrc decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// FLAC (native container).
    Flac,
    /// WAV (RIFF/WAVE).
    Wav,
    /// MPEG-1/2 Layer III.
    Mp3,
    /// Vorbis in Ogg.
    Vorbis,
    /// Opus in Ogg.
    Opus,
    /// AAC-LC in MP4 (M4A) or ADTS.
    Aac,
}

impl Codec {
    /// The codec's name, as the report and `asrc probe` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Flac => "flac",
            Codec::Wav => "wav",
            Codec::Mp3 => "mp3",
            Codec::Vorbis => "vorbis",
            Codec::Opus => "opus",
            Codec::Aac => "aac",
        }
    }

    /// Whether the codec returns the encoder's input exactly.
    pub fn lossless(self) -> bool {
        matches!(self, Codec::Flac | Codec::Wav)
    }
}

/// Interleaved samples as a decoder returns them.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamSamples {
    /// Integers at the stream's bit depth, sign-extended (FLAC, integer WAV, G.711 expanded).
    Int(Vec<i32>),
    /// Floats in [-1, 1] (float WAV, MP3, Vorbis, Opus, AAC).
    F32(Vec<f32>),
    /// Doubles in [-1, 1] (64-bit float WAV).
    F64(Vec<f64>),
}

impl StreamSamples {
    /// Interleaved values, all channels.
    pub fn len(&self) -> usize {
        match self {
            StreamSamples::Int(v) => v.len(),
            StreamSamples::F32(v) => v.len(),
            StreamSamples::F64(v) => v.len(),
        }
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every float sample is finite (integers always are).
    pub(crate) fn all_finite(&self) -> bool {
        match self {
            StreamSamples::Int(_) => true,
            StreamSamples::F32(v) => v.iter().all(|x| x.is_finite()),
            StreamSamples::F64(v) => v.iter().all(|x| x.is_finite()),
        }
    }
}

/// A decoded stream of any codec, before the downmix.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    /// What decoded it.
    pub codec: Codec,
    /// Sample rate in Hz.
    pub rate: u32,
    /// Channels.
    pub channels: u32,
    /// Bits per sample of integer samples; `None` for float and lossy streams.
    pub bits: Option<u32>,
    /// Interleaved samples.
    pub samples: StreamSamples,
    /// Whether the samples were checked against an MD5 the stream records (FLAC only).
    pub md5_checked: bool,
}

impl Stream {
    /// A FLAC decode as a stream.
    pub(crate) fn from_flac(pcm: Pcm) -> Stream {
        Stream {
            codec: Codec::Flac,
            rate: pcm.rate,
            channels: pcm.channels,
            bits: Some(pcm.bits),
            md5_checked: pcm.md5_checked,
            samples: StreamSamples::Int(pcm.samples),
        }
    }

    /// Samples per channel.
    pub fn frames(&self) -> u64 {
        (self.samples.len() / self.channels.max(1) as usize) as u64
    }

    /// The mean of the channels in [-1, 1), as f32 (computed in f64, so that nothing is lost
    /// before the one rounding).
    pub fn downmix(&self) -> Vec<f32> {
        let channels = self.channels.max(1) as usize;
        match &self.samples {
            StreamSamples::Int(v) => {
                let bits = self.bits.unwrap_or(16).clamp(1, 32);
                let scale = 1.0 / (f64::from(1u32 << (bits - 1)) * channels as f64);
                mean_of_channels(v, channels, |x| f64::from(x) * scale)
            }
            StreamSamples::F32(v) => {
                if channels == 1 {
                    return v.clone();
                }
                mean_of_channels(v, channels, |x| f64::from(x) / channels as f64)
            }
            StreamSamples::F64(v) => mean_of_channels(v, channels, |x| x / channels as f64),
        }
    }

    /// The MD5 of the samples: FLAC's definition for integers (each sample little-endian in
    /// `(bits + 7) / 8` bytes), the little-endian IEEE bytes for floats.
    pub fn md5(&self) -> [u8; 16] {
        match &self.samples {
            StreamSamples::Int(v) => md5_of(&Pcm {
                samples: v.clone(),
                rate: self.rate,
                channels: self.channels,
                bits: self.bits.unwrap_or(16),
                md5_checked: false,
            }),
            StreamSamples::F32(v) => {
                let mut h = Md5::new();
                for x in v {
                    h.update(x.to_le_bytes());
                }
                h.finalize().into()
            }
            StreamSamples::F64(v) => {
                let mut h = Md5::new();
                for x in v {
                    h.update(x.to_le_bytes());
                }
                h.finalize().into()
            }
        }
    }
}

/// Frame-wise sum of `f(sample)` over the channels, as f32.
fn mean_of_channels<T: Copy>(v: &[T], channels: usize, f: impl Fn(T) -> f64) -> Vec<f32> {
    if channels == 1 {
        return v.iter().map(|&x| f(x) as f32).collect();
    }
    v.chunks_exact(channels).map(|frame| frame.iter().map(|&x| f(x)).sum::<f64>() as f32).collect()
}

/// Why an audio file was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    /// The file does not exist or cannot be read.
    MissingFile(String),
    /// The bytes are no codec asrc decodes (HE-AAC, MP4 of another codec, Ogg FLAC, a WAV
    /// encoding other than PCM, float and G.711, unknown bytes).
    UnsupportedCodec(String),
    /// A tar archive holds no member of the name the input gives.
    MissingMember(String),
    /// A WAV, MP3, Ogg Vorbis, Ogg Opus or AAC stream is damaged.
    CorruptAudio(String),
    /// A WAV, MP3, Ogg Vorbis, Ogg Opus or AAC stream ends before its headers say it does.
    TruncatedAudio(String),
    /// A segment (offset and duration) reaches beyond the end of its recording.
    SegmentBeyondEnd(String),
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
            | Reject::UnsupportedCodec(d)
            | Reject::MissingMember(d)
            | Reject::CorruptAudio(d)
            | Reject::TruncatedAudio(d)
            | Reject::SegmentBeyondEnd(d)
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
            Reject::UnsupportedCodec(_) => Reason::UnsupportedCodec,
            Reject::MissingMember(_) => Reason::MissingMember,
            Reject::CorruptAudio(_) => Reason::CorruptAudio,
            Reject::TruncatedAudio(_) => Reason::TruncatedAudio,
            Reject::SegmentBeyondEnd(_) => Reason::SegmentBeyondEnd,
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
