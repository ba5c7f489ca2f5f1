//! `asrt import` and `asrt export`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context};
use burn::backend::NdArray;

use crate::checkpoint;
use crate::cli::{ExportArgs, ExportFormat, ImportArgs};
use crate::model_source::{Expected, ModelSource, TokenizerId};
use crate::nemo;

/// Runs `asrt import`.
pub fn import(args: &ImportArgs) -> anyhow::Result<ExitCode> {
    let device = Default::default();
    let imported = nemo::import::<NdArray>(&args.model, args.allow_unmapped, &device)?;
    nemo::write_dir(&imported, &args.out)?;
    let (i, r) = (&imported.info, &imported.report);
    let e = &i.model.encoder;
    println!(
        "imported {} ({}): {} layers, d_model {}, {} heads, ff {}, {} mel bands, prediction {}x{}, \
         joint {}, durations {:?}, vocabulary {} (tokenizer model_xxh3 {})",
        args.model.display(),
        i.class,
        e.n_layers,
        e.d_model,
        e.n_heads,
        e.ff_dim,
        i.model.preprocessor.features,
        i.model.decoder.pred_rnn_layers,
        i.model.decoder.pred_hidden,
        i.model.joint.joint_hidden,
        i.model.durations,
        i.vocab,
        i.tokenizer_xxh3
    );
    println!(
        "{} tensors, {} values ({} trainable parameters); written to {}",
        r.tensors,
        r.parameters,
        nemo::weights::parameter_count(&i.model, i.vocab),
        args.out.display()
    );
    for (what, n) in &r.ignored {
        println!("ignored: {what}: {n} key(s)");
    }
    for what in &i.ignored {
        println!("ignored: {what}");
    }
    if !r.unmapped.is_empty() {
        println!("unmapped keys let through (--allow-unmapped): {}", r.unmapped.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

/// The tokenizer model bytes of a corpus, a `.nemo` or a SentencePiece model file.
pub(crate) fn tokenizer_from(path: &Path) -> anyhow::Result<Vec<u8>> {
    let ext = path.extension().map(|e| e.to_string_lossy().to_lowercase()).unwrap_or_default();
    Ok(match ext.as_str() {
        "nemo" => asr_nemo::Archive::open(path)?.tokenizer_model()?.to_vec(),
        "asrcorpus" => asr_corpus::Corpus::open(path)
            .with_context(|| format!("opening {}", path.display()))?
            .tokenizer_model()
            .to_vec(),
        _ => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    })
}

/// Runs `asrt export`.
pub fn export(args: &ExportArgs) -> anyhow::Result<ExitCode> {
    let device = Default::default();
    if args.out.exists() && !args.force {
        bail!("{} exists (pass --force to replace it)", args.out.display());
    }
    let source = ModelSource::resolve(&args.checkpoint)?;
    let loaded = source.load::<NdArray>(None, false, &device)?;
    let tokenizer = match (&args.tokenizer, loaded.tokenizer_model) {
        (Some(p), _) => tokenizer_from(p)?,
        (None, Some(t)) => t,
        (None, None) => {
            // A checkpoint carries no tokenizer: its first corpus has the one it trained with.
            let state = checkpoint::load_state(source.path())?;
            let Some(corpus) = state.corpora.first() else {
                bail!(
                    "{}: the checkpoint names no corpus; give the tokenizer with --tokenizer",
                    source.path().display()
                );
            };
            tokenizer_from(&corpus.path)
                .with_context(|| format!("the tokenizer (from {})", corpus.path.display()))?
        }
    };
    let given = TokenizerId {
        xxh3: nemo::tokenizer_hash(&tokenizer),
        vocab: crate::tokenizer::Pieces::parse(&tokenizer)?.len(),
    };
    source.check_tokenizer(&loaded.info, &given, Expected::Given)?;
    let (model, info, from) = (loaded.model, loaded.info, source.path().to_owned());
    let cfg = &info.model;
    let vocab = crate::tokenizer::Pieces::parse(&tokenizer)?.len();
    if args.format == ExportFormat::Hf {
        let done = crate::hf::export(&model, cfg, &tokenizer, &args.out, args.force)?;
        println!(
            "exported {} to {} for transformers' ParakeetForTDT ({} tensors, {} trainable \
             parameters, vocabulary {vocab} + blank {vocab}, durations {:?}): {}",
            from.display(),
            args.out.display(),
            done.tensors,
            nemo::weights::parameter_count(cfg, vocab),
            cfg.durations,
            crate::hf::FILES.join(", ")
        );
        return Ok(ExitCode::SUCCESS);
    }
    nemo::export(&model, cfg, &info.loss, info.optim.as_ref(), &tokenizer, &args.out)?;
    println!(
        "exported {} to {} ({} trainable parameters, vocabulary {vocab}, durations {:?})",
        from.display(),
        args.out.display(),
        nemo::weights::parameter_count(cfg, vocab),
        cfg.durations
    );
    Ok(ExitCode::SUCCESS)
}
