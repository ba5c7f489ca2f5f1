//! Integration tests of the `asrc` binary: one test binary, one module per subcommand.

// Test helpers outside #[test] functions may unwrap: a panic is the failure report.
#![allow(clippy::unwrap_used, missing_docs)]

mod codecs;
mod compile;
mod decode;
mod flac_conformance;
mod inputs;
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

/// The bundled example's directory (`examples/espeak`).
pub fn example_dir() -> PathBuf {
    std::path::Path::new(
        &std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("../examples/espeak")
}

/// A file of the bundled example, as a command-line argument.
pub fn example(file: &str) -> String {
    example_dir().join(file).display().to_string()
}

/// Asserts that an `asrc` run was refused (exit status 2) with `needle` in its message.
pub fn refused(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains(needle), "{needle:?} not in {err}");
}

/// The format crate's golden corpus.
pub fn golden() -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("run through cargo test"),
    )
    .join("../format-spec/testdata/v1/tiny.asrcorpus")
}
