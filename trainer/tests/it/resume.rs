//! Exact resume: the state after step k reproduces the uninterrupted run; a resume on another
//! world size re-deals the rest of the epoch with no utterance repeated or skipped (in
//! `temperature` mode: each utterance used exactly as often as the uninterrupted epoch uses it).

use std::collections::BTreeMap;

use asr_trainer::{Durations, EpochPlan, SamplerConfig, SamplerMode, IDLE};
use proptest::prelude::*;

use crate::synthetic;

fn config(seed: u64, curriculum_steps: u64) -> SamplerConfig {
    // Both modes: the seed's parity with Python, the temperature mode's quotas.
    let mode = if seed.is_multiple_of(2) { SamplerMode::Seed } else { SamplerMode::Temperature };
    SamplerConfig {
        mode,
        max_batch_seconds: 40.0,
        seed,
        curriculum_steps,
        ..SamplerConfig::default()
    }
}

/// Utterance -> times seen, over steps `from..to` of every rank.
fn seen(plan: &EpochPlan, from: u64, to: u64, counts: &mut BTreeMap<u32, u32>) {
    for step in from..to {
        let world = plan.layout_at(step).unwrap().world_size;
        for rank in 0..world {
            for &b in plan.step_batches(step, rank) {
                if b != IDLE {
                    for &u in plan.batch(b) {
                        *counts.entry(u).or_default() += 1;
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn same_world_resume_is_exact(
        n in 50usize..1500, data_seed in 0u64..1000, world in 1u32..9, accum in 1u32..5,
        epoch in 0u64..5, cut in 0.0f64..1.0, curriculum in 0u64..4,
    ) {
        let (d, l) = synthetic(n, 6, data_seed, 5.0);
        let cfg = config(data_seed, curriculum);
        let plan = EpochPlan::build(Durations::Seconds(&d), &l, &cfg, epoch, world, accum).unwrap();
        let k = (plan.steps() as f64 * cut) as u64;
        let state = plan.state(k);
        // The state is tiny and survives a JSON round trip (it goes into checkpoints).
        let json = serde_json::to_string(&state).unwrap();
        prop_assert!(json.len() < 200);
        let state = serde_json::from_str(&json).unwrap();
        let resumed = EpochPlan::restore(Durations::Seconds(&d), &l, &cfg, &state).unwrap();
        for step in k..plan.steps() {
            for rank in 0..world {
                let a: Vec<&[u32]> = plan.step_batches(step, rank).iter().map(|&b| plan.batch(b)).collect();
                let b: Vec<&[u32]> = resumed.step_batches(step, rank).iter().map(|&b| resumed.batch(b)).collect();
                prop_assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn resume_on_another_world_size_repeats_and_skips_nothing(
        n in 50usize..1500, data_seed in 0u64..1000, w0 in 1u32..9, g0 in 1u32..5,
        w1 in 1u32..9, g1 in 1u32..5, w2 in 1u32..9, cut1 in 0.0f64..1.0, cut2 in 0.0f64..1.0,
    ) {
        let (d, l) = synthetic(n, 6, data_seed, 5.0);
        let cfg = config(data_seed, 0);
        let uninterrupted = EpochPlan::build(Durations::Seconds(&d), &l, &cfg, 0, w0, g0).unwrap();
        let mut expected = BTreeMap::new();
        seen(&uninterrupted, 0, uninterrupted.steps(), &mut expected);

        let mut plan = uninterrupted.clone();
        let k1 = (plan.steps() as f64 * cut1) as u64;
        plan.redeal(k1, w1, g1).unwrap();
        let k2 = k1 + ((plan.steps() - k1) as f64 * cut2) as u64;
        plan.redeal(k2, w2, 1).unwrap();
        let mut got = BTreeMap::new();
        seen(&plan, 0, plan.steps(), &mut got);
        prop_assert_eq!(&got, &expected, "utterances seen differ after re-deals");
        if cfg.mode == SamplerMode::Seed {
            prop_assert!(got.values().all(|&c| c == 1));
        }

        // Ranks are balanced within one batch after a re-deal.
        let last = plan.layout_at(k2);
        if let Some(seg) = last {
            let per_rank: Vec<usize> = (0..seg.world_size)
                .map(|r| plan.rank_batches(r, k2).iter().filter(|&&b| b != IDLE).count())
                .collect();
            let (lo, hi) = (per_rank.iter().min().unwrap(), per_rank.iter().max().unwrap());
            prop_assert!(hi - lo <= 1, "{per_rank:?}");
        }

        // And the saved state rebuilds exactly this plan.
        let state = plan.state(k2);
        prop_assert_eq!(state.segments.len(), 3);
        let restored = EpochPlan::restore(Durations::Seconds(&d), &l, &cfg, &state).unwrap();
        prop_assert_eq!(restored.steps(), plan.steps());
        for step in 0..plan.steps() {
            let world = plan.layout_at(step).unwrap().world_size;
            for rank in 0..world {
                prop_assert_eq!(plan.step_batches(step, rank), restored.step_batches(step, rank));
            }
        }
    }
}

#[test]
fn every_utterance_is_packed_once_and_batches_respect_the_cap() {
    let _turn = crate::serial();
    let (d, l) = synthetic(20_000, 12, 5, 5.0);
    let cfg = SamplerConfig {
        mode: SamplerMode::Seed,
        max_batch_seconds: 90.0,
        ..SamplerConfig::default()
    };
    let plan = EpochPlan::build(Durations::Seconds(&d), &l, &cfg, 0, 1, 1).unwrap();
    let mut all: Vec<u32> = (0..plan.len() as u32).flat_map(|b| plan.batch(b).to_vec()).collect();
    all.sort_unstable();
    assert_eq!(all, (0..20_000).collect::<Vec<u32>>());
    let mut last_cost = f64::INFINITY;
    for b in 0..plan.len() as u32 {
        let secs: f64 = plan.batch(b).iter().map(|&i| d[i as usize]).sum();
        assert!(secs <= 90.0 || plan.batch(b).len() == 1, "batch {b}: {secs} s");
        // All in one bucket.
        let bucket = |x: f64| cfg.boundaries.partition_point(|&y| y <= x);
        let b0 = bucket(d[plan.batch(b)[0] as usize]);
        assert!(plan.batch(b).iter().all(|&i| bucket(d[i as usize]) == b0));
        assert!(plan.cost(b) <= last_cost);
        last_cost = plan.cost(b);
    }
    // One rank, no accumulation: every batch is used.
    assert_eq!(plan.steps() as usize, plan.len());
}

#[test]
fn curriculum_puts_shortest_batches_first_and_keeps_the_rest() {
    let _turn = crate::serial();
    let (d, l) = synthetic(5000, 4, 9, 5.0);
    let plain = EpochPlan::build(Durations::Seconds(&d), &l, &config(3, 0), 0, 2, 4).unwrap();
    let cur = EpochPlan::build(Durations::Seconds(&d), &l, &config(3, 5), 0, 2, 4).unwrap();
    for rank in 0..2 {
        let a = cur.rank_batches(rank, 0);
        let first: Vec<f64> = a[..20].iter().map(|&b| cur.longest(b)).collect();
        assert!(first.windows(2).all(|w| w[0] <= w[1]), "{first:?}");
        let rest_min = a[20..].iter().map(|&b| cur.longest(b)).fold(f64::INFINITY, f64::min);
        assert!(first[19] <= rest_min);
        let mut x = a.clone();
        let mut y = plain.rank_batches(rank, 0);
        x.sort_unstable();
        y.sort_unstable();
        assert_eq!(x, y);
    }
}

#[test]
fn bad_options_and_states_are_refused() {
    let _turn = crate::serial();
    let (d, l) = synthetic(100, 2, 1, 5.0);
    let cfg = SamplerConfig::default();
    assert!(EpochPlan::build(Durations::Seconds(&d), &l[..50], &cfg, 0, 1, 1).is_err());
    assert!(EpochPlan::build(Durations::Seconds(&d), &l, &cfg, 0, 0, 1).is_err());
    let bad = SamplerConfig { boundaries: vec![5.0, 3.0], ..cfg.clone() };
    assert!(EpochPlan::build(Durations::Seconds(&d), &l, &bad, 0, 1, 1).is_err());
    let mut plan = EpochPlan::build(Durations::Seconds(&d), &l, &cfg, 0, 1, 1).unwrap();
    assert!(plan.redeal(plan.steps() + 1, 2, 1).is_err());
    let mut state = plan.state(0);
    state.step = 10_000;
    assert!(EpochPlan::restore(Durations::Seconds(&d), &l, &cfg, &state).is_err());
}
