//! Keeps ARCHITECTURE.md's sentences about the direction of dependencies true (rust-analyzer's
//! `xtask/src/tidy.rs` is the model): the trainer's layers are read from ARCHITECTURE.md itself,
//! and every `crate::` path in the trainer's sources is checked against them; the planner and the
//! loss library are checked through their manifests, their sources and `cargo tree`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("..")
}

/// The trainer's layers, top to bottom, from ARCHITECTURE.md's line
/// "Layers, top to bottom: `a`, `b` > `c` > ...".
fn layers() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    let line = doc
        .lines()
        .find_map(|l| l.trim().strip_prefix("Layers, top to bottom:"))
        .expect("ARCHITECTURE.md names the trainer's layers (\"Layers, top to bottom: ...\")");
    line.trim_end_matches('.')
        .split('>')
        .map(|layer| {
            layer
                .split(',')
                .map(|m| m.trim().trim_matches('`').to_owned())
                .filter(|m| !m.is_empty())
                .collect()
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules a source file names through `crate::` (comments left out), with the
/// line of the first use.
fn crate_imports(text: &str) -> BTreeMap<String, usize> {
    let mut found = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                group[..end].split(',').map(|s| s.trim().split("::").next().unwrap_or("")).collect()
            } else {
                vec![rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("")]
            };
            for name in names.into_iter().filter(|s| !s.is_empty()) {
                found.entry(name.to_owned()).or_insert(n + 1);
            }
        }
    }
    found
}

/// The module of the trainer a file belongs to (`src/train/run.rs` -> `train`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_owned()
}

/// Violations of the layering in the trainer's sources: a module importing one of a higher
/// layer. Same-layer imports are allowed.
fn violations(src: &Path, layers: &[Vec<String>]) -> Vec<String> {
    let rank: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.iter().map(move |m| (m.as_str(), i)))
        .collect();
    let mut files = Vec::new();
    sources(src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    for f in files {
        let module = module_of(src, &f);
        // The crate root and the binaries sit above everything.
        if matches!(module.as_str(), "lib" | "main" | "bin") {
            continue;
        }
        let Some(&mine) = rank.get(module.as_str()) else {
            bad.push(format!(
                "{}: module `{module}` is in no layer of ARCHITECTURE.md",
                f.display()
            ));
            continue;
        };
        for (used, line) in crate_imports(&std::fs::read_to_string(&f).unwrap()) {
            if used == module {
                continue;
            }
            match rank.get(used.as_str()) {
                Some(&theirs) if theirs < mine => bad.push(format!(
                    "{}:{line}: `{module}` imports `{used}`, a higher layer",
                    f.display()
                )),
                Some(_) => {}
                None => bad.push(format!(
                    "{}:{line}: `{used}` is in no layer of ARCHITECTURE.md",
                    f.display()
                )),
            }
        }
    }
    bad
}

#[test]
fn the_trainer_s_modules_import_only_their_own_layer_and_those_below() {
    let _turn = crate::serial();
    let layers = layers();
    assert!(layers.len() >= 5, "{layers:?}");
    let bad = violations(&workspace().join("trainer/src"), &layers);
    assert!(bad.is_empty(), "dependencies that point up:\n{}", bad.join("\n"));
}

#[test]
fn the_layer_check_finds_a_model_that_imports_the_run_s_config() {
    let _turn = crate::serial();
    // The check itself, on a tree with the violation the rule exists for.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("model")).unwrap();
    std::fs::write(dir.path().join("config.rs"), "use crate::model::ModelConfig;\n").unwrap();
    std::fs::write(
        dir.path().join("model/mod.rs"),
        "// crate::config in a comment is fine\nuse crate::{config::TrainConfig, model::x};\n",
    )
    .unwrap();
    let layers = vec![vec!["config".to_owned()], vec!["model".to_owned()]];
    let bad = violations(dir.path(), &layers);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].contains("model/mod.rs:2: `model` imports `config`"), "{bad:?}");
}

#[test]
fn the_planner_and_the_loss_library_know_nothing_of_the_trainer() {
    let _turn = crate::serial();
    let root = workspace();
    for (krate, forbidden) in [
        ("plan", &["asr_trainer", "asr_tdt", "burn", "TrainConfig"][..]),
        ("tdt", &["asr_trainer", "TrainConfig", "ModelConfig"][..]),
    ] {
        let mut files = Vec::new();
        sources(&root.join(krate).join("src"), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for word in forbidden {
                assert!(!text.contains(word), "{} names {word}", f.display());
            }
        }
    }
    // The planner's whole dependency tree is free of Burn (`asrt plan`'s work builds without it).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "-p", "asr-plan", "-e", "normal", "--prefix", "none"])
        .current_dir(&root)
        .output()
        .expect("cargo runs");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().any(|l| l.starts_with("asr-plan ")), "{tree}");
    let burn: Vec<&str> =
        tree.lines().filter(|l| l.starts_with("burn") || l.starts_with("cubecl")).collect();
    assert!(burn.is_empty(), "asr-plan depends on {burn:?}");
}
