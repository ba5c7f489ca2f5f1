//! Audio: FLAC decoding (later) and resampling to the corpus rate.

pub mod resample;
