//! WAV (RIFF/WAVE): integer PCM of 8 to 32 bits, IEEE float of 32 and 64 bits, G.711 A-law and
//! µ-law, plain or as WAVE_FORMAT_EXTENSIBLE; any chunks before or after `data` are skipped.
//!
//! The samples come back as the file stores them (8-bit unsigned centred at 0, A-law and µ-law
//! expanded to 16-bit linear as G.711 defines it), so that a lossless file compares bit for bit
//! with a reference decoder. A `data` chunk that announces more bytes than the file holds is a
//! truncated file, not a short one: it is rejected, never padded or kept in part. The one
//! exception is the size streaming writers leave when they cannot seek back (0 or 0xFFFFFFFF on
//! the last chunk), which means "to the end of the file".

use super::pcm::{Reject, StreamSamples};

/// A decoded WAV file: samples interleaved, `channels` per frame.
pub(crate) struct Wav {
    pub(crate) rate: u32,
    pub(crate) channels: u32,
    /// Bits per sample of the integer samples (16 for G.711); `None` for float.
    pub(crate) bits: Option<u32>,
    pub(crate) samples: StreamSamples,
}

/// The sample encodings WAV files carry.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Encoding {
    Pcm,
    Float,
    ALaw,
    MuLaw,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The `fmt ` chunk's fields that decoding needs.
struct Format {
    encoding: Encoding,
    channels: u32,
    rate: u32,
    block_align: usize,
    /// Container bits per sample.
    bits: u32,
}

fn corrupt(detail: String) -> Reject {
    Reject::CorruptAudio(format!("WAV: {detail}"))
}

/// Reads the `fmt ` chunk body.
fn parse_format(body: &[u8]) -> Result<Format, Reject> {
    if body.len() < 16 {
        return Err(corrupt(format!(
            "the fmt chunk has {} bytes, at least 16 expected",
            body.len()
        )));
    }
    let mut tag = le16(body, 0);
    let channels = u32::from(le16(body, 2));
    let rate = le32(body, 4);
    let block_align = usize::from(le16(body, 12));
    let bits = u32::from(le16(body, 14));
    if tag == 0xFFFE {
        // WAVE_FORMAT_EXTENSIBLE: the real tag is the first two bytes of the sub-format GUID.
        if body.len() < 40 {
            return Err(corrupt(format!(
                "WAVE_FORMAT_EXTENSIBLE with a fmt chunk of {} bytes, 40 expected",
                body.len()
            )));
        }
        tag = le16(body, 24);
    }
    let encoding = match tag {
        1 => Encoding::Pcm,
        3 => Encoding::Float,
        6 => Encoding::ALaw,
        7 => Encoding::MuLaw,
        other => {
            return Err(Reject::UnsupportedCodec(format!(
                "WAV with format tag 0x{other:04x}; asrc decodes PCM (1), IEEE float (3), A-law \
                 (6) and µ-law (7), plain or extensible"
            )))
        }
    };
    if channels == 0 {
        return Err(corrupt("the fmt chunk says 0 channels".into()));
    }
    if rate == 0 {
        return Err(corrupt("the fmt chunk says a sample rate of 0 Hz".into()));
    }
    let valid_bits = match encoding {
        Encoding::Pcm => (8..=32).contains(&bits) && bits % 8 == 0,
        Encoding::Float => bits == 32 || bits == 64,
        Encoding::ALaw | Encoding::MuLaw => bits == 8,
    };
    if !valid_bits {
        return Err(Reject::Unsupported(format!(
            "WAV {encoding:?} with {bits}-bit samples; asrc reads 8, 16, 24 or 32-bit integer \
             PCM, 32 or 64-bit float and 8-bit A-law or µ-law"
        )));
    }
    let expected_align = channels as usize * bits as usize / 8;
    if block_align != expected_align {
        return Err(corrupt(format!(
            "block alignment {block_align} bytes, but {channels} channels of {bits} bits take \
             {expected_align}"
        )));
    }
    Ok(Format { encoding, channels, rate, block_align, bits })
}

/// Decodes a RIFF/WAVE file; `max_seconds` bounds the audio taken.
pub(crate) fn decode(bytes: &[u8], max_seconds: u64) -> Result<Wav, Reject> {
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err(Reject::UnsupportedCodec("not a RIFF/WAVE file".into()));
    }
    let mut at = 12;
    let mut format: Option<Format> = None;
    let data = loop {
        if at + 8 > bytes.len() {
            return Err(Reject::TruncatedAudio(format!(
                "WAV: the file ends at byte {} without a data chunk",
                bytes.len()
            )));
        }
        let id = &bytes[at..at + 4];
        let size = le32(bytes, at + 4);
        let body_start = at + 8;
        if id == b"data" {
            let Some(f) = &format else {
                return Err(corrupt(format!("the data chunk at byte {at} comes before fmt")));
            };
            let end = body_start as u64 + u64::from(size);
            let data = if end <= bytes.len() as u64 {
                &bytes[body_start..end as usize]
            } else if size == 0 || size == u32::MAX {
                // A streaming writer's placeholder: the data runs to the end of the file.
                let n = (bytes.len() - body_start) / f.block_align * f.block_align;
                &bytes[body_start..body_start + n]
            } else {
                return Err(Reject::TruncatedAudio(format!(
                    "WAV: the data chunk announces {size} bytes, the file holds {} of them",
                    bytes.len() - body_start
                )));
            };
            break data;
        }
        let body_end = body_start as u64 + u64::from(size);
        if body_end > bytes.len() as u64 {
            return Err(Reject::TruncatedAudio(format!(
                "WAV: the {:?} chunk at byte {at} announces {size} bytes, the file ends first",
                String::from_utf8_lossy(id)
            )));
        }
        if id == b"fmt " {
            format = Some(parse_format(&bytes[body_start..body_end as usize])?);
        }
        // Chunks are padded to an even size.
        at = body_end as usize + (size as usize & 1);
    };
    let f = format.ok_or_else(|| corrupt("no fmt chunk".into()))?;
    if data.len() % f.block_align != 0 {
        return Err(Reject::TruncatedAudio(format!(
            "WAV: the data chunk holds {} bytes, not a whole number of {}-byte frames",
            data.len(),
            f.block_align
        )));
    }
    let frames = (data.len() / f.block_align) as u64;
    if frames > max_seconds.saturating_mul(u64::from(f.rate)) {
        return Err(Reject::TooLong(format!(
            "{frames} samples at {} Hz: more than {max_seconds} s of audio",
            f.rate
        )));
    }
    let samples = match (f.encoding, f.bits) {
        (Encoding::Pcm, 8) => {
            StreamSamples::Int(data.iter().map(|&b| i32::from(b) - 128).collect())
        }
        (Encoding::Pcm, 16) => StreamSamples::Int(
            data.chunks_exact(2).map(|c| i32::from(i16::from_le_bytes([c[0], c[1]]))).collect(),
        ),
        // Sign-extend by placing the three bytes at the top of an i32 and shifting back.
        (Encoding::Pcm, 24) => StreamSamples::Int(
            data.chunks_exact(3).map(|c| i32::from_le_bytes([0, c[0], c[1], c[2]]) >> 8).collect(),
        ),
        (Encoding::Pcm, _) => StreamSamples::Int(
            data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        ),
        (Encoding::Float, 32) => StreamSamples::F32(
            data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        ),
        (Encoding::Float, _) => StreamSamples::F64(
            data.chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
        (Encoding::ALaw, _) => StreamSamples::Int(data.iter().map(|&b| alaw(b)).collect()),
        (Encoding::MuLaw, _) => StreamSamples::Int(data.iter().map(|&b| ulaw(b)).collect()),
    };
    if let StreamSamples::F32(_) | StreamSamples::F64(_) = &samples {
        if !samples.all_finite() {
            return Err(corrupt("a float sample is NaN or infinite".into()));
        }
    }
    let bits = match f.encoding {
        Encoding::Pcm => Some(f.bits),
        Encoding::ALaw | Encoding::MuLaw => Some(16),
        Encoding::Float => None,
    };
    Ok(Wav { rate: f.rate, channels: f.channels, bits, samples })
}

/// G.711 A-law to 16-bit linear (ITU-T G.711; the values sox and ffmpeg give).
fn alaw(byte: u8) -> i32 {
    let a = byte ^ 0x55;
    let mut t = i32::from(a & 0x0f) << 4;
    let segment = (a & 0x70) >> 4;
    match segment {
        0 => t += 8,
        1 => t += 0x108,
        s => {
            t += 0x108;
            t <<= s - 1;
        }
    }
    if a & 0x80 != 0 {
        t
    } else {
        -t
    }
}

/// G.711 µ-law to 16-bit linear (ITU-T G.711; the values sox and ffmpeg give).
fn ulaw(byte: u8) -> i32 {
    const BIAS: i32 = 0x84;
    let u = !byte;
    let t = ((i32::from(u & 0x0f) << 3) + BIAS) << ((u & 0x70) >> 4);
    if u & 0x80 != 0 {
        BIAS - t
    } else {
        t - BIAS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g711_extremes_match_the_standard_tables() {
        // ITU-T G.711 table values: A-law 0xD5 is +8, 0x55 is -8, 0xAA is +32256; µ-law 0xFF is
        // 0, 0x80 is +32124, 0x00 is -32124.
        assert_eq!(alaw(0xD5), 8);
        assert_eq!(alaw(0x55), -8);
        assert_eq!(alaw(0xAA), 32256);
        assert_eq!(ulaw(0xFF), 0);
        assert_eq!(ulaw(0x80), 32124);
        assert_eq!(ulaw(0x00), -32124);
    }
}
