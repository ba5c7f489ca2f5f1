//! `asrc validate`: exit codes, messages and JSON on valid, corrupt and unreadable corpora.

use crate::{asrc, golden};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn valid_corpus_exits_0_with_a_summary() {
    let out = asrc(&["validate", golden().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("valid (all checks)"), "{stdout}");
    assert!(stdout.contains("3 utterances"), "{stdout}");
    assert!(stdout.contains("hi "), "{stdout}");
}

#[test]
fn valid_corpus_json_has_the_report() {
    let out = asrc(&["validate", "--json", golden().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["status"], "valid");
    assert_eq!(v["report"]["utterances"], 3);
    assert_eq!(v["report"]["languages"]["en"]["utterances"], 2);
    assert_eq!(v["report"]["sections"].as_array().unwrap().len(), 12);
}

#[test]
fn corrupt_corpus_exits_1_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(golden()).unwrap();
    bytes[4096 + 2] ^= 0x10; // a PCM byte: caught by the PCM checksum
    let path = dir.path().join("flipped.asrcorpus");
    std::fs::write(&path, &bytes).unwrap();
    let out = asrc(&["validate", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("invalid corpus: section PCM (bytes 4096..4126): checksum mismatch"),
        "{err}"
    );

    // Structure-only does not read PCM, so it accepts the same file.
    let out = asrc(&["validate", "--structure-only", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let truncated = dir.path().join("truncated.asrcorpus");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    let out = asrc(&["validate", "--json", truncated.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "invalid");
    assert!(v["error"].as_str().unwrap().contains("the section table says"), "{v}");
}

#[test]
fn non_corpus_files_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audio.flac");
    std::fs::write(&path, b"fLaC\0\0\0\x22 not a corpus at all").unwrap();
    let out = asrc(&["validate", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("shorter than the 4096-byte header"));
}

#[test]
fn unreadable_file_and_bad_usage_exit_2() {
    let out = asrc(&["validate", "/nonexistent/corpus.asrcorpus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read /nonexistent/corpus.asrcorpus"));
    let out = asrc(&["validate", "--json", "/nonexistent/corpus.asrcorpus"]);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "unreadable");
    let out = asrc(&["validate"]);
    assert_eq!(out.status.code(), Some(2));
    let out = asrc(&["validate", "--no-such-flag", "x"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn help_explains_exit_codes() {
    let out = asrc(&["validate", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    assert!(help.contains("Exit status: 0 when the corpus is valid, 1 when it is not"), "{help}");
}
