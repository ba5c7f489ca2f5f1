//! Ogg Opus (RFC 7845) through libopus, the reference decoder: mono and stereo streams (channel
//! mapping family 0), decoded at 48 kHz in float, trimmed exactly as the stream asks (the
//! header's pre-skip at the start, the last page's granule position at the end) and scaled by
//! the header's output gain, as `opusdec` does.

use super::ogg;
use super::pcm::{Reject, StreamSamples};

/// libopus always decodes at 48 kHz here: Opus's internal rate, so nothing is resampled twice.
pub(crate) const RATE: u32 = 48_000;
/// The longest Opus packet: 120 ms at 48 kHz.
const MAX_PACKET_FRAMES: usize = 5760;

/// A decoded Opus stream.
pub(crate) struct Opus {
    pub(crate) channels: u32,
    pub(crate) samples: StreamSamples,
}

/// The `OpusHead` packet's fields that decoding needs.
struct Head {
    channels: u32,
    pre_skip: u64,
    /// Output gain, Q7.8 dB.
    gain: i16,
}

fn corrupt(detail: String) -> Reject {
    Reject::CorruptAudio(format!("Ogg Opus: {detail}"))
}

fn parse_head(p: &[u8]) -> Result<Head, Reject> {
    if p.len() < 19 || &p[0..8] != b"OpusHead" {
        return Err(corrupt("the first packet is not an OpusHead header".into()));
    }
    if p[8] >> 4 != 0 {
        return Err(Reject::UnsupportedCodec(format!("Ogg Opus header version {}", p[8])));
    }
    let channels = u32::from(p[9]);
    let family = p[18];
    if family != 0 {
        return Err(Reject::UnsupportedCodec(format!(
            "Ogg Opus with channel mapping family {family} ({channels} channels); asrc decodes \
             mono and stereo streams (family 0)"
        )));
    }
    if !(1..=2).contains(&channels) {
        return Err(corrupt(format!(
            "{channels} channels in mapping family 0, which allows 1 or 2"
        )));
    }
    Ok(Head {
        channels,
        pre_skip: u64::from(u16::from_le_bytes([p[10], p[11]])),
        gain: i16::from_le_bytes([p[16], p[17]]),
    })
}

/// Decodes an Ogg Opus file; `max_seconds` bounds the audio taken.
pub(crate) fn decode(bytes: &[u8], max_seconds: u64) -> Result<Opus, Reject> {
    let stream = ogg::packets(bytes, "Opus")?;
    let mut packets = stream.packets.into_iter();
    let head = parse_head(&packets.next().ok_or_else(|| corrupt("no packets".into()))?.data)?;
    let tags = packets.next().ok_or_else(|| {
        Reject::TruncatedAudio("Ogg Opus: the file ends after the identification header".into())
    })?;
    if !tags.data.starts_with(b"OpusTags") {
        return Err(corrupt("the second packet is not an OpusTags header".into()));
    }
    if !stream.ended {
        return Err(Reject::TruncatedAudio(
            "Ogg Opus: the last page does not mark the end of the stream; the file was cut \
             short"
                .into(),
        ));
    }
    let channels = match head.channels {
        1 => opus::Channels::Mono,
        _ => opus::Channels::Stereo,
    };
    let mut decoder = opus::Decoder::new(RATE, channels)
        .map_err(|e| corrupt(format!("libopus refused the decoder: {e}")))?;
    let ch = head.channels as usize;
    let limit = max_seconds.saturating_mul(u64::from(RATE)).saturating_mul(ch as u64);
    let mut out: Vec<f32> = Vec::new();
    let mut buf = vec![0f32; MAX_PACKET_FRAMES * ch];
    let mut last_granule: i64 = -1;
    for (i, packet) in packets.enumerate() {
        let n = decoder
            .decode_float(&packet.data, &mut buf, false)
            .map_err(|e| corrupt(format!("audio packet {i} fails to decode: {e}")))?;
        out.extend_from_slice(&buf[..n * ch]);
        if packet.granule >= 0 {
            last_granule = packet.granule;
        }
        if out.len() as u64 > limit + (MAX_PACKET_FRAMES * ch) as u64 {
            return Err(Reject::TooLong(format!("more than {max_seconds} s of audio")));
        }
    }
    let decoded = (out.len() / ch) as u64;
    // The stream's length: the last granule position counts samples from the start of the
    // decoded output, pre-skip included (RFC 7845 section 4).
    if last_granule < 0 {
        return Err(corrupt("no page carries a granule position".into()));
    }
    let end = last_granule as u64;
    if end > decoded {
        return Err(Reject::TruncatedAudio(format!(
            "Ogg Opus: the last granule position says {end} samples, the packets decode to \
             {decoded}"
        )));
    }
    if end < head.pre_skip {
        return Err(corrupt(format!(
            "the last granule position {end} is before the pre-skip of {} samples",
            head.pre_skip
        )));
    }
    out.truncate(end as usize * ch);
    out.drain(..head.pre_skip as usize * ch);
    if head.gain != 0 {
        let g = 10f64.powf(f64::from(head.gain) / (20.0 * 256.0));
        for x in &mut out {
            *x = (f64::from(*x) * g) as f32;
        }
    }
    Ok(Opus { channels: head.channels, samples: StreamSamples::F32(out) })
}
