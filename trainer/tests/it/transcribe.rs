//! `asrt transcribe` against NeMo 2.7.3's own `transcribe(timestamps=True)` on the committed
//! fixture (`tests/data/nemo/transcribe/`, made by its `make.py` with NeMo): the same token ids,
//! text, and token, word and segment times (frames and seconds, exactly); the greedy start from
//! the blank's embedding row, told apart from a zero start by a model whose row is not zero;
//! NeMo's timestamp rules on hand-made hypotheses with word markers, punctuation after a
//! silence and several sentences; and inputs that cannot be read.

use std::path::{Path, PathBuf};

use asr_tdt::greedy::Hypothesis;
use asr_trainer::{
    transcript_text, transcript_timestamps, vocabulary_punctuation, FrameTime, Pieces,
};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("..")
}

fn fixture() -> Value {
    let p = root().join("trainer/tests/data/nemo/transcribe/expected.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn asrt(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_asrt")).args(args).output().unwrap()
}

/// `asrt transcribe` of `files` with `model`: exit code, JSON lines, standard error.
fn transcribe(model: &str, files: &[String], extra: &[&str]) -> (Option<i32>, Vec<Value>, String) {
    let model = root().join(model);
    let mut args = vec!["transcribe", "--checkpoint", model.to_str().unwrap()];
    args.extend(files.iter().map(String::as_str));
    args.extend(extra);
    let o = asrt(&args);
    let lines = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (o.status.code(), lines, String::from_utf8_lossy(&o.stderr).into_owned())
}

fn audio_files(utterances: &Value) -> Vec<String> {
    utterances
        .as_array()
        .unwrap()
        .iter()
        .map(|u| root().join(u["audio"].as_str().unwrap()).display().to_string())
        .collect()
}

/// NeMo's `[{key: text, start_offset, end_offset, start, end}]` against ours.
fn same_spans(ours: &Value, nemo: &Value, key: &str, what: &str) {
    let (o, n) = (ours.as_array().unwrap(), nemo.as_array().unwrap());
    assert_eq!(o.len(), n.len(), "{what}: {key}s\nours {ours}\nnemo {nemo}");
    for (a, b) in o.iter().zip(n) {
        for k in ["start_offset", "end_offset", "start", "end"] {
            assert_eq!(a[k], b[k], "{what}: {key} {b} field {k}: ours {a}");
        }
        assert_eq!(a[key], b[key], "{what}: {key} text");
    }
}

#[test]
fn tokens_text_and_times_match_nemo_transcribe() {
    let _turn = crate::serial();
    let f = fixture();
    let files = audio_files(&f["utterances"]);
    let (code, lines, err) = transcribe("trainer/tests/data/nemo/tiny-tdt.nemo", &files, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(lines.len(), 3);
    for (ours, nemo) in lines.iter().zip(f["utterances"].as_array().unwrap()) {
        let what = nemo["audio"].as_str().unwrap();
        assert_eq!(ours["tokens"], nemo["y_sequence"], "{what}");
        assert_eq!(ours["pred_text"], nemo["text"], "{what}");
        let (t, n) = (&ours["timestamps"], &nemo["timestamp"]);
        let chars = t["char"].as_array().unwrap();
        let nemo_chars = n["char"].as_array().unwrap();
        assert_eq!(chars.len(), nemo_chars.len(), "{what}");
        for (a, b) in chars.iter().zip(nemo_chars) {
            for k in ["start_offset", "end_offset", "start", "end"] {
                assert_eq!(a[k], b[k], "{what}: token {b}: {k}");
            }
        }
        same_spans(&t["word"], &n["word"], "word", what);
        same_spans(&t["segment"], &n["segment"], "segment", what);
    }
}

#[test]
fn greedy_decoding_starts_from_the_blank_row_as_nemo_does() {
    let _turn = crate::serial();
    let f = fixture();
    let m = &f["blank_row_model"];
    let files = audio_files(&m["utterances"]);
    let (code, lines, err) =
        transcribe("trainer/tests/data/nemo/transcribe/blank-row.nemo", &files, &[]);
    assert_eq!(code, Some(0), "{err}");
    let mut differs = 0;
    for ((ours, nemo), zero) in lines
        .iter()
        .zip(m["utterances"].as_array().unwrap())
        .zip(f["utterances"].as_array().unwrap())
    {
        assert_eq!(ours["tokens"], nemo["y_sequence"], "{}", nemo["audio"]);
        // The blank row filled with 3.0 changes what a blank-row start decodes; a zero start
        // decodes what tiny-tdt.nemo decodes.
        differs += usize::from(nemo["y_sequence"] != zero["y_sequence"]);
    }
    assert!(differs >= 1, "the fixture cannot tell a blank-row start from a zero start");
}

#[test]
fn nemo_timestamp_rules_on_words_punctuation_and_sentences() {
    let f = fixture();
    let model = crate::example_spm();
    let pieces = Pieces::parse(&model).unwrap();
    let punctuation = vocabulary_punctuation(&pieces);
    let nemo_set: String = f["supported_punctuation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(punctuation.iter().collect::<String>(), nemo_set);
    let time = FrameTime { hop_seconds: 0.01, subsampling: 8.0 };
    for case in f["synthetic_timestamps"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let ids = |k: &str| -> Vec<usize> {
            case[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect()
        };
        let h = Hypothesis {
            tokens: ids("y_sequence"),
            frames: ids("timestep"),
            durations: ids("token_duration"),
        };
        let t = transcript_timestamps(&h, &pieces, &punctuation, time);
        assert_eq!(transcript_text(&h, &pieces, &punctuation), case["text"], "{name}");
        let spans = |list: &[asr_trainer::Span], key: &str| -> Value {
            list.iter()
                .map(|s| {
                    serde_json::json!({key: s.text, "start_offset": s.start_offset,
                        "end_offset": s.end_offset, "start": s.start, "end": s.end})
                })
                .collect()
        };
        let n = &case["timestamp"];
        same_spans(&spans(&t.word, "word"), &n["word"], "word", name);
        same_spans(&spans(&t.segment, "segment"), &n["segment"], "segment", name);
        for (a, b) in t.token.iter().zip(n["char"].as_array().unwrap()) {
            assert_eq!(
                (a.start_offset as u64, a.end_offset as u64),
                (b["start_offset"].as_u64().unwrap(), b["end_offset"].as_u64().unwrap()),
                "{name}: {b}"
            );
            assert_eq!(
                (a.start, a.end),
                (b["start"].as_f64().unwrap(), b["end"].as_f64().unwrap())
            );
        }
    }
}

#[test]
fn unreadable_inputs_are_reported_and_the_others_transcribed() {
    let _turn = crate::serial();
    let f = fixture();
    let good = audio_files(&f["utterances"]).remove(0);
    let not_audio =
        root().join("compiler/tests/data/codecs/bad_not_audio.txt").display().to_string();
    let missing = "/nonexistent/none.flac".to_owned();
    let dir = tempfile::tempdir().unwrap();
    // A manifest with a reference, a field of its own, and a segment of the good file.
    let manifest = dir.path().join("m.json");
    std::fs::write(
        &manifest,
        format!(
            "{{\"audio_filepath\": \"{good}\", \"text\": \"hello\", \"lang\": \"en\"}}\n\
             {{\"audio_filepath\": \"{good}\", \"offset\": 0.5, \"duration\": 0.75, \"text\": \"hi\"}}\n"
        ),
    )
    .unwrap();
    let files = [good.clone(), not_audio.clone(), missing, manifest.display().to_string()];
    let (code, lines, err) = transcribe("trainer/tests/data/nemo/tiny-tdt.nemo", &files, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert!(lines[0]["pred_text"].is_string());
    assert_eq!(lines[1]["error"], "unsupported_codec");
    assert_eq!(lines[2]["error"], "missing_file");
    assert!(err.contains("2 of 5 inputs could not be transcribed"), "{err}");
    assert!(err.contains(&not_audio), "{err}");
    // The manifest's own fields are kept; the segment is 0.75 s of the file.
    assert_eq!(lines[3]["lang"], "en");
    assert_eq!(lines[3]["pred_text"], lines[0]["pred_text"]);
    assert_eq!(lines[4]["duration"], 0.75);
    assert!(err.contains("2 utterances with references: WER"), "{err}");
    // Longer than --max-seconds: refused, naming the limit.
    let (code, lines, _) =
        transcribe("trainer/tests/data/nemo/tiny-tdt.nemo", &[good], &["--max-seconds", "0.5"]);
    assert_eq!(code, Some(1));
    assert_eq!(lines[0]["error"], "too_long");
    assert!(lines[0]["error_detail"].as_str().unwrap().contains("--max-seconds 0.5"));
}

/// The Python with NeMo 2.7.3: `ASRT_NEMO_PYTHON`, else the cached venv the fixture scripts use.
fn nemo_python() -> Option<PathBuf> {
    crate::venv_python("ASRT_NEMO_PYTHON", "asr-nemo-venv", "import nemo.collections.asr")
}

#[test]
fn nemo_transcribes_our_export_as_it_transcribes_the_original() {
    let Some(python) = nemo_python() else {
        eprintln!(
            "skipped: NeMo 2.7.3 is not installed (set ASRT_NEMO_PYTHON, or make \
             ~/.cache/asr-nemo-venv as trainer/tests/data/nemo/transcribe/README.md says)"
        );
        return;
    };
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("export.nemo");
    let model = root().join("trainer/tests/data/nemo/tiny-tdt.nemo");
    let o = asrt(&["export", model.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let script = root().join("trainer/tests/data/nemo/transcribe/check_export.py");
    let o = std::process::Command::new(python)
        .args([script.to_str().unwrap(), out.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "NeMo on the export: {stdout}\n{}",
        String::from_utf8_lossy(&o.stderr).lines().rev().take(15).collect::<Vec<_>>().join("\n")
    );
    assert!(stdout.contains("\"problems\": []"), "{stdout}");
}
