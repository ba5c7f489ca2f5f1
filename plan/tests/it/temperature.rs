//! `sampler.mode = "temperature"`: the epoch realises the temperature's target shares, draws
//! within a language without replacement until it is exhausted, and packs exactly the draws.

use std::collections::BTreeMap;

use asr_plan::{epoch_draws, target_shares, Durations, EpochPlan, SamplerConfig, SamplerMode};

use crate::synthetic;

fn config(temperature: f64, seed: u64) -> SamplerConfig {
    SamplerConfig {
        mode: SamplerMode::Temperature,
        temperature,
        max_batch_seconds: 60.0,
        seed,
        ..SamplerConfig::default()
    }
}

/// Utterance -> uses over the whole plan (one rank, no accumulation: every batch is used).
fn uses(plan: &EpochPlan) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    for b in 0..plan.len() as u32 {
        for &u in plan.batch(b) {
            *m.entry(u).or_default() += 1;
        }
    }
    m
}

#[test]
fn the_epoch_realises_the_target_shares() {
    // Zipf-distributed languages: the largest has many times the smallest's utterances.
    let (d, l) = synthetic(30_000, 12, 3, 5.0);
    for temperature in [0.0, 0.3, 0.7, 1.0] {
        let cfg = config(temperature, 11);
        let plan = EpochPlan::build(Durations::Seconds(&d), &l, &cfg, 0, 1, 1).unwrap();
        let used = uses(&plan);
        let total: u64 = used.values().sum();
        assert_eq!(total, l.len() as u64, "an epoch keeps the corpus's utterance count");
        let mut per_lang = vec![0u64; 1 << 16];
        for (&u, &c) in &used {
            per_lang[l[u as usize] as usize] += c;
        }
        let (targets, counts) = target_shares(&l, temperature);
        for lang in 0..(1usize << 16) {
            if counts[lang] == 0 {
                continue;
            }
            let want = targets[lang] * total as f64;
            // Largest remainders: every quota within one draw of its exact share.
            assert!(
                (per_lang[lang] as f64 - want).abs() < 1.0,
                "T={temperature}, language {lang}: {} draws, target {want:.1} ({} utterances)",
                per_lang[lang],
                counts[lang]
            );
        }
        // The corpus is imbalanced, so below T=1 the mix moves away from the corpus's.
        let largest = (0..1usize << 16).max_by_key(|&x| counts[x]).unwrap();
        if temperature < 1.0 {
            assert!(per_lang[largest] < counts[largest], "T={temperature}: not downsampled");
        } else {
            assert_eq!(per_lang[largest], counts[largest]);
        }
    }
}

#[test]
fn a_language_is_drawn_without_replacement_until_exhausted() {
    let (d, l) = synthetic(20_000, 12, 8, 5.0);
    let cfg = config(0.0, 5); // every language the same share: small ones upsampled
    let (_, counts) = target_shares(&l, 0.0);
    let smallest = (0..1usize << 16).filter(|&x| counts[x] > 0).min_by_key(|&x| counts[x]).unwrap();
    let largest = (0..1usize << 16).max_by_key(|&x| counts[x]).unwrap();
    let plan = EpochPlan::build(Durations::Seconds(&d), &l, &cfg, 0, 1, 1).unwrap();
    let used = uses(&plan);
    // Upsampled: every utterance of the smallest language is used, as evenly as possible.
    let small: Vec<u64> = (0..l.len() as u32)
        .filter(|&u| l[u as usize] as usize == smallest)
        .map(|u| used.get(&u).copied().unwrap_or(0))
        .collect();
    let (lo, hi) = (small.iter().min().unwrap(), small.iter().max().unwrap());
    assert!(*lo >= 1 && hi - lo <= 1, "smallest language uses {lo}..{hi}");
    assert!(*hi > 1, "the smallest language should be upsampled");
    // Downsampled: the largest language's consecutive epochs use disjoint utterances until its
    // utterances run out.
    let quota = 20_000 / counts.iter().filter(|&&c| c > 0).count() as u64;
    let epochs = counts[largest] / quota.max(1);
    assert!(epochs >= 2, "the test needs a language that lasts several epochs");
    let mut seen = std::collections::HashSet::new();
    for e in 0..epochs {
        for u in epoch_draws(&l, &cfg, e).unwrap() {
            if l[u as usize] as usize == largest {
                assert!(seen.insert(u), "epoch {e} repeats utterance {u} before exhaustion");
            }
        }
    }
}

#[test]
fn the_plan_packs_exactly_the_epoch_draws_and_is_a_pure_function() {
    let (d, l) = synthetic(5_000, 6, 4, 5.0);
    let cfg = config(0.3, 9);
    for epoch in [0u64, 1, 7] {
        let plan = EpochPlan::build(Durations::Seconds(&d), &l, &cfg, epoch, 1, 1).unwrap();
        let mut packed: Vec<u32> =
            (0..plan.len() as u32).flat_map(|b| plan.batch(b).to_vec()).collect();
        let mut draws = epoch_draws(&l, &cfg, epoch).unwrap();
        packed.sort_unstable();
        draws.sort_unstable();
        assert_eq!(packed, draws, "epoch {epoch}");
        let again = EpochPlan::build(Durations::Seconds(&d), &l, &cfg, epoch, 1, 1).unwrap();
        for b in 0..plan.len() as u32 {
            assert_eq!(plan.batch(b), again.batch(b));
        }
    }
    assert_ne!(epoch_draws(&l, &cfg, 0).unwrap(), epoch_draws(&l, &cfg, 1).unwrap());
}

#[test]
fn configs_saved_before_modes_existed_read_as_seed_mode() {
    let mut json = serde_json::to_value(SamplerConfig::default()).unwrap();
    json.as_object_mut().unwrap().remove("mode");
    let old: SamplerConfig = serde_json::from_value(json).unwrap();
    assert_eq!(old.mode, SamplerMode::Seed);
    assert_eq!(SamplerConfig::default().mode, SamplerMode::Temperature);
}
