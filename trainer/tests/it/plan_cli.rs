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
    let _turn = crate::serial();
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
    let _turn = crate::serial();
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
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let path = corpus(dir.path(), 20);
    let p = path.to_str().unwrap();
    let out = asrt(&["plan", p, "--rank", "3", "--batches"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rank 3 is outside --world-size 1"));
    let out = asrt(&["plan", "/nonexistent.asrcorpus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.asrcorpus"));
    let out = asrt(&["plan", p, "--world-size", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn plan_of_a_training_set_reports_corpora_and_sources_and_lists_pairs() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let write = |name: &str, languages: &[&str], sources: &[&str], n: u64, seed: u64, model| {
        let spec = SynthSpec {
            seed,
            languages: languages.iter().map(|s| s.to_string()).collect(),
            sources: sources.iter().map(|s| s.to_string()).collect(),
            min_samples: 8_000,
            max_samples: 160_000,
            ..SynthSpec::default()
        };
        spec.write_corpus(&d.join(name), n, model).unwrap();
        d.join(name)
    };
    let a = write("a.asrcorpus", &["en", "hi"], &["read", "conv"], 300, 1, b"m".as_slice());
    let b = write("b.asrcorpus", &["hi", "ta"], &["podcast"], 100, 2, b"m".as_slice());
    let (pa, pb) = (a.to_str().unwrap(), b.to_str().unwrap());
    let out = asrt(&["plan", pa, pb, "--json", "--source-temperature", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["utterances"], 400);
    let corpora = r["corpora"].as_array().unwrap();
    assert_eq!(corpora.len(), 2);
    assert_eq!(
        (corpora[0]["name"].as_str(), corpora[0]["utterances"].as_u64()),
        (Some(pa), Some(300))
    );
    let sum = |rows: &serde_json::Value, key: &str| -> f64 {
        rows.as_array().unwrap().iter().map(|x| x[key].as_f64().unwrap()).sum()
    };
    for rows in [&r["corpora"], &r["sources"], &r["languages"]] {
        assert!((sum(rows, "target_share") - 1.0).abs() < 1e-9, "{rows}");
        assert!((sum(rows, "epoch_share") - 1.0).abs() < 1e-9, "{rows}");
    }
    // Every source of both corpora has its row.
    let sources: Vec<&str> =
        r["sources"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(sources.len(), 3, "{sources:?}");

    let out = asrt(&["plan", pa, pb, "--batches"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut corpora_seen = std::collections::BTreeSet::new();
    for mb in v["micro_batches"].as_array().unwrap() {
        for pair in mb.as_array().unwrap() {
            let (c, i) = (pair[0].as_u64().unwrap(), pair[1].as_u64().unwrap());
            assert!(i < [300, 100][c as usize]);
            corpora_seen.insert(c);
        }
    }
    assert_eq!(corpora_seen.len(), 2);

    // The config's [[data]]: paths relative to the file, weights and overrides.
    let cfg = d.join("train.toml");
    std::fs::write(
        &cfg,
        "[[data]]\npath = \"a.asrcorpus\"\n[[data]]\npath = \"b.asrcorpus\"\nweight = 4.0\n\
         language = \"xx\"\n",
    )
    .unwrap();
    let out = asrt(&["plan", "--config", cfg.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let langs: Vec<&str> = r["languages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["language"].as_str().unwrap())
        .collect();
    assert!(langs.contains(&"xx") && !langs.contains(&"ta"), "{langs:?}");
    let b_row = &r["corpora"][1];
    assert!(b_row["target_share"].as_f64() > b_row["corpus_share"].as_f64(), "{b_row}");
    // Corpora on both the command line and in the config: refused.
    let out = asrt(&["plan", pa, "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("both on the command line"));

    // Another tokenizer: refused, both files named.
    let other = write("other.asrcorpus", &["en"], &["read"], 50, 3, b"another model".as_slice());
    let out = asrt(&["plan", pa, other.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains(pa) && e.contains("other.asrcorpus"), "{e}");
    let out = asrt(&["plan"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no training corpus"));
}

/// The GPU kit carries `asrt-bench` alone and starts it as `asrt` through a link
/// (scripts/gpu/bundle.sh, run.sh): so started it must be `asrt`, in its output, its errors and
/// its exit codes; under its own name it stays the benchmarks.
#[test]
fn asrt_bench_started_as_asrt_is_asrt() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let path = corpus(dir.path(), 60);
    let p = path.to_str().unwrap();
    let link = dir.path().join("asrt");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_asrt-bench"), &link).unwrap();
    let missing = dir.path().join("missing.asrcorpus");
    let cases: [&[&str]; 5] = [
        &["plan", p, "--max-batch-seconds", "30", "--json"],
        &["plan", missing.to_str().unwrap()],
        &["train", p, "--devices", "cuda:0,cuda:0"],
        &["plan", "--help"],
        &["--version"],
    ];
    let mut codes = Vec::new();
    for args in cases {
        let real = asrt(args);
        codes.push(real.status.code());
        let linked = Command::new(&link).args(args).output().unwrap();
        assert_eq!(linked.status.code(), real.status.code(), "asrt {args:?}");
        assert_eq!(
            String::from_utf8_lossy(&linked.stdout),
            String::from_utf8_lossy(&real.stdout),
            "asrt {args:?}"
        );
        assert_eq!(
            String::from_utf8_lossy(&linked.stderr),
            String::from_utf8_lossy(&real.stderr),
            "asrt {args:?}"
        );
    }
    // The cases cover a success, a refusal and a usage error (exit 0, 2 and 2).
    assert_eq!(codes[0], Some(0));
    assert_eq!(codes[1], Some(2));
    let bench = Command::new(env!("CARGO_BIN_EXE_asrt-bench")).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&bench.stdout).contains("tdt-check"));
}
