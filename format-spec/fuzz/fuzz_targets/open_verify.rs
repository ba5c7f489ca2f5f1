//! Any bytes: `Corpus::from_bytes` and `verify` return Ok or Err and never panic, and every
//! accessor on an opened corpus stays in bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = asr_corpus::Corpus::from_bytes(data) {
        for i in 0..c.len() {
            let _ = (c.pcm(i), c.tokens(i), c.language_code(i), c.source_name(i));
        }
        for b in 0..c.text_block_count() {
            let _ = c.text_block(b);
        }
        let _ = c.verify();
    }
});
