//! Padded batches equal a naive assembly from the corpus, and the background loader delivers a
//! rank's schedule in order, micro-batch by micro-batch or step by step, idle slots included,
//! and stops cleanly when dropped.

use std::sync::Arc;

use asr_corpus::synth::SynthSpec;
use asr_corpus::{Corpus, CorpusWriter, WriterOptions};
use asr_plan::ShapePolicy;
use asr_plan::{assemble, Audio, AudioFormat, Loader, LoaderConfig};
use asr_plan::{Durations, EpochPlan, SamplerConfig, IDLE};

fn corpus(n: u64, vocab: u32) -> Arc<Corpus> {
    let spec = SynthSpec {
        min_samples: 1_000,
        max_samples: 40_000,
        vocab_size: vocab,
        ..SynthSpec::default()
    };
    let mut w = CorpusWriter::in_memory(WriterOptions::new(vocab, "none", Vec::new())).unwrap();
    for i in 0..n {
        w.push(&spec.utterance(i).as_input()).unwrap();
    }
    Arc::new(Corpus::from_bytes(&w.finish().unwrap().data.unwrap()).unwrap())
}

#[test]
fn assembled_batches_match_a_naive_copy() {
    let rounded = ShapePolicy { audio_quantum_seconds: 0.1, token_quantum: 8 };
    // (vocabulary, shape policy, its quanta in samples at 16 kHz and in tokens)
    for (vocab, shape, (q_samples, q_tokens)) in
        [(1024, ShapePolicy::default(), (0, 0)), (70_000, rounded, (1600, 8))]
    {
        let c = corpus(60, vocab);
        let idx = [5u32, 0, 17, 59, 33];
        for format in [AudioFormat::I16, AudioFormat::F32] {
            let b = assemble(&*c, &idx, shape, format);
            let longest = idx.iter().map(|&i| c.pcm(i as usize).len()).max().unwrap();
            let most = idx.iter().map(|&i| c.tokens(i as usize).len()).max().unwrap();
            let round =
                |x: usize, q: u32| if q == 0 { x } else { x.div_ceil(q as usize) * q as usize };
            assert_eq!(b.max_samples, round(longest, q_samples));
            assert_eq!(b.max_tokens, round(most, q_tokens));
            assert_eq!(b.size(), 5);
            for (row, &i) in idx.iter().enumerate() {
                let pcm = c.pcm(i as usize);
                assert_eq!(b.audio_lens[row] as usize, pcm.len());
                let t = b.max_samples;
                match &b.audio {
                    Audio::I16(a) => {
                        assert_eq!(&a[row * t..row * t + pcm.len()], pcm);
                        assert!(a[row * t + pcm.len()..(row + 1) * t].iter().all(|&s| s == 0));
                    }
                    Audio::F32(a) => {
                        for (k, &s) in pcm.iter().enumerate() {
                            assert_eq!(a[row * t + k], s as f32 / 32768.0);
                        }
                        assert!(a[row * t + pcm.len()..(row + 1) * t].iter().all(|&s| s == 0.0));
                    }
                }
                let toks = c.tokens(i as usize).to_vec();
                let u = b.max_tokens;
                assert_eq!(&b.tokens[row * u..row * u + toks.len()], &toks[..]);
                assert!(b.tokens[row * u + toks.len()..(row + 1) * u].iter().all(|&x| x == 0));
                assert_eq!(b.languages[row], c.languages()[i as usize]);
            }
            let secs: f64 = idx.iter().map(|&i| c.duration_seconds(i as usize)).sum();
            assert!((b.seconds - secs).abs() < 1e-9);
        }
    }
}

#[test]
fn loader_delivers_the_schedule_in_order() {
    let c = corpus(300, 1024);
    let cfg = SamplerConfig { max_batch_seconds: 8.0, ..SamplerConfig::default() };
    let durations = Durations::Samples { samples: c.num_samples(), rate: 16_000.0 };
    let mut plan = EpochPlan::build(durations, c.languages(), &cfg, 0, 2, 2).unwrap();
    let at = plan.steps() / 2;
    plan.redeal(at, 3, 2).unwrap();
    let plan = Arc::new(plan);
    for workers in [1, 3] {
        for rank in 0..3u32 {
            let from = at;
            let lc = LoaderConfig { workers, depth: 1, ..LoaderConfig::default() };
            let got: Vec<_> =
                Loader::start(Arc::clone(&c), Arc::clone(&plan), rank, from, lc).collect();
            let want: Vec<u32> = plan.rank_batches(rank, from);
            assert_eq!(got.len(), want.len());
            let mut idle = 0;
            for (k, (mb, &b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(mb.step, from + k as u64 / 2);
                assert_eq!(mb.slot as usize, k % 2);
                match &mb.batch {
                    None => {
                        assert_eq!(b, IDLE);
                        idle += 1;
                    }
                    Some(batch) => assert_eq!(batch.indices, plan.batch(b)),
                }
            }
            assert!(idle <= 2, "rank {rank}: {idle} idle slots");
        }
    }
}

#[test]
fn dropping_a_loader_early_stops_its_workers() {
    let c = corpus(200, 1024);
    let cfg = SamplerConfig { max_batch_seconds: 4.0, ..SamplerConfig::default() };
    let durations = Durations::Samples { samples: c.num_samples(), rate: 16_000.0 };
    let plan = Arc::new(EpochPlan::build(durations, c.languages(), &cfg, 0, 1, 1).unwrap());
    let mut loader = Loader::start(
        c,
        plan,
        0,
        0,
        LoaderConfig { workers: 2, depth: 1, ..LoaderConfig::default() },
    );
    assert!(loader.next().is_some());
    // Dropping must return (the workers see their channels close); a hang fails the test here
    // instead of stalling the suite.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(loader);
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("dropping the loader did not stop its workers within 30 s");
}

#[test]
fn loader_steps_group_each_optimizer_step_with_its_idle_slots() {
    let c = corpus(300, 1024);
    let cfg = SamplerConfig { max_batch_seconds: 8.0, ..SamplerConfig::default() };
    let durations = Durations::Samples { samples: c.num_samples(), rate: 16_000.0 };
    let mut plan = EpochPlan::build(durations, c.languages(), &cfg, 0, 2, 3).unwrap();
    let at = plan.steps() / 3;
    plan.redeal(at, 3, 3).unwrap();
    let plan = Arc::new(plan);
    assert!(plan.steps() > at + 1, "too few steps to test");
    for rank in 0..3u32 {
        let from = at + 1;
        let lc = LoaderConfig { workers: 2, depth: 1, ..LoaderConfig::default() };
        let steps: Vec<_> = Loader::start(Arc::clone(&c), Arc::clone(&plan), rank, from, lc)
            .steps()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(steps.len() as u64, plan.steps() - from);
        for (k, s) in steps.iter().enumerate() {
            let step = from + k as u64;
            assert_eq!(s.step, step);
            let want: Vec<u32> = plan.step_batches(step, rank).to_vec();
            let real: Vec<&[u32]> =
                want.iter().filter(|&&b| b != IDLE).map(|&b| plan.batch(b)).collect();
            assert_eq!(s.idle, want.len() - real.len());
            assert_eq!(s.batches.iter().map(|b| &b.indices[..]).collect::<Vec<_>>(), real);
        }
    }
}
