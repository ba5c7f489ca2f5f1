//! No input makes the reader panic, and every corruption of a valid file is caught: each byte of
//! a corpus is covered by the header checksum, a section checksum or the zero-padding rule.

use asr_corpus::synth::SynthSpec;
use asr_corpus::Corpus;
use proptest::prelude::*;

use crate::common::{check, refresh_checksums, synth_bytes, tiny_bytes};

/// Opens, verifies and touches every accessor; must return, never panic.
fn exercise(bytes: &[u8]) -> Result<(), String> {
    let c = Corpus::from_bytes(bytes).map_err(|e| e.to_string())?;
    for i in 0..c.len() {
        let _ = (c.pcm(i), c.tokens(i), c.language_code(i), c.source_name(i), c.utterance(i));
    }
    for b in 0..c.text_block_count() {
        let _ = c.text_block(b);
    }
    c.verify().map(|_| ()).map_err(|e| e.to_string())
}

#[test]
fn every_truncation_is_rejected() {
    let good = tiny_bytes();
    for len in 0..good.len() {
        assert!(exercise(&good[..len]).is_err(), "truncation to {len} bytes was accepted");
    }
}

#[test]
fn every_byte_corruption_is_detected() {
    let good = tiny_bytes();
    let mut bad = good.clone();
    for at in 0..good.len() {
        // One bit per byte, rotating through the bit positions.
        bad[at] ^= 1 << (at % 8);
        assert!(check(&bad).is_some(), "flipping a bit of byte {at} went unnoticed");
        bad[at] = good[at];
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..10_000)) {
        let _ = exercise(&bytes);
    }

    #[test]
    fn random_bytes_behind_a_valid_magic_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 4096..9000)) {
        bytes[..8].copy_from_slice(&asr_corpus::layout::MAGIC);
        bytes[16..20].copy_from_slice(&0x0102_0304u32.to_le_bytes());
        bytes[8..16].copy_from_slice(&[1, 0, 0, 0, 1, 0, 0, 0]);
        refresh_checksums(&mut bytes);
        let _ = exercise(&bytes);
    }

    /// Overwrites a range of a valid corpus with random bytes and then repairs every checksum,
    /// so that the corruption reaches the structural and cross-reference rules behind them.
    #[test]
    fn corruption_with_repaired_checksums_never_panics(
        start in 0usize..60_000,
        junk in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let spec = SynthSpec { max_samples: 400, min_samples: 1, ..SynthSpec::default() };
        let mut bytes = synth_bytes(40, &spec, 3);
        let start = start % bytes.len();
        let end = (start + junk.len()).min(bytes.len());
        bytes[start..end].copy_from_slice(&junk[..end - start]);
        refresh_checksums(&mut bytes);
        let _ = exercise(&bytes);
    }
}
