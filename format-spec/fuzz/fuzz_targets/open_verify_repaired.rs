//! Like `open_verify`, but first repairs every section checksum and the header checksum, so that
//! mutations reach the structural and cross-reference rules instead of stopping at a checksum.
#![no_main]

use asr_corpus::layout::{self, header_offset as ho, SectionEntry, SECTION_ENTRY_BYTES};
use libfuzzer_sys::fuzz_target;

fn repair(b: &mut [u8]) {
    if b.len() < layout::HEADER_SIZE as usize {
        return;
    }
    let count = u32::from_le_bytes([b[28], b[29], b[30], b[31]]).min(layout::MAX_SECTIONS);
    for i in 0..count as usize {
        let at = ho::SECTION_TABLE + i * SECTION_ENTRY_BYTES;
        let mut raw = [0u8; SECTION_ENTRY_BYTES];
        raw.copy_from_slice(&b[at..at + SECTION_ENTRY_BYTES]);
        let mut e = SectionEntry::from_bytes(&raw);
        if let Some(end) = e.offset.checked_add(e.length).filter(|&end| end <= b.len() as u64) {
            e.checksum = xxhash_rust::xxh3::xxh3_64(&b[e.offset as usize..end as usize]);
            b[at..at + SECTION_ENTRY_BYTES].copy_from_slice(&e.to_bytes());
        }
    }
    let sum = layout::header_checksum(&b[..layout::HEADER_SIZE as usize]);
    b[ho::HEADER_CHECKSUM..ho::HEADER_CHECKSUM + 8].copy_from_slice(&sum.to_le_bytes());
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    repair(&mut bytes);
    if let Ok(c) = asr_corpus::Corpus::from_bytes(&bytes) {
        for i in 0..c.len() {
            let _ = (c.pcm(i), c.tokens(i), c.language_code(i), c.source_name(i));
        }
        for b in 0..c.text_block_count() {
            let _ = c.text_block(b);
        }
        let _ = c.verify();
    }
});
