//! Text blocks (SPEC.md section 6.5): segment ids and transcripts of K consecutive utterances,
//! laid out as an offset table plus a string area and compressed as one zstd frame.

use crate::layout::{MAX_SEGMENT_ID_BYTES, MAX_TEXT_BLOCK_RAW_BYTES, MAX_TEXT_BYTES};

/// One utterance's text record, borrowed from a decoded block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextRecord<'a> {
    /// The manifest's segment id.
    pub segment_id: &'a str,
    /// The cleaned transcript, without a language tag.
    pub text: &'a str,
}

/// A decompressed, validated text block.
#[derive(Debug, Clone)]
pub struct TextBlock {
    first: u64,
    raw: Vec<u8>,
    /// `2k + 1` string-area offsets, already checked.
    offs: Vec<u32>,
}

impl TextBlock {
    /// Index of the block's first utterance.
    pub fn first_utterance(&self) -> u64 {
        self.first
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.offs.len() / 2
    }

    /// Whether the block holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Record `j` of the block, or `None` past its end.
    pub fn get(&self, j: usize) -> Option<TextRecord<'_>> {
        if j >= self.len() {
            return None;
        }
        let area = &self.raw[4 * self.offs.len()..];
        let s = |a: usize, b: usize| {
            // Offsets and UTF-8 were validated in `decode`, so these cannot fail; an empty string
            // is the unreachable fallback rather than a panic.
            area.get(self.offs[a] as usize..self.offs[b] as usize)
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or("")
        };
        Some(TextRecord { segment_id: s(2 * j, 2 * j + 1), text: s(2 * j + 1, 2 * j + 2) })
    }

    /// All records in order.
    pub fn iter(&self) -> impl Iterator<Item = TextRecord<'_>> {
        (0..self.len()).filter_map(|j| self.get(j))
    }
}

/// Why a block's raw bytes are invalid; the reader wraps it with the block's position.
#[derive(Debug)]
pub(crate) struct BlockLayoutError(pub(crate) String);

/// Encodes records as a raw (uncompressed) block.
pub(crate) fn encode_raw<'a>(
    records: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
) -> Vec<u8> {
    let k = records.len();
    let mut offs: Vec<u32> = Vec::with_capacity(2 * k + 1);
    let mut area: Vec<u8> = Vec::new();
    offs.push(0);
    for (id, text) in records {
        area.extend_from_slice(id.as_bytes());
        offs.push(area.len() as u32);
        area.extend_from_slice(text.as_bytes());
        offs.push(area.len() as u32);
    }
    let mut raw = Vec::with_capacity(4 * offs.len() + area.len());
    for o in &offs {
        raw.extend_from_slice(&o.to_le_bytes());
    }
    raw.extend_from_slice(&area);
    raw
}

/// Checks a raw block of `k` records (V5) and wraps it.
pub(crate) fn decode_raw(
    first: u64,
    k: usize,
    raw: Vec<u8>,
) -> Result<TextBlock, BlockLayoutError> {
    let table = 4 * (2 * k + 1);
    if raw.len() < table {
        return Err(BlockLayoutError(format!(
            "{} bytes cannot hold the offset table of {k} records ({table} bytes)",
            raw.len()
        )));
    }
    if raw.len() > MAX_TEXT_BLOCK_RAW_BYTES as usize {
        return Err(BlockLayoutError(format!("{} bytes exceeds the block limit", raw.len())));
    }
    let offs: Vec<u32> = raw[..table]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let area_len = raw.len() - table;
    if offs[0] != 0 {
        return Err(BlockLayoutError(format!("offs[0] is {}, expected 0", offs[0])));
    }
    if offs[2 * k] as usize != area_len {
        return Err(BlockLayoutError(format!(
            "offs[{}] is {}, expected the string area length {area_len}",
            2 * k,
            offs[2 * k]
        )));
    }
    let area = &raw[table..];
    for j in 0..2 * k {
        let (a, b) = (offs[j] as usize, offs[j + 1] as usize);
        if b < a || b > area_len {
            return Err(BlockLayoutError(format!(
                "offs[{}] = {b} is outside offs[{j}] = {a} ..= string area length {area_len}",
                j + 1
            )));
        }
        let record = j / 2;
        let (what, max, min) = if j % 2 == 0 {
            ("segment id", MAX_SEGMENT_ID_BYTES, 1)
        } else {
            ("text", MAX_TEXT_BYTES, 0)
        };
        if b - a > max || b - a < min {
            return Err(BlockLayoutError(format!(
                "record {record}: {what} is {} bytes, expected {min}..={max}",
                b - a
            )));
        }
        if let Err(e) = std::str::from_utf8(&area[a..b]) {
            return Err(BlockLayoutError(format!(
                "record {record}: {what} is not valid UTF-8 at byte {} of it",
                e.valid_up_to()
            )));
        }
    }
    Ok(TextBlock { first, raw, offs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_block_roundtrips() {
        let recs = [("a1", "hello world"), ("b-2", ""), ("ç", "नमस्ते")];
        let raw = encode_raw(recs.iter().map(|(a, b)| (*a, *b)));
        let block = decode_raw(7, 3, raw).unwrap();
        let got: Vec<_> = block.iter().map(|r| (r.segment_id, r.text)).collect();
        assert_eq!(got, recs.to_vec());
        assert_eq!(block.first_utterance(), 7);
        assert!(block.get(3).is_none());
    }

    #[test]
    fn bad_raw_blocks_are_rejected() {
        let raw = encode_raw([("a", "x")].into_iter());
        assert!(decode_raw(0, 2, raw.clone()).is_err(), "wrong record count");
        let mut bad = raw.clone();
        bad[4] = 9; // offs[1] past offs[2]
        assert!(decode_raw(0, 1, bad).is_err());
        let mut bad = raw.clone();
        let n = bad.len();
        bad[n - 1] = 0xff; // invalid UTF-8 in the text
        assert!(decode_raw(0, 1, bad).unwrap_err().0.contains("UTF-8"));
        let empty_id = encode_raw([("", "x")].into_iter());
        assert!(decode_raw(0, 1, empty_id).unwrap_err().0.contains("segment id is 0 bytes"));
    }
}
