//! Integration tests of the `asrc` binary: one test binary, one module per subcommand.

// Test helpers outside #[test] functions may unwrap: a panic is the failure report.
#![allow(clippy::unwrap_used, missing_docs)]

mod compile;
mod decode;
mod flac_conformance;
mod inspect_dump;
mod lang_rules;
mod manifest;
mod merge;
mod resample;
mod retokenize;
mod text_rules;
mod tokenize;
mod validate;

use std::path::PathBuf;
use std::process::Output;

/// Runs `asrc` with `args`.
pub fn asrc(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_asrc")).args(args).output().unwrap()
}

/// The format crate's golden corpus.
pub fn golden() -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("run through cargo test"),
    )
    .join("../format-spec/testdata/v1/tiny.asrcorpus")
}
