//! `asrc compile` end to end: the bundled espeak-ng example (every reject reason it carries, the
//! retags, the duration flag, PCM against `flac -d` and `sox`), determinism across thread counts
//! and chunk sizes, `--max-reject-fraction`, and the raw shard layout with its filters.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, StringArray};
use asr_corpus::Corpus;
use serde_json::Value;

use crate::asrc;
use crate::example_dir as example;
use crate::manifest::write;

fn compile(dir: &Path, extra: &[&str]) -> (std::process::Output, PathBuf) {
    let out = dir.join("c.asrcorpus");
    (compile_to(&out, extra), out)
}

/// Compiles the example into `out`.
fn compile_to(out: &Path, extra: &[&str]) -> std::process::Output {
    let manifest = example().join("manifest.parquet");
    let model = example().join("spm.model");
    let mut args = vec![
        "compile",
        manifest.to_str().unwrap(),
        "--tokenizer",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    asrc(&args)
}

fn report(corpus: &Path) -> (Value, Vec<Value>) {
    let s = std::fs::read_to_string(format!("{}.report.json", corpus.display())).unwrap();
    let l = std::fs::read_to_string(format!("{}.report.jsonl", corpus.display())).unwrap();
    let lines = l.lines().map(|x| serde_json::from_str(x).unwrap()).collect();
    (serde_json::from_str(&s).unwrap(), lines)
}

fn index_of(c: &Corpus, id: &str) -> usize {
    (0..c.len()).find(|&i| c.text(i).unwrap().0 == id).unwrap()
}

/// Raw 16-bit little-endian samples from a command's stdout.
fn raw_i16(cmd: &mut Command) -> Vec<i16> {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out.stdout.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect()
}

#[test]
fn the_example_compiles_with_every_row_accounted_for() {
    let dir = tempfile::tempdir().unwrap();
    let (out, corpus) = compile(dir.path(), &["--quiet"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = asrc(&["validate", corpus.to_str().unwrap()]);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stdout));

    let (summary, lines) = report(&corpus);
    let dropped: BTreeMap<String, u64> =
        serde_json::from_value(summary["dropped_by_reason"].clone()).unwrap();
    let expected: BTreeMap<String, u64> = [
        "duplicate_row",
        "reused_segment_id",
        "duplicate_audio",
        "truncated_flac",
        "unsupported_codec",
        "missing_file",
        "null_text",
        "empty_text",
        "no_language",
    ]
    .iter()
    .map(|r| (r.to_string(), 1))
    .collect();
    assert_eq!(dropped, expected);
    assert_eq!(summary["rows"], 43);
    assert_eq!(summary["kept"], 34);
    assert_eq!(summary["retags"], serde_json::json!({"bn->as": 1, "hi->ta": 1}));
    assert_eq!(summary["flagged_by_reason"], serde_json::json!({"duration_mismatch": 1}));

    // The JSON lines: every dropped, retagged and flagged row, in row order.
    let rows: Vec<u64> = lines.iter().map(|l| l["row"].as_u64().unwrap()).collect();
    assert!(rows.windows(2).all(|w| w[0] <= w[1]), "{rows:?}");
    let find = |reason: &str| lines.iter().find(|l| l["reason"] == reason).unwrap().clone();
    assert_eq!(find("duplicate_audio")["segment_id"], "en-0001-copy");
    assert_eq!(find("duration_mismatch")["segment_id"], "en-0004");
    assert_eq!(find("unsupported_codec")["segment_id"], "broken-aiff");
    let retag = lines.iter().find(|l| l["segment_id"] == "ta-0003").unwrap();
    assert_eq!(retag["retag"]["method"], "script");

    let c = Corpus::open(&corpus).unwrap();
    assert_eq!(c.len(), 34);
    let lang = |id: &str| c.language_code(index_of(&c, id)).to_owned();
    assert_eq!(lang("ta-0003"), "ta");
    assert_eq!(lang("as-0002"), "as");
    assert_eq!(lang("hi-0003"), "hi", "HIN normalised");
    assert_eq!(lang("en-0005"), "en", "English normalised");
    assert_eq!(c.text(index_of(&c, "en-0003")).unwrap().1, "I will call you tomorrow morning");
    assert_eq!(c.text(index_of(&c, "hi-0001")).unwrap().1, "आज मौसम बहुत अच्छा है");

    let audio = example().join("audio/shard-000");
    // 16 kHz, mono, 16 bit: stored exactly as the reference decoder decodes it.
    let want = raw_i16(
        Command::new("flac")
            .args(["-s", "-d", "-c", "--force-raw-format", "--endian=little", "--sign=signed"])
            .arg(audio.join("en-0001.flac")),
    );
    assert_eq!(c.pcm(index_of(&c, "en-0001")), want.as_slice());
    // The duration flag does not change what is stored: the decoded length.
    let en4 = c.pcm(index_of(&c, "en-0004")).len();
    assert_eq!(en4, raw_i16(&mut sox_16k(&audio.join("en-0004.flac"))).len());

    // 44.1 kHz stereo: downmixed and resampled; compared with sox's high-quality resampler.
    let ours = c.pcm(index_of(&c, "en-0003"));
    let theirs = raw_i16(&mut sox_16k(&audio.join("en-0003.flac")));
    assert_eq!(ours.len(), theirs.len());
    let (mut sig, mut err) = (0f64, 0f64);
    for (&a, &b) in ours.iter().zip(&theirs) {
        sig += f64::from(b).powi(2);
        err += (f64::from(a) - f64::from(b)).powi(2);
    }
    let snr = 10.0 * (sig / err.max(1e-9)).log10();
    assert!(snr >= 40.0, "SNR against sox {snr:.1} dB");
}

fn sox_16k(path: &Path) -> Command {
    let mut c = Command::new("sox");
    c.arg("-D").arg(path).args(["-t", "raw", "-e", "signed", "-b", "16", "-", "remix", "-"]);
    c.args(["rate", "-v", "16000"]);
    c
}

#[test]
fn thread_count_and_chunk_size_do_not_change_a_byte() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let (oa, ca) = compile(a.path(), &["--quiet", "--jobs", "1", "--chunk-rows", "3"]);
    let (ob, cb) = compile(b.path(), &["--quiet", "--jobs", "2", "--chunk-rows", "1000"]);
    assert!(oa.status.success() && ob.status.success());
    assert_eq!(std::fs::read(&ca).unwrap(), std::fs::read(&cb).unwrap());
    assert_eq!(report(&ca).1, report(&cb).1);
}

#[test]
fn too_many_rejects_exit_1_with_the_corpus_written() {
    let dir = tempfile::tempdir().unwrap();
    let (out, corpus) = compile(dir.path(), &["--quiet", "--max-reject-fraction", "0.1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("9 of 43 rows dropped"), "{err}");
    assert!(Corpus::open(&corpus).is_ok());
    let (out, _) = compile(dir.path(), &["--quiet", "--max-reject-fraction", "0.25"]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_schema_problem_is_an_error_naming_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("m.parquet");
    let col = |v: Vec<&str>| -> ArrayRef { Arc::new(StringArray::from(v)) };
    write(&manifest, vec![("segment_id", col(vec!["a"])), ("text", col(vec!["x"]))]);
    let model = example().join("spm.model");
    let out = asrc(&[
        "compile",
        manifest.to_str().unwrap(),
        "--tokenizer",
        model.to_str().unwrap(),
        "-o",
        dir.path().join("c.asrcorpus").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing column `shard_id`"), "{err}");
    assert!(!dir.path().join("c.asrcorpus").exists(), "nothing written");
}

struct Meta<'a> {
    id: Option<&'a str>,
    text: Option<&'a str>,
    duration: f64,
    quality: f64,
    lang: Option<&'a str>,
    file: Option<&'a str>,
}

/// One shard directory: metadata.parquet, audio_index.parquet and the audio files copied from
/// the example (`file` names an example file; the shard stores it under the segment id).
fn shard(dir: &Path, rows: &[Meta<'_>], extra_index: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    let s = |f: &dyn Fn(&Meta<'_>) -> Option<String>| -> ArrayRef {
        Arc::new(StringArray::from(rows.iter().map(f).collect::<Vec<_>>()))
    };
    let f = |f: &dyn Fn(&Meta<'_>) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from(rows.iter().map(f).collect::<Vec<_>>()))
    };
    write(
        &dir.join("metadata.parquet"),
        vec![
            ("segment_id", s(&|m| m.id.map(str::to_owned))),
            ("transcription_native", s(&|m| m.text.map(str::to_owned))),
            ("duration_s", f(&|m| m.duration)),
            ("tx_quality_score", f(&|m| m.quality)),
            ("segment_language", s(&|m| m.lang.map(str::to_owned))),
        ],
    );
    let mut ids = Vec::new();
    let mut names = Vec::new();
    for m in rows {
        if let (Some(id), Some(file)) = (m.id, m.file) {
            let name = format!("{id}.flac");
            let src = example().join("audio/shard-000").join(file);
            let mut bytes = std::fs::read(src).unwrap();
            if id.ends_with("corrupt") {
                // Flip bits in the middle of the first audio frame's data.
                let mid = bytes.len() / 3;
                for b in &mut bytes[mid..mid + 64] {
                    *b ^= 0x5a;
                }
            }
            std::fs::write(dir.join(&name), bytes).unwrap();
            ids.push(id.to_owned());
            names.push(name);
        }
    }
    for (id, name) in extra_index {
        ids.push(id.to_string());
        names.push(name.to_string());
    }
    let col = |v: Vec<String>| -> ArrayRef { Arc::new(StringArray::from(v)) };
    write(
        &dir.join("audio_index.parquet"),
        vec![("segment_id", col(ids)), ("tar_member_name", col(names))],
    );
}

fn compile_shards(root: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let model = example().join("spm.model");
    let mut args = vec!["compile", "--shards", root.to_str().unwrap()];
    args.extend(["--tokenizer", model.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    args.extend_from_slice(extra);
    asrc(&args)
}

#[test]
fn raw_shards_are_joined_filtered_and_labelled_from_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("raw");
    let long_text = "शब्द ".repeat(15_000);
    let m =
        |id, text, duration, quality, lang, file| Meta { id, text, duration, quality, lang, file };
    shard(
        &root.join("hindi/shard-b"),
        &[
            m(Some("h1"), Some("आज मौसम बहुत अच्छा है।"), 2.0, 0.9, Some("hi"), Some("hi-0001.flac")),
            m(Some("h2"), Some("कृपया दरवाज़ा बंद कर दीजिए"), 2.0, 0.9, None, Some("hi-0002.flac")),
            m(Some("h3-lowq"), Some("यह किताब"), 2.0, 0.2, Some("hi"), Some("hi-0004.flac")),
            m(Some("h4-long"), Some("यह किताब"), 30.0, 0.9, Some("hi"), Some("hi-0005.flac")),
            m(Some("h5-noindex"), Some("यह किताब"), 2.0, 0.9, Some("hi"), None),
            m(Some("h6-blank"), Some("   "), 2.0, 0.9, Some("hi"), Some("mr-0001.flac")),
            m(Some("h7-corrupt"), Some("यह किताब"), 2.0, 0.9, Some("hi"), Some("hi-0003.flac")),
            m(None, Some("यह किताब"), 2.0, 0.9, Some("hi"), None),
            m(Some("h8-huge"), Some(&long_text), 2.0, 0.9, Some("hi"), Some("mr-0002.flac")),
        ],
        &[("orphan", "orphan.flac")],
    );
    shard(
        &root.join("tamil/shard-a"),
        &[m(Some("t1"), Some("இன்று வானிலை"), 2.0, 0.9, None, Some("ta-0001.flac"))],
        &[],
    );
    let out_path = dir.path().join("s.asrcorpus");
    let filters =
        ["--min-duration", "0.5", "--max-duration", "20", "--min-quality", "0.5", "--quiet"];
    let out = compile_shards(&root, &out_path, &filters);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (summary, lines) = report(&out_path);
    let reason = |id: &str| {
        lines
            .iter()
            .filter(|l| l["segment_id"] == id)
            .map(|l| l["reason"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(reason("h3-lowq"), ["filtered_quality"]);
    assert_eq!(reason("h4-long"), ["filtered_duration"]);
    assert_eq!(reason("h5-noindex"), ["no_audio_index"]);
    assert_eq!(reason("h6-blank"), ["empty_text"]);
    assert_eq!(reason("h7-corrupt"), ["corrupt_flac"]);
    assert_eq!(reason("h8-huge"), ["unstorable"]);
    assert_eq!(summary["dropped_by_reason"]["null_segment_id"], 1);
    assert_eq!(summary["rows"], 10);

    // Shards in path order (hindi/ before tamil/); a null language comes from the path.
    let c = Corpus::open(&out_path).unwrap();
    let ids: Vec<String> = (0..c.len()).map(|i| c.text(i).unwrap().0).collect();
    assert_eq!(ids, ["h1", "h2", "t1"]);
    assert_eq!(c.language_code(1), "hi");
    assert_eq!(c.language_code(2), "ta");
    assert_eq!(c.source_name(0), "raw");
    let shard_of = lines.iter().find(|l| l["segment_id"] == "h3-lowq").unwrap()["shard_id"].clone();
    assert_eq!(shard_of, "hindi/shard-b");

    // A shard without its audio index is an error naming the file.
    std::fs::remove_file(root.join("tamil/shard-a/audio_index.parquet")).unwrap();
    let out = compile_shards(&root, &out_path, &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tamil/shard-a/audio_index.parquet"), "{err}");
}

#[test]
fn relative_audio_paths_resolve_against_audio_root() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("manifest.parquet");
    std::fs::copy(example().join("manifest.parquet"), &manifest).unwrap();
    let model = example().join("spm.model");
    let run = |out: &Path, extra: &[&str]| {
        let mut args = vec!["compile", manifest.to_str().unwrap(), "--tokenizer"];
        args.extend([model.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quiet"]);
        args.extend_from_slice(extra);
        asrc(&args)
    };
    // Beside a manifest without its audio, every row with a file is missing...
    let alone = dir.path().join("alone.asrcorpus");
    assert!(run(&alone, &[]).status.success());
    let (summary, _) = report(&alone);
    assert_eq!(summary["kept"], 0);
    assert_eq!(
        summary["dropped_by_reason"]["missing_file"], 38,
        "43 rows less 5 dropped before decoding"
    );
    // ...and with --audio-root the corpus is the one compiled in place, byte for byte.
    let rooted = dir.path().join("rooted.asrcorpus");
    let root = example();
    assert!(run(&rooted, &["--audio-root", root.to_str().unwrap()]).status.success());
    let (in_place_out, in_place) = compile(dir.path(), &["--quiet"]);
    assert!(in_place_out.status.success());
    assert_eq!(std::fs::read(&rooted).unwrap(), std::fs::read(&in_place).unwrap());
}

#[test]
fn outputs_go_into_directories_created_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("not/yet/there/c.asrcorpus");
    let report = dir.path().join("reports/of/today/c.json");
    let run = compile_to(&out, &["--report", report.to_str().unwrap(), "--quiet"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(Corpus::open(&out).unwrap().len(), 34);
    assert!(report.is_file() && report.with_extension("jsonl").is_file());
}

/// Occurrences of `needle` in `haystack`.
fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn an_unwritable_output_is_an_error_naming_its_path_once() {
    let dir = tempfile::tempdir().unwrap();
    // A directory cannot be created where a file is (whoever runs the test, root included).
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"a file, not a directory").unwrap();
    let out = blocker.join("c.asrcorpus");
    let run = compile_to(&out, &["--quiet"]);
    assert_eq!(run.status.code(), Some(2));
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(count(&err, out.to_str().unwrap()), 1, "{err}");
    assert!(err.contains("creating directory"), "{err}");
    assert!(!err.contains("at path"), "{err}");

    // The corpus cannot take the place of a directory: the error comes from the final rename.
    let taken = dir.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    let run = compile_to(&taken, &["--quiet"]);
    assert_eq!(run.status.code(), Some(2));
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(count(&err, taken.to_str().unwrap()), 1, "{err}");
    assert!(count(&err, "at path") <= 1, "{err}");
    assert!(taken.is_dir() && std::fs::read_dir(&taken).unwrap().next().is_none());
}
