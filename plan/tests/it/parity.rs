//! The planner gives, batch for batch, the plans of the Python sampler it replaces
//! (bench/python_sampler.py), run by CPython on the same arrays.

use std::path::Path;
use std::process::Command;

use asr_plan::{Durations, EpochPlan, SamplerConfig, SamplerMode};

use crate::synthetic;

fn python_plan(dir: &Path, d: &[f64], l: &[u16], args: &[String]) -> Vec<Vec<Vec<u32>>> {
    let dur_path = dir.join("d.f64");
    let lang_path = dir.join("l.u16");
    std::fs::write(&dur_path, d.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    std::fs::write(&lang_path, l.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
        .unwrap();
    let script = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("run through cargo test"),
    )
    .join("../bench/python_sampler.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&dur_path)
        .arg(&lang_path)
        .arg("--all-ranks")
        .args(args)
        .output()
        .expect("python3 is needed (bash scripts/setup.sh)");
    assert!(
        out.status.success(),
        "python sampler failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn plans_equal_the_python_samplers() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(usize, u16, u64, u32, u32, u64, f64, f64, &str); 6] = [
        // (utterances, languages, data seed, world, accum, epoch, temperature, max seconds, boundaries)
        (3000, 12, 1, 1, 4, 0, 0.3, 90.0, "3,5,8,12,16"),
        (3000, 12, 2, 8, 4, 3, 0.3, 90.0, "3,5,8,12,16"),
        (2500, 5, 3, 3, 1, 1, 0.0, 60.0, "3,5,8,12,16"),
        (2000, 3, 4, 2, 2, 7, 1.0, 30.0, "2,10"),
        (1500, 1, 5, 4, 4, 0, 0.5, 45.0, "4,8"),
        (800, 20, 6, 5, 3, 2, 0.3, 25.0, "3,5,8,12,16"),
    ];
    for (n, langs, data_seed, world, accum, epoch, temperature, max_secs, bounds) in cases {
        let (mut d, l) = synthetic(n, langs, data_seed, 5.0);
        // Exact boundary values must go to the higher bucket, as bisect_right does.
        d[0] = 3.0;
        d[1] = 5.0;
        let seed = 17 + data_seed;
        let config = SamplerConfig {
            mode: SamplerMode::Seed,
            boundaries: bounds.split(',').map(|x| x.parse().unwrap()).collect(),
            temperature,
            max_batch_seconds: max_secs,
            seed,
            curriculum_steps: 0,
            source_temperature: None,
        };
        let plan =
            EpochPlan::build(Durations::Seconds(&d), &l, &config, epoch, world, accum).unwrap();
        let args: Vec<String> = [
            ("--world-size", world.to_string()),
            ("--grad-accum", accum.to_string()),
            ("--epoch", epoch.to_string()),
            ("--seed", seed.to_string()),
            ("--temperature", temperature.to_string()),
            ("--max-dur", max_secs.to_string()),
            ("--boundaries", bounds.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .collect();
        let python = python_plan(dir.path(), &d, &l, &args);
        assert_eq!(python.len(), world as usize);
        for (rank, expected) in python.iter().enumerate() {
            let ours: Vec<Vec<u32>> = plan
                .rank_batches(rank as u32, 0)
                .into_iter()
                .map(|b| plan.batch(b).to_vec())
                .collect();
            assert!(!ours.is_empty());
            assert_eq!(
                &ours, expected,
                "rank {rank} differs (n={n}, world={world}, accum={accum})"
            );
        }
    }
}
