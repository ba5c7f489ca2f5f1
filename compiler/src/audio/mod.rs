//! Audio: FLAC decoding and resampling to the corpus rate.

pub mod decode;
pub mod resample;
