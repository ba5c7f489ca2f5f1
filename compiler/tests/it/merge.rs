//! `asrc compile --part I/N` and `asrc merge`: the parts of the bundled example (whose rows
//! include a duplicate row, a reused segment id and duplicate audio) merge into the very bytes
//! one compile writes, for several part counts; missing, overlapping and foreign parts are
//! refused with nothing written.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{asrc, example, refused};

fn compile(out: &Path, extra: &[&str]) {
    let mut args = vec![
        "compile".to_owned(),
        example("manifest.parquet"),
        "--tokenizer".into(),
        example("spm.model"),
        "-o".into(),
        out.display().to_string(),
        "--quiet".into(),
        "--max-reject-fraction".into(),
        "1".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = asrc(&refs);
    assert!(o.status.success(), "{:?}: {}", extra, String::from_utf8_lossy(&o.stderr));
}

fn parts(dir: &Path, n: u32) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("p{i}of{n}.asrcorpus"));
            compile(&p, &["--part", &format!("{i}/{n}")]);
            p
        })
        .collect()
}

fn merge(parts: &[PathBuf], out: &Path) -> std::process::Output {
    let mut args = vec!["merge".to_owned()];
    args.extend(parts.iter().rev().map(|p| p.display().to_string())); // any order
    args.extend(["-o".to_owned(), out.display().to_string()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    asrc(&refs)
}

#[test]
fn merged_parts_are_the_single_compile_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole.asrcorpus");
    compile(&whole, &[]);
    let want = std::fs::read(&whole).unwrap();
    // 43 rows: 43 parts puts every duplicate in another part than its first occurrence.
    for n in [1u32, 2, 3, 7, 43] {
        let ps = parts(dir.path(), n);
        let out = dir.path().join(format!("merged{n}.asrcorpus"));
        let o = merge(&ps, &out);
        assert!(o.status.success(), "{n} parts: {}", String::from_utf8_lossy(&o.stderr));
        assert!(std::fs::read(&out).unwrap() == want, "{n} parts: the merged corpus differs");
        same_report(&whole, &out, n);
    }
}

/// The merged report counts what one compile's does, and lists the same rows for the same
/// reasons.
fn same_report(whole: &Path, merged: &Path, n: u32) {
    let read =
        |p: &Path, ext: &str| std::fs::read_to_string(format!("{}{ext}", p.display())).unwrap();
    let a: Value = serde_json::from_str(&read(whole, ".report.json")).unwrap();
    let b: Value = serde_json::from_str(&read(merged, ".report.json")).unwrap();
    for key in [
        "rows",
        "kept",
        "dropped",
        "retagged",
        "truncated",
        "dropped_by_reason",
        "flagged_by_reason",
        "retags",
        "retags_by_method",
    ] {
        assert_eq!(a[key], b[key], "{n} parts: {key}");
    }
    for key in ["hours_before", "hours_after"] {
        let (x, y) = (a[key].as_object().unwrap(), b[key].as_object().unwrap());
        assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>(), "{n} parts: {key}");
        for (k, v) in x {
            let d = v.as_f64().unwrap() - y[k].as_f64().unwrap();
            assert!(d.abs() < 1e-9, "{n} parts: {key}.{k}: {v} vs {}", y[k]);
        }
    }
    let d = a["decoded_hours"].as_f64().unwrap() - b["decoded_hours"].as_f64().unwrap();
    assert!(d.abs() < 1e-9, "{n} parts: decoded_hours");
    let entries = |p: &Path| {
        let mut v: Vec<(String, String)> = read(p, ".report.jsonl")
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|e| (e["segment_id"].to_string(), e["reason"].to_string()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(entries(whole), entries(merged), "{n} parts: report entries");
}

#[test]
fn missing_overlapping_and_foreign_parts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ps = parts(dir.path(), 3);
    let out = dir.path().join("out.asrcorpus");
    let o = merge(&ps[..2], &out);
    refused(&o, "missing part(s) 2/3");
    let o = merge(&[ps[0].clone(), ps[1].clone(), ps[1].clone(), ps[2].clone()], &out);
    refused(&o, "are both part 1/3");
    // A part of another compile (other parameters).
    let other = dir.path().join("other.asrcorpus");
    compile(&other, &["--part", "2/3", "--max-tokens", "7"]);
    let o = merge(&[ps[0].clone(), ps[1].clone(), other.clone()], &out);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("compile parameters") && err.contains("other.asrcorpus"), "{err}");
    // A whole corpus is not a part.
    let whole = dir.path().join("whole.asrcorpus");
    compile(&whole, &[]);
    let o = merge(&[whole], &out);
    refused(&o, "is not a part");
    assert!(!out.exists());
    // --part out of range.
    let o = asrc(&[
        "compile",
        &example("manifest.parquet"),
        "--tokenizer",
        &example("spm.model"),
        "-o",
        out.to_str().unwrap(),
        "--part",
        "3/3",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!out.exists());
}
