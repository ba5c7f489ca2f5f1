//! Training sets of several corpora: one index space over the corpora with merged language and
//! source tables, refusals of corpora that cannot be mixed (each naming the files), and the
//! `temperature` mode's quotas per (language, corpus, source) cell against a brute-force oracle.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use asr_corpus::synth::{SplitMix64, SynthSpec};
use asr_corpus::{Corpus, TokenSlice};
use asr_plan::{
    epoch_draws_mixed, quota_cells, resolve_specs, DataSpec, Durations, EpochPlan, Mix, PlanError,
    SamplerConfig, SamplerMode, SetError, TrainingSet, UtteranceSource, IDLE,
};

use crate::synthetic;

/// Writes a synthetic corpus tokenized by a model whose bytes are `model`.
pub fn write_corpus(
    dir: &Path,
    name: &str,
    languages: &[&str],
    sources: &[&str],
    n: u64,
    seed: u64,
    model: &[u8],
) -> PathBuf {
    let spec = SynthSpec {
        seed,
        languages: languages.iter().map(|s| s.to_string()).collect(),
        sources: sources.iter().map(|s| s.to_string()).collect(),
        min_samples: 8_000,
        max_samples: 160_000,
        ..SynthSpec::default()
    };
    let path = dir.join(name);
    spec.write_corpus(&path, n, model).unwrap();
    path
}

fn tokens(t: TokenSlice<'_>) -> Vec<u32> {
    match t {
        TokenSlice::U16(t) => t.iter().map(|&x| u32::from(x)).collect(),
        TokenSlice::U32(t) => t.to_vec(),
    }
}

#[test]
fn the_set_reads_every_utterance_of_every_corpus_under_merged_tables() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_corpus(dir.path(), "a.asrcorpus", &["en", "hi", "ta"], &["read"], 300, 1, b"m");
    let b =
        write_corpus(dir.path(), "b.asrcorpus", &["ta", "pl"], &["podcast", "read"], 200, 2, b"m");
    let (ca, cb) = (Corpus::open(&a).unwrap(), Corpus::open(&b).unwrap());
    let set = TrainingSet::open(&[DataSpec::new(&a), DataSpec::new(&b)]).unwrap();
    assert_eq!((set.len(), set.corpora()), (500, 2));
    // The first corpus keeps its ids; the second's are merged by name.
    assert_eq!(&set.language_names()[..ca.metadata().languages.len()], &ca.metadata().languages);
    let mut seen_pl = false;
    for g in 0..500u32 {
        let (c, i) = set.locate(g);
        let corpus = [&ca, &cb][c as usize];
        assert_eq!(g, if c == 0 { i } else { 300 + i });
        let i = i as usize;
        assert_eq!(UtteranceSource::pcm(&set, g), corpus.pcm(i));
        assert_eq!(tokens(UtteranceSource::tokens(&set, g)), tokens(corpus.tokens(i)));
        assert_eq!(set.num_samples()[g as usize], corpus.num_samples()[i]);
        assert_eq!(set.language_name(g), corpus.language_code(i), "utterance {g}");
        assert_eq!(set.source_names()[set.sources()[g as usize] as usize], corpus.source_name(i));
        seen_pl |= set.language_name(g) == "pl";
    }
    assert!(seen_pl, "the second corpus's own language is in the set");

    // Overrides apply to every utterance of their corpus, and to nothing else.
    let over =
        DataSpec { language: Some("xx".into()), source: Some("books".into()), ..DataSpec::new(&b) };
    let set = TrainingSet::open(&[DataSpec::new(&a), over]).unwrap();
    for g in 0..500u32 {
        let (c, i) = set.locate(g);
        let src = &set.source_names()[set.sources()[g as usize] as usize];
        if c == 1 {
            assert_eq!((set.language_name(g), src.as_str()), ("xx", "books"));
        } else {
            assert_eq!(set.language_name(g), ca.language_code(i as usize));
        }
    }
    // Ids are positions in the list: (corpus, index) survives a resume only in the same order.
    let identity = set.identity();
    assert_eq!(identity[1].utterances, 200);
    assert_eq!(identity[1].language.as_deref(), Some("xx"));
}

/// Rewrites header fields of a corpus file and its header checksum.
fn patch_header(path: &Path, fields: &[(usize, u32)]) {
    let mut bytes = std::fs::read(path).unwrap();
    for &(offset, value) in fields {
        bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
    }
    let o = asr_corpus::layout::header_offset::HEADER_CHECKSUM;
    let sum =
        asr_corpus::layout::header_checksum(&bytes[..asr_corpus::layout::HEADER_SIZE as usize]);
    bytes[o..o + 8].copy_from_slice(&sum.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn corpora_that_cannot_be_mixed_are_refused_naming_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = write_corpus(d, "a.asrcorpus", &["en"], &["read"], 50, 1, b"model one");
    let other = write_corpus(d, "other.asrcorpus", &["en"], &["read"], 50, 2, b"model two");
    let msg = |specs: &[DataSpec]| TrainingSet::open(specs).unwrap_err().to_string();
    let names_both = |m: &str, x: &Path, y: &Path| {
        m.contains(&x.display().to_string()) && m.contains(&y.display().to_string())
    };

    let e = TrainingSet::open(&[DataSpec::new(&a), DataSpec::new(&other)]).unwrap_err();
    assert!(matches!(e, SetError::Tokenizer { .. }), "{e}");
    assert!(names_both(&e.to_string(), &a, &other), "{e}");

    // A later format version that this reader can still read: readable alone, not mixed.
    let v2 = write_corpus(d, "v2.asrcorpus", &["en"], &["read"], 50, 3, b"model one");
    patch_header(&v2, &[(asr_corpus::layout::header_offset::FORMAT_VERSION, 2)]);
    assert!(TrainingSet::open(&[DataSpec::new(&v2)]).is_ok());
    let e = TrainingSet::open(&[DataSpec::new(&a), DataSpec::new(&v2)]).unwrap_err();
    assert!(matches!(e, SetError::FormatVersion { .. }), "{e}");
    assert!(names_both(&e.to_string(), &a, &v2), "{e}");

    // Version 1 fixes the rate at 16 kHz: another rate is refused when the corpus opens.
    let r8 = write_corpus(d, "r8.asrcorpus", &["en"], &["read"], 50, 4, b"model one");
    patch_header(&r8, &[(asr_corpus::layout::header_offset::SAMPLE_RATE, 8_000)]);
    let e = TrainingSet::open(&[DataSpec::new(&a), DataSpec::new(&r8)]).unwrap_err();
    assert!(matches!(&e, SetError::Open { path, .. } if path == &r8), "{e}");
    assert!(e.to_string().contains("sample_rate"), "{e}");

    let missing = d.join("missing.asrcorpus");
    let e = TrainingSet::open(&[DataSpec::new(&a), DataSpec::new(&missing)]).unwrap_err();
    assert!(matches!(&e, SetError::Open { path, .. } if path == &missing), "{e}");
    let e = TrainingSet::open(&[DataSpec::new(&a), DataSpec::new(d.join(".").join("a.asrcorpus"))])
        .unwrap_err();
    assert!(matches!(e, SetError::Duplicate { .. }), "{e}");
    for w in [0.0, -1.0, f64::NAN] {
        let e = TrainingSet::open(&[DataSpec { weight: w, ..DataSpec::new(&a) }]).unwrap_err();
        assert!(matches!(&e, SetError::Weight { path, .. } if path == &a), "{e}");
        assert!(msg(&[DataSpec { weight: w, ..DataSpec::new(&a) }]).contains("a.asrcorpus"));
    }
    let e = TrainingSet::open(&[DataSpec { language: Some(" ".into()), ..DataSpec::new(&a) }])
        .unwrap_err();
    assert!(matches!(e, SetError::EmptyOverride { what: "language", .. }), "{e}");

    assert!(matches!(resolve_specs(&[], &[]), Err(SetError::Empty)));
    let both = resolve_specs(std::slice::from_ref(&a), &[DataSpec::new(&other)]).unwrap_err();
    assert!(names_both(&both.to_string(), &a, &other), "{both}");
    assert_eq!(resolve_specs(std::slice::from_ref(&a), &[]).unwrap(), vec![DataSpec::new(&a)]);
}

/// Three corpora's arrays, concatenated: durations, languages, sources, corpus ends.
fn three_corpora() -> (Vec<f64>, Vec<u16>, Vec<u16>, Vec<u32>) {
    let (mut d, mut l, mut ends) = (Vec::new(), Vec::new(), Vec::new());
    // Different language mixes: the third corpus has languages the others lack.
    for (n, langs, seed, shift) in [(6_000, 4u16, 1u64, 0u16), (2_500, 3, 2, 1), (700, 5, 3, 3)] {
        let (dc, lc) = synthetic(n, langs, seed, 5.0);
        d.extend(dc);
        l.extend(lc.iter().map(|&x| x + shift));
        ends.push(l.len() as u32);
    }
    let mut rng = SplitMix64::new(9);
    // Two sources of very different sizes, and a rare third.
    let s = (0..l.len())
        .map(|_| match rng.below(100) {
            0..=79 => 0,
            80..=97 => 1,
            _ => 2,
        })
        .collect();
    (d, l, s, ends)
}

#[test]
fn quotas_per_cell_match_a_brute_force_oracle() {
    let (_, l, s, ends) = three_corpora();
    let weights = [1.0, 3.0, 0.5];
    let mix = Mix { corpus_ends: &ends, weights: &weights, sources: &s };
    let n = l.len();
    let corpus_of = |i: usize| ends.iter().position(|&e| i < e as usize).unwrap();
    for temperature in [0.0, 0.3, 1.0] {
        for source_temperature in [None, Some(0.0), Some(1.0)] {
            let cfg = SamplerConfig {
                mode: SamplerMode::Temperature,
                temperature,
                source_temperature,
                seed: 5,
                ..SamplerConfig::default()
            };
            // The oracle: cells, their weighted sizes, language shares, shares within a language.
            let cell = |i: usize| (l[i], corpus_of(i), source_temperature.map_or(0, |_| s[i]));
            let mut count: BTreeMap<(u16, usize, u16), f64> = BTreeMap::new();
            for i in 0..n {
                *count.entry(cell(i)).or_default() += 1.0;
            }
            let size = |k: &(u16, usize, u16)| count[k] * weights[k.1];
            let mut lang_size: BTreeMap<u16, f64> = BTreeMap::new();
            for k in count.keys() {
                *lang_size.entry(k.0).or_default() += size(k);
            }
            let pow = |x: f64, t: f64| if t <= 0.0 { 1.0 } else { x.powf(t) };
            let z: f64 = lang_size.values().map(|&x| pow(x, temperature)).sum();
            let within = source_temperature.unwrap_or(1.0);
            let expected = |k: &(u16, usize, u16)| {
                let zl: f64 =
                    count.keys().filter(|j| j.0 == k.0).map(|j| pow(size(j), within)).sum();
                pow(lang_size[&k.0], temperature) / z * pow(size(k), within) / zl
            };

            let cells = quota_cells(&l, &mix, &cfg).unwrap();
            assert_eq!(cells.len(), count.len());
            assert_eq!(cells.iter().map(|c| c.quota).sum::<u64>(), n as u64);
            for c in &cells {
                let k = (c.language, c.corpus as usize, c.source);
                assert!(
                    (c.target - expected(&k)).abs() < 1e-12,
                    "{k:?}: {} {}",
                    c.target,
                    expected(&k)
                );
            }

            let mut uses = vec![0u32; n];
            for epoch in 0..3 {
                let draws = epoch_draws_mixed(&l, &mix, &cfg, epoch).unwrap();
                assert_eq!(draws.len(), n, "an epoch keeps the set's utterance count");
                let mut got: BTreeMap<(u16, usize, u16), f64> = BTreeMap::new();
                let mut per_lang: BTreeMap<u16, f64> = BTreeMap::new();
                let mut in_epoch = vec![0u32; n];
                for &i in &draws {
                    *got.entry(cell(i as usize)).or_default() += 1.0;
                    *per_lang.entry(l[i as usize]).or_default() += 1.0;
                    uses[i as usize] += 1;
                    in_epoch[i as usize] += 1;
                }
                for k in count.keys() {
                    let want = expected(k) * n as f64;
                    let g = got.get(k).copied().unwrap_or(0.0);
                    // Two roundings (language, then cell), each within one draw.
                    assert!(
                        (g - want).abs() < 2.0,
                        "T={temperature} {source_temperature:?} {k:?}: {g} draws, want {want:.2}"
                    );
                    // No utterance of a cell twice before the cell is exhausted.
                    let most =
                        (0..n).filter(|&i| cell(i) == *k).map(|i| in_epoch[i]).max().unwrap();
                    assert!(most as f64 <= (g / count[k]).ceil() + 1.0, "{k:?}: used {most} times");
                }
                for (lang, &g) in &per_lang {
                    let want = pow(lang_size[lang], temperature) / z * n as f64;
                    assert!((g - want).abs() < 1.0, "language {lang}: {g} draws, want {want:.2}");
                }
            }
            // Over epochs, a cell's utterances are used as evenly as whole permutations allow.
            for k in count.keys() {
                let u: Vec<u32> = (0..n).filter(|&i| cell(i) == *k).map(|i| uses[i]).collect();
                let (lo, hi) = (u.iter().min().unwrap(), u.iter().max().unwrap());
                assert!(hi - lo <= 1, "{k:?}: uses {lo}..={hi} over 3 epochs");
            }
        }
    }
}

#[test]
fn a_set_of_one_corpus_plans_exactly_as_the_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_corpus(dir.path(), "a.asrcorpus", &["en", "hi", "ta"], &["r", "c"], 800, 1, b"m");
    let c = Corpus::open(&a).unwrap();
    let set = TrainingSet::open(&[DataSpec::new(&a)]).unwrap();
    let rate = f64::from(c.header().sample_rate);
    for mode in [SamplerMode::Temperature, SamplerMode::Seed] {
        let cfg = SamplerConfig { mode, max_batch_seconds: 30.0, ..SamplerConfig::default() };
        for epoch in 0..3 {
            let d = Durations::Samples { samples: c.num_samples(), rate };
            let plain = EpochPlan::build(d, c.languages(), &cfg, epoch, 2, 2).unwrap();
            let mixed = EpochPlan::build_mixed(
                set.durations(),
                set.languages(),
                &set.mix(),
                &cfg,
                epoch,
                2,
                2,
            )
            .unwrap();
            assert_eq!(plain.len(), mixed.len());
            for b in 0..plain.len() as u32 {
                assert_eq!(plain.batch(b), mixed.batch(b), "{mode:?} epoch {epoch} batch {b}");
            }
        }
    }
}

#[test]
fn seed_mode_takes_every_utterance_of_every_corpus_once_and_refuses_weights() {
    let (d, l, s, ends) = three_corpora();
    let cfg = SamplerConfig { mode: SamplerMode::Seed, ..SamplerConfig::default() };
    let mix = Mix { corpus_ends: &ends, weights: &[1.0, 1.0, 1.0], sources: &s };
    let plan = EpochPlan::build_mixed(Durations::Seconds(&d), &l, &mix, &cfg, 0, 1, 1).unwrap();
    let mut seen = vec![0u32; l.len()];
    for b in 0..plan.len() as u32 {
        for &i in plan.batch(b) {
            seen[i as usize] += 1;
        }
    }
    assert!(seen.iter().all(|&x| x == 1));
    let weighted = Mix { weights: &[1.0, 2.0, 1.0], ..mix };
    let e = EpochPlan::build_mixed(Durations::Seconds(&d), &l, &weighted, &cfg, 0, 1, 1);
    assert_eq!(e.unwrap_err(), PlanError::WeightsNeedTemperature);
    let per_source = SamplerConfig { source_temperature: Some(0.5), ..cfg.clone() };
    let e = EpochPlan::build_mixed(Durations::Seconds(&d), &l, &mix, &per_source, 0, 1, 1);
    assert_eq!(e.unwrap_err(), PlanError::SourceQuotasNeedTemperature);
    let bad_ends = Mix { corpus_ends: &[10, 5, l.len() as u32], ..mix };
    let e = EpochPlan::build_mixed(Durations::Seconds(&d), &l, &bad_ends, &cfg, 0, 1, 1);
    assert!(matches!(e, Err(PlanError::CorpusEnds { utterances, .. }) if utterances == l.len()));
    let short_sources = Mix { sources: &s[1..], ..mix };
    let e = EpochPlan::build_mixed(Durations::Seconds(&d), &l, &short_sources, &cfg, 0, 1, 1);
    assert_eq!(
        e.unwrap_err(),
        PlanError::SourceCount { sources: l.len() - 1, utterances: l.len() }
    );
}

#[test]
fn a_mixed_plan_resumes_exactly_and_redeals_without_loss() {
    let (d, l, s, ends) = three_corpora();
    let weights = [1.0, 3.0, 0.5];
    let mix = Mix { corpus_ends: &ends, weights: &weights, sources: &s };
    let cfg = SamplerConfig { source_temperature: Some(0.5), ..SamplerConfig::default() };
    let dur = Durations::Seconds(&d);
    let plan = EpochPlan::build_mixed(dur, &l, &mix, &cfg, 2, 4, 2).unwrap();
    let k = plan.steps() / 3;
    let resumed = EpochPlan::restore_mixed(dur, &l, &mix, &cfg, &plan.state(k)).unwrap();
    for step in k..plan.steps() {
        for rank in 0..4 {
            let a: Vec<&[u32]> =
                plan.step_batches(step, rank).iter().map(|&b| plan.batch(b)).collect();
            let b: Vec<&[u32]> =
                resumed.step_batches(step, rank).iter().map(|&b| resumed.batch(b)).collect();
            assert_eq!(a, b);
        }
    }
    // On 3 ranks from step k: the same utterances, as often, as the uninterrupted epoch.
    let count = |p: &EpochPlan, from: u64| {
        let mut m: BTreeMap<u32, u32> = BTreeMap::new();
        for step in from..p.steps() {
            for rank in 0..p.layout_at(step).unwrap().world_size {
                for &b in p.step_batches(step, rank).iter().filter(|&&b| b != IDLE) {
                    for &u in p.batch(b) {
                        *m.entry(u).or_default() += 1;
                    }
                }
            }
        }
        m
    };
    let mut redealt = resumed.clone();
    redealt.redeal(k, 3, 1).unwrap();
    let again = EpochPlan::restore_mixed(dur, &l, &mix, &cfg, &redealt.state(k)).unwrap();
    assert_eq!(count(&plan, k), count(&again, k));
    // Another weight is another plan: a resume must not mix them up.
    let other = Mix { weights: &[1.0, 1.0, 1.0], ..mix };
    let p2 = EpochPlan::build_mixed(dur, &l, &other, &cfg, 2, 4, 2).unwrap();
    assert_ne!(count(&plan, 0), count(&p2, 0));
}
