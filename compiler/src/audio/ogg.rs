//! Ogg pages to packets (RFC 3533), for Ogg Opus: the first logical stream only, every page's
//! CRC checked, each packet with the granule position of the page it ends on.
//!
//! Ogg Vorbis goes through symphonia's demuxer instead; this reader exists because Opus's
//! sample-exact trimming (pre-skip at the start, the last page's granule at the end) needs the
//! granule positions, which are simplest to take from the pages directly.

use super::pcm::Reject;

/// One packet and the granule position of the page it ends on (-1: no packet ends there).
pub(crate) struct Packet {
    pub(crate) data: Vec<u8>,
    pub(crate) granule: i64,
}

/// The packets of the first logical stream, and whether its last page carried end-of-stream.
pub(crate) struct Packets {
    pub(crate) packets: Vec<Packet>,
    pub(crate) ended: bool,
}

/// The Ogg CRC-32: polynomial 0x04c11db7, not reflected, initial value 0, no final xor.
fn crc32(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut r = (i as u32) << 24;
            for _ in 0..8 {
                r = if r & 0x8000_0000 != 0 { (r << 1) ^ 0x04c1_1db7 } else { r << 1 };
            }
            *e = r;
        }
        t
    });
    bytes.iter().fold(0u32, |crc, &b| (crc << 8) ^ table[((crc >> 24) as u8 ^ b) as usize])
}

/// Splits an Ogg file into the packets of its first logical stream. `codec` names the stream
/// in messages. Pages of other logical streams (multiplexed) are skipped; a second stream
/// starting after the first ends (chained) is refused.
pub(crate) fn packets(bytes: &[u8], codec: &str) -> Result<Packets, Reject> {
    let truncated = |at: usize| {
        Reject::TruncatedAudio(format!(
            "Ogg {codec}: the file ends inside the page at byte {at} ({} bytes)",
            bytes.len()
        ))
    };
    let mut at = 0usize;
    let mut serial: Option<u32> = None;
    let mut partial: Vec<u8> = Vec::new();
    let mut out = Packets { packets: Vec::new(), ended: false };
    while at < bytes.len() {
        let header = bytes.get(at..at + 27).ok_or_else(|| truncated(at))?;
        if &header[0..4] != b"OggS" {
            return Err(Reject::CorruptAudio(format!(
                "Ogg {codec}: no page starts at byte {at} (capture pattern missing)"
            )));
        }
        if header[4] != 0 {
            return Err(Reject::CorruptAudio(format!(
                "Ogg {codec}: page version {} at byte {at}, 0 expected",
                header[4]
            )));
        }
        let flags = header[5];
        let granule = i64::from_le_bytes(header[6..14].try_into().unwrap_or([0xff; 8]));
        let page_serial = u32::from_le_bytes(header[14..18].try_into().unwrap_or_default());
        let stored_crc = u32::from_le_bytes(header[22..26].try_into().unwrap_or_default());
        let segments = usize::from(header[26]);
        let lacing = bytes.get(at + 27..at + 27 + segments).ok_or_else(|| truncated(at))?;
        let body_len: usize = lacing.iter().map(|&l| usize::from(l)).sum();
        let end = at + 27 + segments + body_len;
        let page = bytes.get(at..end).ok_or_else(|| truncated(at))?;
        let mut check = page.to_vec();
        check[22..26].fill(0);
        if crc32(&check) != stored_crc {
            return Err(Reject::CorruptAudio(format!(
                "Ogg {codec}: the page at byte {at} fails its CRC"
            )));
        }
        let first = *serial.get_or_insert(page_serial);
        if page_serial != first {
            at = end;
            continue;
        }
        if out.ended {
            return Err(Reject::UnsupportedCodec(format!(
                "Ogg {codec}: a chained stream (the page at byte {at} follows the end of the \
                 first); asrc decodes one stream per file"
            )));
        }
        let mut body = &page[27 + segments..];
        let mut ended_here = false;
        for &l in lacing {
            let (part, rest) = body.split_at(usize::from(l));
            partial.extend_from_slice(part);
            body = rest;
            if l < 255 {
                out.packets.push(Packet { data: std::mem::take(&mut partial), granule: -1 });
                ended_here = true;
            }
        }
        if ended_here {
            if let Some(p) = out.packets.last_mut() {
                p.granule = granule;
            }
        }
        out.ended = flags & 0x04 != 0;
        at = end;
    }
    if !partial.is_empty() {
        return Err(Reject::TruncatedAudio(format!(
            "Ogg {codec}: the file ends in the middle of a packet"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::crc32;

    #[test]
    fn crc_matches_the_ogg_check_value() {
        // The CRC-32/MPEG-2 family without the initial all-ones: "123456789" gives 0x89a1897f
        // for polynomial 0x04c11db7, init 0, no reflection, no final xor (CRC-32/CKSUM before
        // its length step and final xor).
        assert_eq!(crc32(b"123456789"), 0x89a1_897f);
    }
}
