//! `asrc inspect` and `asrc dump` on a corpus written here.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use asr_corpus::synth::SynthSpec;
use asr_corpus::{Corpus, CorpusWriter, WriterOptions};

use crate::asrc;

fn corpus(dir: &std::path::Path, n: u64) -> std::path::PathBuf {
    let spec = SynthSpec { min_samples: 800, max_samples: 90_000, ..SynthSpec::default() };
    let path = dir.join("c.asrcorpus");
    let mut o = WriterOptions::new(spec.vocab_size, "none", Vec::new());
    o.text_block_size = 7;
    let mut w = CorpusWriter::create(&path, o).unwrap();
    for i in 0..n {
        w.push(&spec.utterance(i).as_input()).unwrap();
    }
    w.finish().unwrap();
    path
}

#[test]
fn inspect_reports_what_the_arrays_hold() {
    let dir = tempfile::tempdir().unwrap();
    let path = corpus(dir.path(), 120);
    let c = Corpus::open(&path).unwrap();
    let out = asrc(&["inspect", "--json", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["utterances"], 120);
    let secs: f64 = (0..c.len()).map(|i| c.duration_seconds(i)).sum();
    assert!((v["hours"].as_f64().unwrap() - secs / 3600.0).abs() < 1e-9);
    let langs = v["languages"].as_array().unwrap();
    assert_eq!(langs.iter().map(|l| l["utterances"].as_u64().unwrap()).sum::<u64>(), 120);
    let bins = v["durations"].as_array().unwrap();
    assert_eq!(bins.iter().map(|b| b["utterances"].as_u64().unwrap()).sum::<u64>(), 120);
    let over5 = (0..c.len()).filter(|&i| c.duration_seconds(i) >= 5.0).count() as u64;
    let over5_bins: u64 = bins[4..].iter().map(|b| b["utterances"].as_u64().unwrap()).sum();
    assert_eq!(over5_bins, over5, "bins from [5, 8) up");
    let mut counts: Vec<u64> = (0..c.len()).map(|i| c.tokens(i).len() as u64).collect();
    counts.sort_unstable();
    assert_eq!(v["tokens"]["max"], *counts.last().unwrap());
    assert_eq!(v["tokens"]["total"], counts.iter().sum::<u64>());
    let text = asrc(&["inspect", path.to_str().unwrap()]);
    let s = String::from_utf8_lossy(&text.stdout);
    assert!(
        s.contains("120 utterances") && s.contains("duration (s)") && s.contains("tokens:"),
        "{s}"
    );
}

#[test]
fn dump_prints_every_utterance_and_writes_wav_files_sox_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = corpus(dir.path(), 30);
    let c = Corpus::open(&path).unwrap();
    let out = asrc(&["dump", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 30);
    for (i, l) in lines.iter().enumerate() {
        let (id, text) = c.text(i).unwrap();
        assert_eq!(l["index"], i);
        assert_eq!(l["segment_id"], id.as_str());
        assert_eq!(l["text"], text.as_str());
        assert_eq!(l["lang"], c.language_code(i));
        assert_eq!(l["samples"], c.num_samples()[i]);
        let toks: Vec<u32> =
            l["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        assert_eq!(toks, c.tokens(i).to_vec());
    }

    // Missing directories are created.
    let pcm_dir = dir.path().join("pcm/of/ten");
    let out = asrc(&[
        "dump",
        path.to_str().unwrap(),
        "--start",
        "10",
        "--limit",
        "3",
        "--pcm-dir",
        pcm_dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.iter().map(|l| l["index"].as_u64().unwrap()).collect::<Vec<_>>(),
        [10, 11, 12]
    );
    for l in &lines {
        let i = l["index"].as_u64().unwrap() as usize;
        let wav = l["pcm"].as_str().unwrap();
        // sox, the reference tool, reads the file back to the corpus's samples.
        let raw = Command::new("sox")
            .args([wav, "-t", "raw", "-e", "signed", "-b", "16", "-"])
            .output()
            .unwrap();
        assert!(raw.status.success());
        let samples: Vec<i16> =
            raw.stdout.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect();
        assert_eq!(samples, c.pcm(i));
        let rate = Command::new("soxi").args(["-r", wav]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&rate.stdout).trim(), "16000");
        // Named as --help says: the index zero-padded to 8 digits.
        assert_eq!(std::path::Path::new(wav), pcm_dir.join(format!("{i:08}.wav")));
    }
    let help = String::from_utf8(asrc(&["dump", "--help"]).stdout).unwrap();
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("zero-padded to 8 digits: DIR/00000042.wav for utterance 42"), "{help}");
}

#[test]
fn dump_into_a_directory_that_cannot_be_made_names_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = corpus(dir.path(), 3);
    let pcm_dir = dir.path().join("c.asrcorpus/wav");
    let out = asrc(&["dump", path.to_str().unwrap(), "--pcm-dir", pcm_dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches(pcm_dir.to_str().unwrap()).count(), 1, "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn dump_into_a_closed_pipe_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let path = corpus(dir.path(), 400);
    let mut child = Command::new(env!("CARGO_BIN_EXE_asrc"))
        .args(["dump", path.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.contains("\"index\":0"));
    // The reader is gone (stdout dropped above); the dump must stop quietly.
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
