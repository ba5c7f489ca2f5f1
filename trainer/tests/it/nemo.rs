//! `.nemo` import and export against NeMo itself: the fixture in `tests/data/nemo` was made by
//! `make.py` with NeMo 2.7.3 on the CPU (a 2-layer FastConformer-TDT with every parameter
//! perturbed, and NeMo's outputs on three example utterances). Nothing here runs NeMo.

use std::path::{Path, PathBuf};

use asr_tdt::cpu::{tdt_utterance, Dims};
use asr_tdt::greedy::{greedy_batch, GreedyOptions};
use asr_trainer::nemo::{self, torch_file, ImportError};
use asr_trainer::BurnGreedy;
use asr_trainer::{MelFrontend, Pieces};
use burn::backend::NdArray;
use burn::prelude::*;
use safetensors::{Dtype, SafeTensors};

type B = NdArray;

fn data_dir() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("tests/data/nemo")
}

fn fixture() -> PathBuf {
    data_dir().join("tiny-tdt.nemo")
}

/// A recorded tensor: shape and values as f64.
pub(crate) fn tensor(st: &SafeTensors, name: &str) -> (Vec<usize>, Vec<f64>) {
    let t = st.tensor(name).unwrap();
    let b = t.data();
    let v: Vec<f64> = match t.dtype() {
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        Dtype::F64 => {
            b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
        }
        Dtype::I64 => {
            b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect()
        }
        Dtype::I16 => b
            .chunks_exact(2)
            .map(|c| f64::from(i16::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        other => panic!("{name}: dtype {other:?}"),
    };
    (t.shape().to_vec(), v)
}

pub(crate) fn ints(st: &SafeTensors, name: &str) -> Vec<usize> {
    tensor(st, name).1.into_iter().map(|x| x as usize).collect()
}

/// Largest |ours - theirs| and largest |theirs| over each row `b`'s first `frames[b]` frames:
/// ours `[B, T, C]`, NeMo's `[B, C, T]` (channels first).
fn max_diff(ours: &Tensor<B, 3>, theirs: &[f64], frames: &[usize]) -> (f64, f64) {
    let [_, t, c] = ours.dims();
    let ours = ours.clone().into_data().to_vec::<f32>().unwrap();
    let (mut d, mut scale) = (0f64, 0f64);
    for (b, &n) in frames.iter().enumerate() {
        for i in 0..n {
            for j in 0..c {
                let want = theirs[(b * c + j) * t + i];
                d = d.max((f64::from(ours[(b * t + i) * c + j]) - want).abs());
                scale = scale.max(want.abs());
            }
        }
    }
    (d, scale)
}

#[test]
fn imported_model_reproduces_nemo_features_encoder_logits_loss_and_greedy_text() {
    let _turn = crate::serial();
    let device = Default::default();
    let imp = nemo::import::<B>(&fixture(), false, &device).unwrap();
    let cfg = &imp.info.model;
    assert_eq!((cfg.encoder.d_model, cfg.encoder.n_layers, cfg.encoder.n_heads), (64, 2, 4));
    assert_eq!((cfg.encoder.ff_dim, cfg.encoder.subsampling_conv_channels), (256, 32));
    assert_eq!((cfg.preprocessor.features, cfg.preprocessor.window_size), (80, 400));
    assert_eq!((cfg.decoder.pred_hidden, cfg.decoder.pred_rnn_layers), (64, 2));
    assert_eq!(cfg.durations, vec![0, 1, 2, 3, 4]);
    assert_eq!(imp.info.vocab, 320);
    assert_eq!(imp.info.loss.sigma, 0.05);
    assert!(imp.report.unmapped.is_empty());
    // The tokenizer is the example corpus's model, byte for byte.
    let spm = std::fs::read(data_dir().join("../../../../examples/espeak/spm.model")).unwrap();
    assert_eq!(imp.tokenizer, spm);

    let bytes = std::fs::read(data_dir().join("tiny-tdt.outputs.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (pcm_shape, pcm) = tensor(&st, "pcm");
    let (batch, samples) = (pcm_shape[0], pcm_shape[1]);
    let pcm: Vec<i16> = pcm.into_iter().map(|x| x as i16).collect();
    let lens: Vec<u32> = ints(&st, "pcm_lens").into_iter().map(|x| x as u32).collect();
    assert_eq!(pcm.len(), batch * samples);

    // Mel features: NeMo's [B, F, T], ours [B, T, F].
    let frontend = MelFrontend::<B>::new(&cfg.preprocessor, &device);
    let (feats, frame_lens) = frontend.forward(&pcm, batch, &lens, None, &device);
    assert_eq!(frame_lens, ints(&st, "feature_lens"));
    let (fs, nf) = tensor(&st, "features");
    let [_, t, f] = feats.dims();
    assert_eq!(fs, vec![batch, f, t]);
    let (d, scale) = max_diff(&feats, &nf, &vec![t; batch]);
    eprintln!("features: max |diff| {d:.2e}, max |value| {scale:.2e}");
    // Measured 2.23e-5 at a scale of 3.66 (NeMo 2.7.3 on the fixture): the bound is 4.9x that.
    assert!(d <= 3e-5 * scale.max(1.0), "features differ by {d}");

    // Encoder on our features, valid frames: NeMo's [B, D, T'], ours [B, T', D].
    let (enc, enc_lens) = imp.model.encode(cfg, feats, &frame_lens);
    assert_eq!(enc_lens, ints(&st, "encoder_lens"));
    let (es, ne) = tensor(&st, "encoder");
    let [_, te, dm] = enc.dims();
    assert_eq!(es, vec![batch, dm, te]);
    let (d, scale) = max_diff(&enc, &ne, &enc_lens);
    eprintln!("encoder: max |diff| {d:.2e}, max |value| {scale:.2e}");
    // Measured 2.03e-6 at a scale of 3.02: the bound is 4.5x that.
    assert!(d <= 3e-6 * scale.max(1.0), "encoder output differs by {d}");

    // Joint logits for the reference tokens, valid nodes.
    let targets = ints(&st, "targets");
    let target_lens = ints(&st, "target_lens");
    let u_max = targets.len() / batch;
    let tgt = Tensor::<B, 2, Int>::from_data(
        TensorData::new(targets.iter().map(|&x| x as i64).collect::<Vec<_>>(), [batch, u_max]),
        &device,
    );
    let logits = imp.model.logits(enc.clone(), tgt);
    let [_, _, u1, width] = logits.dims();
    let (ls, nl) = tensor(&st, "logits");
    assert_eq!(ls, vec![batch, te, u1, width]);
    let ours_l = logits.into_data().to_vec::<f32>().unwrap();
    let mut d = 0f64;
    let mut scale = 0f64;
    for b in 0..batch {
        for i in 0..enc_lens[b] {
            for u in 0..=target_lens[b] {
                let at = ((b * te + i) * u1 + u) * width;
                for k in 0..width {
                    d = d.max((f64::from(ours_l[at + k]) - nl[at + k]).abs());
                    scale = scale.max(nl[at + k].abs());
                }
            }
        }
    }
    eprintln!("logits: max |diff| {d:.2e}, max |value| {scale:.2e}");
    // Measured 1.31e-6 at a scale of 1.55: the bound is 4.7x that.
    assert!(d <= 4e-6 * scale.max(1.0), "logits differ by {d}");

    // TDT loss (NeMo's TDTLossPytorch, float64) against ours on NeMo's logits and on ours.
    let (_, want) = tensor(&st, "loss");
    let block = te * u1 * width;
    for b in 0..batch {
        let dims = Dims {
            t_max: te,
            u_max: u1 - 1,
            vocab: imp.info.vocab + 1,
            n_dur: cfg.durations.len(),
            t: enc_lens[b],
            u: target_lens[b],
        };
        let tg: Vec<u32> =
            targets[b * u_max..b * u_max + target_lens[b]].iter().map(|&x| x as u32).collect();
        let theirs: Vec<f32> = nl[b * block..(b + 1) * block].iter().map(|&x| x as f32).collect();
        let on_theirs = tdt_utterance(&theirs, &dims, &tg, &imp.info.loss, None);
        let on_ours =
            tdt_utterance(&ours_l[b * block..(b + 1) * block], &dims, &tg, &imp.info.loss, None);
        eprintln!(
            "loss {b}: NeMo {:.9}, ours on NeMo's logits {on_theirs:.9}, on ours {on_ours:.9}",
            want[b]
        );
        // Measured at most 6.6e-8 relative, on NeMo's logits and on ours: the bound is 4.5x.
        assert!(
            (on_theirs - want[b]).abs() <= 3e-7 * want[b].abs(),
            "loss {b}: {on_theirs} vs {}",
            want[b]
        );
        assert!(
            (on_ours - want[b]).abs() <= 3e-7 * want[b].abs(),
            "loss {b}: {on_ours} vs {}",
            want[b]
        );
    }

    // Greedy TDT decoding: the same tokens, and the same text.
    let opts = GreedyOptions {
        vocab: imp.info.vocab + 1,
        durations: cfg.durations.clone(),
        max_symbols: Some(10),
    };
    let proj = imp.model.joint.project_encoder(enc);
    let mut dec = BurnGreedy::new(&imp.model, proj, &device);
    let hyps = greedy_batch(&mut dec, &enc_lens, &opts);
    let (gs, greedy) = tensor(&st, "greedy");
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data_dir().join("tiny-tdt.outputs.json")).unwrap(),
    )
    .unwrap();
    let pieces = Pieces::parse(&imp.tokenizer).unwrap();
    for (b, h) in hyps.iter().enumerate() {
        let want: Vec<usize> = greedy[b * gs[1]..(b + 1) * gs[1]]
            .iter()
            .filter(|&&x| x >= 0.0)
            .map(|&x| x as usize)
            .collect();
        assert_eq!(h.tokens, want, "greedy tokens of utterance {b}");
        assert_eq!(pieces.decode(&h.tokens), meta["greedy_texts"][b].as_str().unwrap());
    }
}

#[test]
fn export_then_import_gives_the_same_weights_and_nemo_keys() {
    let _turn = crate::serial();
    let device = Default::default();
    let a = nemo::import::<B>(&fixture(), false, &device).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("again.nemo");
    nemo::export(&a.model, &a.info.model, &a.info.loss, None, &a.tokenizer, &out).unwrap();
    let b = nemo::import::<B>(&out, false, &device).unwrap();
    assert_eq!(b.info.model, a.info.model);
    assert_eq!(b.info.loss, a.info.loss);
    assert_eq!(b.tokenizer, a.tokenizer);
    let pa = asr_trainer::checkpoint::parameters(&a.model).unwrap();
    let pb = asr_trainer::checkpoint::parameters(&b.model).unwrap();
    assert_eq!(pa, pb, "import(export(import(x))) == import(x), value for value");
    // The exported state dict has exactly NeMo's keys and shapes (read with burn-store's reader),
    // but for the joint's Linear: the fixture was built with jointnet.dropout > 0 (joint_net is
    // [ReLU, Dropout, Linear], the Linear at index 2); the export's config has no dropout there
    // (this model has none), so NeMo builds [ReLU, Linear] and the Linear is joint_net.1.
    // NeMo's restore of the export is checked in transcribe.rs.
    let orig = asr_nemo::Archive::open(fixture()).unwrap();
    let again = asr_nemo::Archive::open(&out).unwrap();
    let shapes = |a: &asr_nemo::Archive| {
        let sd = nemo::weights::read_archive_state_dict(a).unwrap();
        let mut v: Vec<(String, Vec<usize>)> = sd.into_iter().map(|(k, (s, _))| (k, s)).collect();
        v.sort();
        v
    };
    let renamed: Vec<(String, Vec<usize>)> = {
        let mut v: Vec<_> = shapes(&orig)
            .into_iter()
            .map(|(k, s)| (k.replace("joint.joint_net.2", "joint.joint_net.1"), s))
            .collect();
        v.sort();
        v
    };
    assert_eq!(shapes(&again), renamed);
}

#[test]
fn parakeet_0_6b_shapes_map_with_no_key_left_and_nvidias_parameter_count() {
    let _turn = crate::serial();
    let text = std::fs::read_to_string(data_dir().join("parakeet-tdt-0.6b.shapes.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let want: std::collections::BTreeMap<String, Vec<usize>> = v["keys"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, s)| {
            (
                k.clone(),
                s.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect(),
            )
        })
        .collect();
    let mut cfg = asr_trainer::ModelConfig::parakeet_tdt_0_6b();
    cfg.preprocessor.features = 128;
    let vocab = 1024;
    let mut ours: std::collections::BTreeMap<String, Vec<usize>> =
        nemo::weights::entries(&cfg, vocab)
            .into_iter()
            // Parakeet trains with jointnet.dropout 0.2: its joint's Linear is joint_net.2
            // ([ReLU, Dropout, Linear]); ours has no dropout, so ours (and our export) is
            // joint_net.1, and the import takes either.
            .map(|e| (e.key.replace("joint.joint_net.1", "joint.joint_net.2"), e.shape))
            .collect();
    ours.insert(nemo::weights::WINDOW_KEY.into(), vec![400]);
    ours.insert(nemo::weights::FILTERBANK_KEY.into(), vec![1, 128, 257]);
    for (k, s) in &want {
        if k.ends_with(nemo::weights::NUM_BATCHES_TRACKED) {
            assert!(s.is_empty());
            continue;
        }
        assert_eq!(ours.get(k), Some(s), "{k}");
    }
    let counted = want.keys().filter(|k| !k.ends_with(nemo::weights::NUM_BATCHES_TRACKED)).count();
    assert_eq!(ours.len(), counted, "keys of ours that NeMo's model does not have");
    // NeMo's count of this model's parameters (torch's model.parameters()).
    assert_eq!(
        nemo::weights::parameter_count(&cfg, vocab),
        v["parameters"].as_u64().unwrap() as usize
    );
    assert_eq!(v["parameters"].as_u64(), Some(618_268_294));
}

/// The 0.6B-shaped state dict itself (2.5 GB, written by `make.py --parakeet-state-dict`):
/// run with `ASRT_PARAKEET_STATE_DICT=PATH cargo test -p asr-trainer -- --ignored parakeet`.
#[test]
#[ignore = "needs ASRT_PARAKEET_STATE_DICT, the 2.5 GB state dict make.py --parakeet-state-dict writes"]
fn parakeet_state_dict_imports_when_given() {
    let _turn = crate::serial();
    let path = std::env::var("ASRT_PARAKEET_STATE_DICT")
        .expect("ASRT_PARAKEET_STATE_DICT names the state dict (make.py --parakeet-state-dict)");
    let mut cfg = asr_trainer::ModelConfig::parakeet_tdt_0_6b();
    cfg.preprocessor.features = 128;
    let sd = nemo::weights::read_state_dict(Path::new(&path), &path).unwrap();
    let model = asr_trainer::TdtModel::<B>::new(&cfg, 1024, 0, &Default::default());
    let (_, report) =
        nemo::weights::load(model, &cfg, 1024, &sd, &nemo::LoadOptions::default()).unwrap();
    assert!(report.unmapped.is_empty());
    eprintln!("0.6B state dict: {} tensors, {} values set", report.tensors, report.parameters);
}

/// Writes a copy of the fixture with its state dict changed by `edit`.
fn with_state_dict(
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut Vec<(String, torch_file::TorchTensor)>),
) -> PathBuf {
    let device = Default::default();
    let a = nemo::import::<B>(&fixture(), false, &device).unwrap();
    let mut sd = nemo::weights::state_dict(&a.model, &a.info.model, a.info.vocab).unwrap();
    edit(&mut sd);
    let mut ckpt = std::io::Cursor::new(Vec::new());
    torch_file::write_state_dict(&mut ckpt, "model_weights", &sd).unwrap();
    rewrite(&fixture(), dir, name, vec![(asr_nemo::WEIGHTS_MEMBER, ckpt.into_inner())])
}

/// Writes `dir/name`: the archive `src` with the members of `replaced` in place of its own.
fn rewrite(src: &Path, dir: &Path, name: &str, replaced: Vec<(&str, Vec<u8>)>) -> PathBuf {
    let archive = asr_nemo::Archive::open(src).unwrap();
    let weights = archive
        .with_weights(|r| {
            let mut v = Vec::new();
            r.read_to_end(&mut v).unwrap();
            v
        })
        .unwrap();
    let mut members: Vec<(&str, Vec<u8>)> = archive
        .member_names()
        .into_iter()
        .filter(|n| replaced.iter().all(|(r, _)| r != n))
        .map(|n| {
            let bytes = match n {
                asr_nemo::WEIGHTS_MEMBER => weights.clone(),
                _ => archive.member(n).unwrap().to_vec(),
            };
            (n, bytes)
        })
        .collect();
    members.extend(replaced);
    let refs: Vec<(&str, &[u8])> = members.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    let out = dir.join(name);
    asr_nemo::write_archive(&out, &refs).unwrap();
    out
}

/// Writes a copy of the fixture with `model_config.yaml` changed by `edit`.
/// The model's own settings travel through import and export: `max_symbols` from NeMo's
/// decoding section and back, no dropout where this model has none (the source's is named as
/// not imported), the optimizer where the source knows it (it used to be a fixed 1e-4, with
/// dropouts of 0.2 and `max_symbols` 10 whatever the model).
#[test]
fn export_writes_the_model_s_own_settings() {
    let _turn = crate::serial();
    let device = Default::default();
    let a = nemo::import::<B>(&fixture(), false, &device).unwrap();
    assert_eq!(a.info.model.max_symbols, Some(10));
    for key in ["decoder.prednet.dropout", "joint.jointnet.dropout"] {
        assert!(a.info.ignored.iter().any(|i| i.starts_with(key)), "{key}: {:?}", a.info.ignored);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = a.info.model.clone();
    cfg.max_symbols = Some(3);
    let optim =
        nemo::config::OptimSettings { lr: 2e-4, betas: (0.9, 0.98), eps: 1e-8, weight_decay: 1e-3 };
    let out = dir.path().join("settings.nemo");
    nemo::export(&a.model, &cfg, &a.info.loss, Some(&optim), &a.tokenizer, &out).unwrap();
    let archive = asr_nemo::Archive::open(&out).unwrap();
    let float = |k: &str| archive.get(k).and_then(|v| v.as_f64());
    assert_eq!(archive.get("decoding.greedy.max_symbols").and_then(|v| v.as_i64()), Some(3));
    assert_eq!(float("decoder.prednet.dropout"), Some(0.0));
    assert_eq!(float("joint.jointnet.dropout"), Some(0.0));
    assert_eq!(float("optim.lr"), Some(2e-4));
    assert_eq!(float("optim.weight_decay"), Some(1e-3));
    assert_eq!(float("loss.tdt_kwargs.sigma"), Some(a.info.loss.sigma));
    let b = nemo::import::<B>(&out, false, &device).unwrap();
    assert_eq!(b.info.model, cfg);
    // Without an optimizer (an imported model's is not known) the section is left out.
    let bare = dir.path().join("bare.nemo");
    nemo::export(&a.model, &cfg, &a.info.loss, None, &a.tokenizer, &bare).unwrap();
    assert!(asr_nemo::Archive::open(&bare).unwrap().get("optim").is_none());
}

fn with_config(dir: &Path, name: &str, edit: impl FnOnce(String) -> String) -> PathBuf {
    with_config_of(&fixture(), dir, name, edit)
}

fn import_err(path: &Path) -> String {
    match nemo::import::<B>(path, false, &Default::default()) {
        Ok(_) => panic!("{} imported", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_archives_are_refused_with_the_key_and_both_shapes() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let key = "encoder.layers.1.self_attn.linear_q.weight";
    let p = with_state_dict(dir.path(), "shape.nemo", |sd| {
        let t = sd.iter_mut().find(|(k, _)| k == key).unwrap();
        t.1 = torch_file::TorchTensor::F32 { shape: vec![64, 32], values: vec![0.0; 64 * 32] };
    });
    let e = import_err(&p);
    assert!(e.contains(key) && e.contains("[64, 32]") && e.contains("[64, 64]"), "{e}");

    let p =
        with_state_dict(dir.path(), "missing.nemo", |sd| sd.retain(|(k, _)| k != "joint.enc.bias"));
    let e = import_err(&p);
    assert!(e.contains("joint.enc.bias"), "{e}");

    let p = with_state_dict(dir.path(), "extra.nemo", |sd| {
        sd.push((
            "encoder.extra_head.weight".into(),
            torch_file::TorchTensor::F32 { shape: vec![2], values: vec![1.0, 2.0] },
        ));
    });
    let e = import_err(&p);
    assert!(e.contains("encoder.extra_head.weight") && e.contains("--allow-unmapped"), "{e}");
    let ok = nemo::import::<B>(&p, true, &Default::default()).unwrap();
    assert_eq!(ok.report.unmapped, vec!["encoder.extra_head.weight".to_owned()]);

    // Truncated inside the weights: named, nothing imported.
    let full = std::fs::read(fixture()).unwrap();
    let cut = dir.path().join("cut.nemo");
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let e = import_err(&cut);
    assert!(e.contains("cut.nemo"), "{e}");

    // RNN-T without durations, CTC-only, another attention: refused by key.
    let p = with_config(dir.path(), "rnnt.nemo", |c| {
        c.replace("model_type: tdt", "model_type: rnnt")
            .replace("  durations:\n  - 0\n  - 1\n  - 2\n  - 3\n  - 4\n", "")
            .replace("    durations:\n    - 0\n    - 1\n    - 2\n    - 3\n    - 4\n", "")
    });
    let e = import_err(&p);
    assert!(e.contains("durations") && e.contains("not a TDT model"), "{e}");
    let p = with_config(dir.path(), "ctc.nemo", |c| {
        let cut = c.find("decoder:\n").unwrap();
        let end = c.find("decoding:\n").unwrap();
        format!("{}{}", &c[..cut], &c[end..])
    });
    let e = import_err(&p);
    assert!(e.contains("CTC-only"), "{e}");
    let p = with_config(dir.path(), "abs.nemo", |c| {
        c.replace("self_attention_model: rel_pos", "self_attention_model: abs_pos")
    });
    let e = import_err(&p);
    assert!(e.contains("encoder.self_attention_model") && e.contains("abs_pos"), "{e}");

    // A hybrid TDT-CTC model: the TDT part imports, the CTC head is named as ignored.
    let p = with_state_dict(dir.path(), "hybrid-sd.nemo", |sd| {
        sd.push((
            "ctc_decoder.decoder_layers.0.weight".into(),
            torch_file::TorchTensor::F32 { shape: vec![321, 64, 1], values: vec![0.5; 321 * 64] },
        ));
    });
    let hybrid = with_config_of(&p, dir.path(), "hybrid.nemo", |c| {
        format!("{c}aux_ctc:\n  ctc_loss_weight: 0.3\n")
    });
    let imp = nemo::import::<B>(&hybrid, false, &Default::default()).unwrap();
    assert!(imp.info.ignored.iter().any(|s| s.contains("CTC head")), "{:?}", imp.info.ignored);
    assert_eq!(imp.report.ignored.values().sum::<usize>(), 1 + 2, "{:?}", imp.report.ignored);

    // An import into an existing directory writes nothing.
    let target = dir.path().join("exists");
    std::fs::create_dir(&target).unwrap();
    let imp = nemo::import::<B>(&fixture(), false, &Default::default()).unwrap();
    let e = nemo::write_dir(&imp, &target).unwrap_err();
    assert!(matches!(e, ImportError::Io { .. }), "{e}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
}

/// [`with_config`] of another archive.
fn with_config_of(
    src: &Path,
    dir: &Path,
    name: &str,
    edit: impl FnOnce(String) -> String,
) -> PathBuf {
    let archive = asr_nemo::Archive::open(src).unwrap();
    let config = edit(archive.config_text().to_owned()).into_bytes();
    rewrite(src, dir, name, vec![(asr_nemo::CONFIG_MEMBER, config)])
}

fn asrt(args: &[&std::ffi::OsStr]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_asrt")).args(args).output().unwrap()
}

#[test]
fn import_and_export_on_the_command_line() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let imported = dir.path().join("imported");
    let f = fixture();
    let out = asrt(&["import".as_ref(), f.as_os_str(), "-o".as_ref(), imported.as_os_str()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("2 layers, d_model 64") && stdout.contains("105 tensors"), "{stdout}");
    assert!(stdout.contains("num_batches_tracked"), "{stdout}");
    for file in ["model.mpk", "nemo.json", "tokenizer.model", "model_config.yaml"] {
        assert!(imported.join(file).is_file(), "{file}");
    }
    // Importing over an existing directory is refused, naming it; it is left as it was.
    let again = asrt(&["import".as_ref(), f.as_os_str(), "-o".as_ref(), imported.as_os_str()]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    // Export of the directory imports to the same weights.
    let nemo_out = dir.path().join("out.nemo");
    let out = asrt(&["export".as_ref(), imported.as_os_str(), "-o".as_ref(), nemo_out.as_os_str()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let device = Default::default();
    let a = nemo::import::<B>(&f, false, &device).unwrap();
    let b = nemo::import::<B>(&nemo_out, false, &device).unwrap();
    let (pa, pb) = (
        asr_trainer::checkpoint::parameters(&a.model).unwrap(),
        asr_trainer::checkpoint::parameters(&b.model).unwrap(),
    );
    assert!(pa == pb, "the exported weights differ from the imported ones");
    // A foreign tokenizer is refused by hash.
    let foreign = dir.path().join("foreign.model");
    let mut bytes = a.tokenizer.clone();
    // One more piece ("x", score 0): a readable model of another size and hash.
    bytes.extend_from_slice(b"\x0a\x08\x0a\x01x\x15\x00\x00\x00\x00");
    std::fs::write(&foreign, &bytes).unwrap();
    let out = asrt(&[
        "export".as_ref(),
        imported.as_os_str(),
        "-o".as_ref(),
        dir.path().join("bad.nemo").as_os_str(),
        "--tokenizer".as_ref(),
        foreign.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not the one given"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.path().join("bad.nemo").exists());
}
