//! `asrt plan` on a corpus file: report fields, --batches output, errors.

use std::process::Command;

use asr_corpus::synth::SynthSpec;
use asr_corpus::{CorpusWriter, WriterOptions};

fn corpus(dir: &std::path::Path, n: u64) -> std::path::PathBuf {
    let spec = SynthSpec { min_samples: 8_000, max_samples: 160_000, ..SynthSpec::default() };
    let path = dir.join("c.asrcorpus");
    let mut w =
        CorpusWriter::create(&path, WriterOptions::new(spec.vocab_size, "none", Vec::new()))
            .unwrap();
    for i in 0..n {
        w.push(&spec.utterance(i).as_input()).unwrap();
    }
    w.finish().unwrap();
    path
}

fn asrt(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_asrt")).args(args).output().unwrap()
}

#[test]
fn plan_reports_and_lists_batches() {
    let dir = tempfile::tempdir().unwrap();
    let path = corpus(dir.path(), 400);
    let p = path.to_str().unwrap();
    let out = asrt(&[
        "plan",
        p,
        "--world-size",
        "2",
        "--grad-accum",
        "2",
        "--max-batch-seconds",
        "30",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["utterances"], 400);
    assert_eq!(r["world_size"], 2);
    let steps = r["steps"].as_u64().unwrap();
    assert!(steps > 0);
    let bucket_utts: u64 =
        r["buckets"].as_array().unwrap().iter().map(|b| b["utterances"].as_u64().unwrap()).sum();
    assert_eq!(bucket_utts + r["dropped_utterances"].as_u64().unwrap(), 400);
    let share: f64 = r["languages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["target_share"].as_f64().unwrap())
        .sum();
    assert!((share - 1.0).abs() < 1e-9);
    assert!(r["imbalance_worst"].as_f64().unwrap() >= 1.0);
    let pad = r["audio_padding_fraction"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&pad));

    let mut listed = 0;
    for rank in ["0", "1"] {
        let out = asrt(&[
            "plan",
            p,
            "--world-size",
            "2",
            "--grad-accum",
            "2",
            "--max-batch-seconds",
            "30",
            "--rank",
            rank,
            "--batches",
        ]);
        assert!(out.status.success());
        let b: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mbs = b["micro_batches"].as_array().unwrap();
        assert_eq!(mbs.len() as u64, steps * 2);
        listed += mbs.iter().map(|m| m.as_array().unwrap().len()).sum::<usize>();
    }
    assert_eq!(listed as u64, bucket_utts);

    let text = asrt(&["plan", p]);
    assert!(text.status.success());
    let s = String::from_utf8_lossy(&text.stdout);
    assert!(s.contains("optimizer steps") && s.contains("rank imbalance"), "{s}");
}

#[test]
fn empty_corpus_plans_to_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = corpus(dir.path(), 0);
    let out = asrt(&["plan", path.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((r["steps"].as_u64(), r["hours"].as_f64()), (Some(0), Some(0.0)));
    let text =
        String::from_utf8_lossy(&asrt(&["plan", path.to_str().unwrap()]).stdout).into_owned();
    assert!(text.contains("0 utterances, 0.00 h"), "{text}");
}

#[test]
fn plan_errors_exit_2_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = corpus(dir.path(), 20);
    let p = path.to_str().unwrap();
    let out = asrt(&["plan", p, "--rank", "3", "--batches"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rank 3 is outside --world-size 1"));
    let out = asrt(&["plan", "/nonexistent.asrcorpus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("opening corpus /nonexistent.asrcorpus"));
    let out = asrt(&["plan", p, "--world-size", "0"]);
    assert_eq!(out.status.code(), Some(2));
}
