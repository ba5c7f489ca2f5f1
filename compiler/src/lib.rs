//! `asrc`: compiles an ASR training manifest into one memory-mappable corpus file, and
//! validates corpora. The binary in `main.rs` is a thin shell over the commands here.
#![forbid(unsafe_code)]

pub mod audio;
pub mod cli;
pub mod commands;
pub mod compile;
pub mod dedup;
pub mod lang;
pub mod manifest;
pub mod output;
pub mod reason;
pub mod shards;
pub mod text;
pub mod tokenize;
