//! Dataset layouts written by each ecosystem's own writer (`tests/data/inputs/`, made by its
//! `make_fixtures.py`: NeMo-style manifests and tarred shards, webdataset's `TarWriter`, a Kaldi
//! directory). The same four utterances, two of them segments of one long recording where the
//! layout has segments, must compile to the same samples (the xxh3-64 the script computed from
//! the exact samples), texts, languages and tokens in every layout. Bad entries are rows
//! dropped with their reason and location, never a stopped compile.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use asr_corpus::Corpus;

use super::{asrc, example};

fn data() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("tests/data/inputs")
}

fn arg(p: &Path) -> String {
    p.display().to_string()
}

/// Compiles `inputs` with `extra` options into `dir`; the corpus and the report lines.
fn compile(dir: &Path, inputs: &[String], extra: &[&str]) -> (Corpus, Vec<serde_json::Value>) {
    let out = dir.join("c.asrcorpus");
    let model = example("spm.model");
    let mut args: Vec<&str> = vec!["compile"];
    args.extend(inputs.iter().map(String::as_str));
    // The labels are kept as given: the script-based retagging knows Latin script as English.
    args.extend(["--tokenizer", &model, "-o", out.to_str().unwrap(), "--quiet", "--no-retag"]);
    args.extend(extra);
    let o = asrc(&args);
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    let jsonl = std::fs::read_to_string(dir.join("c.asrcorpus.report.jsonl")).unwrap();
    let lines = jsonl.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (Corpus::open(&out).unwrap(), lines)
}

/// Per transcript: (audio hash, language, tokens).
type ByText = BTreeMap<String, (u64, String, Vec<u32>)>;

/// The corpus's utterances by transcript.
fn by_text(c: &Corpus) -> ByText {
    (0..c.len())
        .map(|i| {
            let tokens = c.tokens(i);
            let tokens = (0..tokens.len()).map(|j| tokens.get(j).unwrap()).collect();
            let hash = asr_corpus::audio_hash(c.pcm(i));
            (c.text(i).unwrap().1, (hash, c.language_code(i).to_owned(), tokens))
        })
        .collect()
}

#[test]
fn every_layout_compiles_the_same_utterances() {
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data().join("expected.json")).unwrap()).unwrap();
    let d = data();
    let tarred = arg(&d.join("nemo_tarred/audio__OP_0..1_CL_.tar"));
    let cases: Vec<(&str, Vec<String>, Vec<&str>)> = vec![
        ("nemo", vec![arg(&d.join("nemo/manifest.json"))], vec![]),
        (
            "nemo-tarred",
            vec![arg(&d.join("nemo_tarred/tarred_audio_manifest.json"))],
            vec!["--tarred-audio-filepaths", &tarred],
        ),
        ("wds data.list", vec![arg(&d.join("wds/data.list"))], vec![]),
        ("wds directory", vec![arg(&d.join("wds"))], vec![]),
        (
            "wds shards",
            vec![arg(&d.join("wds/shard-000000.tar")), arg(&d.join("wds/shard-000001.tar"))],
            vec![],
        ),
        ("kaldi", vec![arg(&d.join("kaldi"))], vec![]),
        ("kaldi archive", vec![arg(&d.join("kaldi_ark"))], vec![]),
        ("hf common voice", vec![arg(&d.join("hf/cv_style.parquet"))], vec![]),
        ("hf fleurs", vec![arg(&d.join("hf/fleurs_style.parquet"))], vec![]),
        ("lhotse cuts", vec![arg(&d.join("lhotse/cuts.jsonl.gz"))], vec![]),
        ("lhotse shar", vec![arg(&d.join("lhotse_shar"))], vec![]),
        ("lhotse shar, named", vec![arg(&d.join("lhotse_shar"))], vec!["--format", "lhotse-shar"]),
        (
            "lhotse recordings and supervisions",
            vec![
                arg(&d.join("lhotse/recordings.jsonl.gz")),
                arg(&d.join("lhotse/supervisions.jsonl.gz")),
            ],
            vec![],
        ),
    ];
    let mut seen: Option<ByText> = None;
    for (name, inputs, extra) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let (c, lines) = compile(tmp.path(), &inputs, &extra);
        let dropped: Vec<_> = lines.iter().filter(|l| l["kind"] == "dropped").collect();
        assert!(dropped.is_empty(), "{name}: {dropped:?}");
        let got = by_text(&c);
        assert_eq!(got.len(), 4, "{name}: {got:?}");
        for (id, u) in expected["utterances"].as_object().unwrap() {
            let text = u["text"].as_str().unwrap();
            let (hash, lang, _) =
                got.get(text).unwrap_or_else(|| panic!("{name}: no {id} ({text:?})"));
            assert_eq!(*hash, u["xxh3_64"].as_u64().unwrap(), "{name}: {id}'s samples");
            assert_eq!(lang, u["lang"].as_str().unwrap(), "{name}: {id}'s language");
        }
        if let Some(first) = &seen {
            assert_eq!(first, &got, "{name}: differs from the first layout");
        }
        seen = Some(got);
    }
}

/// Writes `name` in `dir` with `text`; its path as an argument.
fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    arg(&p)
}

#[test]
fn bad_nemo_lines_are_dropped_with_their_reason_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let audio = data().join("nemo/audio");
    let utt1 = arg(&audio.join("utt1.flac"));
    let long = arg(&audio.join("long.flac"));
    let manifest = write(
        tmp.path(),
        "m.json",
        &[
            format!(r#"{{"audio_filepath": "{utt1}", "duration": 0.5625, "text": "hello world", "lang": "en"}}"#),
            r#"{"audio_filepath": "#.to_owned(),
            String::new(),
            format!(r#"{{"audio_filepath": "{long}", "offset": 2.9, "duration": 0.5, "text": "guten tag", "lang": "de"}}"#),
            format!(r#"{{"audio_filepath": "{long}", "offset": 5.0, "duration": 0.5, "text": "guten tag", "lang": "de"}}"#),
            r#"{"audio_filepath": "nowhere.flac", "text": "hello", "lang": "en"}"#.to_owned(),
            format!(r#"{{"audio_filepath": "{}", "text": "hello", "lang": "en"}}"#, arg(&data().join("../codecs/bad_not_audio.txt"))),
        ]
        .join("\n"),
    );
    let (c, lines) = compile(tmp.path(), std::slice::from_ref(&manifest), &[]);
    assert_eq!(c.len(), 1);
    let reasons: Vec<(&str, &str)> = lines
        .iter()
        .filter(|l| l["kind"] == "dropped")
        .map(|l| (l["reason"].as_str().unwrap(), l["origin"].as_str().unwrap()))
        .collect();
    let at = |n: usize| format!("{manifest}:{n}");
    assert_eq!(
        reasons,
        [
            ("malformed_line", at(2).as_str()),
            ("segment_beyond_end", at(4).as_str()),
            ("segment_beyond_end", at(5).as_str()),
            ("missing_file", at(6).as_str()),
            ("unsupported_codec", at(7).as_str()),
        ]
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("c.asrcorpus.report.json")).unwrap())
            .unwrap();
    assert_eq!(summary["rows"], 6, "the blank line is not a row");
}

#[test]
fn a_member_missing_from_its_tar_is_a_counted_reject() {
    let tmp = tempfile::tempdir().unwrap();
    let d = data().join("nemo_tarred");
    let manifest = write(
        tmp.path(),
        "m.json",
        "{\"audio_filepath\": \"utt1.flac\", \"text\": \"hello world\", \"lang\": \"en\", \"shard_id\": 0}\n\
         {\"audio_filepath\": \"utt9.flac\", \"text\": \"hello world\", \"lang\": \"en\", \"shard_id\": 1}\n\
         {\"audio_filepath\": \"utt2.flac\", \"text\": \"hello\", \"lang\": \"en\", \"shard_id\": 7}\n",
    );
    let pattern = arg(&d.join("audio_{0..1}.tar"));
    let (c, lines) = compile(
        tmp.path(),
        &[manifest],
        &["--format", "nemo-tarred", "--tarred-audio-filepaths", &pattern],
    );
    assert_eq!(c.len(), 1);
    assert_eq!(lines[0]["reason"], "missing_member");
    assert_eq!(lines[0]["member"], "utt9.flac");
    assert!(lines[0]["file"].as_str().unwrap().ends_with("audio_1.tar"), "{}", lines[0]);
    assert_eq!(lines[1]["reason"], "malformed_line");
    assert!(lines[1]["detail"].as_str().unwrap().contains("names 2 archives"), "{}", lines[1]);
}

#[test]
fn kaldi_pipes_are_refused_unless_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    // The fixture's wav.scp and text, and a language for the utterance.
    let dir = tmp.path().join("kaldi_pipe");
    std::fs::create_dir(&dir).unwrap();
    for f in ["wav.scp", "text"] {
        std::fs::copy(data().join("kaldi_pipe").join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("utt2lang"), "utt1 en\n").unwrap();
    let (c, lines) = compile(tmp.path(), &[arg(&dir)], &["--format", "kaldi"]);
    assert_eq!(c.len(), 0);
    assert_eq!(lines[0]["reason"], "pipe_refused");
    assert!(lines[0]["detail"].as_str().unwrap().contains("--allow-pipes"));
    // Run, the pipe's relative path resolves in --audio-root: sox writes the same samples.
    let root = arg(&data().join("nemo"));
    let (c, lines) = compile(tmp.path(), &[arg(&dir)], &["--allow-pipes", "--audio-root", &root]);
    assert!(lines.iter().all(|l| l["kind"] != "dropped"), "{lines:?}");
    assert_eq!(c.len(), 1);
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data().join("expected.json")).unwrap()).unwrap();
    assert_eq!(asr_corpus::audio_hash(c.pcm(0)), expected["utterances"]["utt1"]["xxh3_64"]);
}

#[test]
fn kaldi_archive_entries_that_are_not_a_wave_are_named_rejects() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kaldi_ark");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(data().join("kaldi_ark/wav.ark"), dir.join("wav.ark")).unwrap();
    let len = std::fs::metadata(dir.join("wav.ark")).unwrap().len();
    // The fixture's utt1 is at byte 96054, after its key `utt1 `; the archive ends at `len`.
    write(
        &dir,
        "wav.scp",
        &format!(
            "good wav.ark:96054\nkey wav.ark:96049\npast wav.ark:{}\ngone gone.ark:5\n",
            len - 4
        ),
    );
    write(&dir, "text", "good hello world\nkey hello\npast hello\ngone hello\n");
    write(&dir, "utt2lang", "good en\nkey en\npast en\ngone en\n");
    let (c, lines) = compile(tmp.path(), &[arg(&dir)], &["--format", "kaldi"]);
    assert_eq!(c.len(), 1);
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data().join("expected.json")).unwrap()).unwrap();
    assert_eq!(asr_corpus::audio_hash(c.pcm(0)), expected["utterances"]["utt1"]["xxh3_64"]);
    let dropped: Vec<(&str, &str)> = lines
        .iter()
        .filter(|l| l["kind"] == "dropped")
        .map(|l| (l["reason"].as_str().unwrap(), l["detail"].as_str().unwrap()))
        .collect();
    let reasons: Vec<&str> = dropped.iter().map(|d| d.0).collect();
    assert_eq!(reasons, ["unsupported_codec", "truncated_audio", "missing_file"], "{dropped:?}");
    assert!(dropped[0].1.contains("at byte 96049, no RIFF/WAVE header"), "{}", dropped[0].1);
    assert!(dropped[1].1.contains(&format!("offset {} leaves 4", len - 4)), "{}", dropped[1].1);
    assert!(dropped[2].1.contains("gone.ark"), "{}", dropped[2].1);
}

#[test]
fn an_unknown_layout_is_refused_with_the_known_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let odd = write(tmp.path(), "data.csv", "a,b\n");
    let model = example("spm.model");
    let out = arg(&tmp.path().join("c.asrcorpus"));
    let o = asrc(&["compile", &odd, "--tokenizer", &model, "-o", &out]);
    super::refused(&o, "give --format: seed");
    for known in ["nemo", "nemo-tarred", "wds", "kaldi"] {
        assert!(String::from_utf8_lossy(&o.stderr).contains(known), "{known}");
    }
    let o = asrc(&["compile", &odd, "--format", "csv", "--tokenizer", &model, "-o", &out]);
    assert_eq!(o.status.code(), Some(2));
    let json = write(tmp.path(), "m.json", "");
    let o = asrc(&["compile", &json, "--format", "nemo-tarred", "--tokenizer", &model, "-o", &out]);
    super::refused(&o, "needs --tarred-audio-filepaths");
}

#[test]
fn a_seed_row_whose_tar_path_exists_reads_its_member_in_place() {
    use arrow::array::{ArrayRef, Float64Array, StringArray};
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let tar = arg(&data().join("nemo_tarred/audio_0.tar"));
    let s = |v: [&str; 2]| -> ArrayRef { Arc::new(StringArray::from(v.to_vec())) };
    let manifest = tmp.path().join("m.parquet");
    super::manifest::write(
        &manifest,
        vec![
            ("segment_id", s(["utt1", "utt9"])),
            ("shard_id", s(["0", "0"])),
            ("text", s(["<|en|> hello world", "<|en|> hello"])),
            ("duration", Arc::new(Float64Array::from(vec![0.5625, 1.0]))),
            ("lang", s(["en", "en"])),
            ("tar_member_name", s(["utt1.flac", "utt9.flac"])),
            ("tar_path", s([&tar, &tar])),
            ("source", s(["t", "t"])),
        ],
    );
    let (c, lines) = compile(tmp.path(), &[arg(&manifest)], &[]);
    assert_eq!(c.len(), 1);
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data().join("expected.json")).unwrap()).unwrap();
    assert_eq!(asr_corpus::audio_hash(c.pcm(0)), expected["utterances"]["utt1"]["xxh3_64"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        (&lines[0]["reason"], &lines[0]["member"]),
        (&"missing_member".into(), &"utt9.flac".into())
    );
}

#[test]
fn a_parquet_file_without_the_named_columns_is_refused_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let cv = arg(&data().join("hf/cv_style.parquet"));
    let model = example("spm.model");
    let out = arg(&tmp.path().join("c.asrcorpus"));
    let o = asrc(&["compile", &cv, "--audio-column", "wave", "--tokenizer", &model, "-o", &out]);
    super::refused(
        &o,
        "no audio column `wave` (--audio-column); columns: id, sentence, locale, audio",
    );
    let o = asrc(&["compile", &cv, "--text-column", "words", "--tokenizer", &model, "-o", &out]);
    super::refused(&o, "no column `words`");
}

#[test]
fn lhotse_cuts_it_cannot_read_are_named_rejects() {
    let tmp = tempfile::tempdir().unwrap();
    let audio = arg(&data().join("lhotse/audio/long.flac"));
    let rec = |sources: &str, channels: &str| {
        format!(
            r#""recording": {{"id": "long", "sources": [{sources}], "sampling_rate": 16000, "num_samples": 48000, "duration": 3.0, "channel_ids": {channels}}}"#
        )
    };
    let file = format!(r#"{{"type": "file", "channels": [0], "source": "{audio}"}}"#);
    let sup = r#""supervisions": [{"id": "s", "recording_id": "long", "start": 0.5, "duration": 0.625, "text": "bonjour le monde", "language": "fr"}]"#;
    let cut = |extra: &str| {
        format!(
            r#"{{"id": "c", "start": 0.5, "duration": 0.625, "channel": 0, {sup}, {extra}, "type": "MonoCut"}}"#
        )
    };
    let lines = [
        cut(&rec(&file, "[0]")),
        cut(&rec(&format!("{file}, {file}"), "[0, 1]")),
        cut(&rec(&file, "[0, 1]")),
        cut(&rec(
            r#"{"type": "url", "channels": [0], "source": "https://example.com/a.flac"}"#,
            "[0]",
        )),
        cut(&rec(r#"{"type": "command", "channels": [0], "source": "cat a.flac"}"#, "[0]")),
        r#"{"id": "m", "type": "MixedCut", "tracks": []}"#.to_owned(),
        "{\"id\": ".to_owned(),
    ];
    let manifest = write(tmp.path(), "cuts.jsonl", &lines.join("\n"));
    let (c, entries) = compile(tmp.path(), &[manifest], &[]);
    assert_eq!(c.len(), 1);
    let reasons: Vec<&str> = entries
        .iter()
        .filter(|l| l["kind"] == "dropped")
        .map(|l| l["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons,
        [
            "unsupported_audio",
            "unsupported_audio",
            "missing_file",
            "pipe_refused",
            "unsupported_audio",
            "malformed_line"
        ]
    );
}

/// Appends member `name` with `data` to the tar being built.
fn tar_member(tar: &mut tar::Builder<std::fs::File>, name: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append_data(&mut h, name, data).unwrap();
}

#[test]
fn lhotse_shar_cuts_it_cannot_read_are_named_rejects() {
    let tmp = tempfile::tempdir().unwrap();
    let shar = tmp.path().join("shar");
    std::fs::create_dir(&shar).unwrap();
    let flac = |u: &str| std::fs::read(data().join(format!("nemo/audio/{u}.flac"))).unwrap();
    // Shard 0: utt1's audio, the writer's placeholder for a cut without audio, and audio that
    // no cut names. Shard 1 lost its archive.
    let mut tar =
        tar::Builder::new(std::fs::File::create(shar.join("recording.000000.tar")).unwrap());
    for (name, bytes) in [
        ("utt1.flac", flac("utt1")),
        ("utt1.json", b"{}".to_vec()),
        ("gone.nodata", vec![]),
        ("gone.nometa", vec![]),
        ("orphan.flac", flac("utt2")),
        ("orphan.json", b"{}".to_vec()),
    ] {
        tar_member(&mut tar, name, &bytes);
    }
    tar.finish().unwrap();
    let cut = |id: &str, text: &str| {
        format!(
            r#"{{"id": "{id}", "start": 0, "duration": 0.5625, "channel": 0, "supervisions": [{{"id": "{id}", "recording_id": "{id}", "start": 0.0, "duration": 0.5625, "text": "{text}", "language": "en"}}], "recording": {{"id": "{id}", "sources": [{{"type": "shar", "channels": [0], "source": ""}}], "sampling_rate": 16000, "num_samples": 9000, "duration": 0.5625, "channel_ids": [0]}}, "type": "MonoCut"}}"#
        )
    };
    write(
        &shar,
        "cuts.000000.jsonl",
        &[
            cut("utt1", "hello world"),
            cut("gone", "hello"),
            cut("absent", "hello"),
            r#"{"id": "m", "type": "MixedCut", "tracks": []}"#.to_owned(),
            "{\"id\": ".to_owned(),
        ]
        .join("\n"),
    );
    write(&shar, "cuts.000001.jsonl", &cut("far", "hello"));
    let (c, entries) = compile(tmp.path(), &[arg(&shar)], &[]);
    assert_eq!(c.len(), 1);
    assert_eq!(c.text(0).unwrap().1, "hello world");
    let dropped: Vec<(&str, &str)> = entries
        .iter()
        .filter(|l| l["kind"] == "dropped")
        .map(|l| (l["reason"].as_str().unwrap(), l["detail"].as_str().unwrap()))
        .collect();
    let reasons: Vec<&str> = dropped.iter().map(|d| d.0).collect();
    assert_eq!(
        reasons,
        [
            "missing_member",
            "missing_member",
            "unsupported_audio",
            "malformed_line",
            "malformed_line",
            "missing_file"
        ],
        "{dropped:?}"
    );
    assert!(dropped[0].1.contains(".nodata placeholder") && dropped[0].1.contains("\"gone\""));
    assert!(dropped[1].1.contains("no member for cut \"absent\""), "{}", dropped[1].1);
    assert!(dropped[4].1.contains("\"orphan.flac\" belongs to no cut"), "{}", dropped[4].1);
    assert!(dropped[5].1.contains("recording.000001.tar is missing"), "{}", dropped[5].1);
}
