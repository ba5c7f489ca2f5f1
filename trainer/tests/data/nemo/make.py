#!/usr/bin/env python3
"""Makes the NeMo parity fixture that `asrt import` is tested against.

With NeMo (`pip install "nemo_toolkit[asr]==2.7.3"`, CPU is enough) this script:

1. builds a small FastConformer-TDT with Parakeet's architecture (2 layers, d_model 64, 4 heads,
   two LSTM layers in the prediction network, 5 durations) over the example corpus's
   SentencePiece model (examples/espeak/spm.model, 320 pieces), perturbs every parameter and
   BatchNorm statistic so that a swapped or transposed tensor cannot go unnoticed, and saves it
   as `tiny-tdt.nemo`;
2. runs NeMo's own modules, in eval mode, on three of the example corpus's 16 kHz utterances as
   one padded batch, and records in `tiny-tdt.outputs.safetensors`: the PCM, mel features,
   encoder output, joint logits for the reference tokens, NeMo's pure-PyTorch TDT loss per
   utterance (`TDTLossPytorch`, run on the CPU), and the greedy TDT hypotheses (tokens and text,
   also in `tiny-tdt.outputs.json`);
3. writes `parakeet-tdt-0.6b.shapes.json`: every state-dict key and shape of a NeMo model with
   Parakeet-TDT-0.6B-v2's architecture (random weights; no download), and its parameter count.

`--check-export FILE.nemo` instead restores FILE (a `.nemo` written by `asrt export`) with
`ASRModel.restore_from` and checks that it reproduces the recorded outputs.
`--parakeet-state-dict OUT.ckpt` also saves the 0.6B-shaped state dict itself (2.5 GB) for
`ASRT_PARAKEET_STATE_DICT=OUT.ckpt cargo test ... parakeet_state_dict`.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import soundfile
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "espeak")
DURATIONS = [0, 1, 2, 3, 4]
SIGMA = 0.05
# Three 16 kHz mono 16-bit sentences of the example corpus, of different lengths.
UTTERANCES = ("en-0001", "hi-0001", "ta-0001")


def model_config(tokenizer_dir, d_model, layers, heads, features, channels, pred, pred_layers,
                 joint):
    return {
        "sample_rate": 16000,
        "compute_eval_loss": False,
        "rnnt_reduction": "mean_batch",
        "tokenizer": {"dir": tokenizer_dir, "type": "bpe"},
        "model_defaults": {"enc_hidden": d_model, "pred_hidden": pred, "joint_hidden": joint},
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "sample_rate": 16000, "normalize": "per_feature", "window_size": 0.025,
            "window_stride": 0.01, "window": "hann", "features": features, "n_fft": 512,
            "log": True, "frame_splicing": 1, "dither": 1e-5, "pad_to": 0, "pad_value": 0.0,
        },
        "spec_augment": {
            "_target_": "nemo.collections.asr.modules.SpectrogramAugmentation",
            "freq_masks": 2, "time_masks": 10, "freq_width": 27, "time_width": 0.05,
        },
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": features, "feat_out": -1, "n_layers": layers, "d_model": d_model,
            "subsampling": "dw_striding", "subsampling_factor": 8,
            "subsampling_conv_channels": channels, "causal_downsampling": False,
            "ff_expansion_factor": 4, "self_attention_model": "rel_pos", "n_heads": heads,
            "att_context_size": [-1, -1], "xscaling": True, "untie_biases": True,
            "pos_emb_max_len": 5000, "conv_kernel_size": 9, "conv_norm_type": "batch_norm",
            "conv_context_size": None, "dropout": 0.1, "dropout_pre_encoder": 0.1,
            "dropout_emb": 0.0, "dropout_att": 0.1,
        },
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder",
            "normalization_mode": None, "random_state_sampling": False, "blank_as_pad": True,
            "prednet": {"pred_hidden": pred, "pred_rnn_layers": pred_layers, "t_max": None,
                        "dropout": 0.2},
        },
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint",
            "log_softmax": None, "preserve_memory": False, "fuse_loss_wer": False,
            "num_extra_outputs": len(DURATIONS),
            "jointnet": {"joint_hidden": joint, "activation": "relu", "dropout": 0.2},
        },
        "decoding": {
            "strategy": "greedy_batch", "model_type": "tdt", "durations": DURATIONS,
            "greedy": {"max_symbols": 10},
        },
        "loss": {
            "loss_name": "tdt",
            "tdt_kwargs": {"fastemit_lambda": 0.0, "clamp": -1.0, "durations": DURATIONS,
                           "sigma": SIGMA, "omega": 0.0},
        },
        "optim": {"name": "adamw", "lr": 1e-3},
    }


def write_tokenizer_dir(d):
    """tokenizer.model, tokenizer.vocab and vocab.txt, as NeMo's tokenizer script lays them out."""
    import sentencepiece
    shutil.copy(os.path.join(EXAMPLE, "spm.model"), os.path.join(d, "tokenizer.model"))
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    with open(os.path.join(d, "tokenizer.vocab"), "w", encoding="utf-8") as f:
        for i, p in enumerate(pieces):
            f.write(f"{p}\t{sp.get_score(i)}\n")
    with open(os.path.join(d, "vocab.txt"), "w", encoding="utf-8") as f:
        for p in pieces:
            f.write((p[1:] if p.startswith("\u2581") else "##" + p) + "\n")


def build(cfg):
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    return EncDecRNNTBPEModel(cfg=OmegaConf.create(cfg))


def perturb(model, seed):
    """Moves every parameter and BatchNorm statistic off its initial value (zeros, ones)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


def utterances():
    """The fixture's sentences of the example corpus: (id, text, int16 PCM)."""
    out = []
    with open(os.path.join(EXAMPLE, "sentences.tsv"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                continue
            uid, _label, text, rate, channels, bits = line.rstrip("\n").split("\t")
            if uid in UTTERANCES:
                assert (rate, channels, bits) == ("16000", "1", "16")
                path = os.path.join(EXAMPLE, "audio", "shard-000", uid + ".flac")
                pcm, sr = soundfile.read(path, dtype="int16")
                assert sr == 16000 and pcm.ndim == 1
                out.append((uid, text, pcm))
    return out


def run(model, utts):
    """NeMo's outputs on the utterances, as one padded batch."""
    model.eval()
    tok = model.tokenizer
    lens = torch.tensor([len(p) for _, _, p in utts])
    pcm = torch.zeros(len(utts), int(lens.max()), dtype=torch.int16)
    for i, (_, _, p) in enumerate(utts):
        pcm[i, : len(p)] = torch.from_numpy(p)
    ids = [tok.text_to_ids(text) for _, text, _ in utts]
    tlens = torch.tensor([len(x) for x in ids])
    targets = torch.zeros(len(utts), int(tlens.max()), dtype=torch.long)
    for i, x in enumerate(ids):
        targets[i, : len(x)] = torch.tensor(x)
    with torch.no_grad():
        signal = pcm.float() / 32768.0
        feats, flens = model.preprocessor(input_signal=signal, length=lens)
        enc, elens = model.encoder(audio_signal=feats, length=flens)
        dec, _, _ = model.decoder(targets=targets, target_length=tlens)
        f = model.joint.project_encoder(enc.transpose(1, 2))
        g = model.joint.project_prednet(dec.transpose(1, 2))
        logits = model.joint.joint_net(f.unsqueeze(2) + g.unsqueeze(1))  # raw, [B, T, U+1, C]
        loss = tdt_loss(logits, targets, elens, tlens, tok.vocab_size)
        hyps = model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=enc, encoded_lengths=elens, return_hypotheses=True)
    hyps = hyps[0] if isinstance(hyps, tuple) else hyps
    tokens = [[int(t) for t in h.y_sequence] for h in hyps]
    texts = [tok.ids_to_text(t) for t in tokens]
    greedy = torch.full((len(utts), max(1, max(len(t) for t in tokens))), -1, dtype=torch.int64)
    for i, t in enumerate(tokens):
        greedy[i, : len(t)] = torch.tensor(t, dtype=torch.int64)
    tensors = {
        "pcm": pcm, "pcm_lens": lens.to(torch.int64),
        "features": feats.contiguous(), "feature_lens": flens.to(torch.int64),
        "encoder": enc.contiguous(), "encoder_lens": elens.to(torch.int64),
        "targets": targets.to(torch.int64), "target_lens": tlens.to(torch.int64),
        "logits": logits.contiguous(), "loss": loss.to(torch.float64),
        "greedy": greedy,
    }
    meta = {"ids": [u for u, _, _ in utts], "texts": [t for _, t, _ in utts],
            "greedy_texts": texts}
    return tensors, meta


def tdt_loss(logits, targets, elens, tlens, vocab):
    """NeMo's pure-PyTorch TDT loss (`TDTLossPytorch`), per utterance. It places its work on
    CUDA with `.cuda()`; on this CPU-only run that call is made a no-op."""
    from nemo.collections.asr.losses.rnnt_pytorch import TDTLossPytorch
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        loss = TDTLossPytorch(blank=vocab, durations=DURATIONS, reduction="none", sigma=SIGMA)
        return loss(acts=logits.double(), labels=targets, act_lens=elens, label_lens=tlens)
    finally:
        torch.Tensor.cuda = cuda


def parakeet_shapes(tokenizer_dir, save_to=None):
    """Key -> shape of a model with Parakeet-TDT-0.6B-v2's architecture (vocabulary 1024)."""
    from nemo.collections.asr.models import EncDecRNNTModel
    cfg = model_config(tokenizer_dir, 1024, 24, 8, 128, 256, 640, 2, 640)
    cfg.pop("tokenizer")
    labels = [f"t{i}" for i in range(1024)]
    cfg["labels"] = labels
    cfg["decoder"]["vocab_size"] = 1024
    cfg["joint"]["num_classes"] = 1024
    cfg["joint"]["vocabulary"] = labels
    torch.manual_seed(0)
    model = EncDecRNNTModel(cfg=OmegaConf.create(cfg))
    sd = model.state_dict()
    params = sum(p.numel() for p in model.parameters())
    if save_to:
        torch.save(sd, save_to)
    return {"parameters": params,
            "keys": {k: list(v.shape) for k, v in sd.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-export", metavar="FILE.nemo")
    ap.add_argument("--parakeet-state-dict", metavar="OUT.ckpt")
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    utts = utterances()

    if args.check_export:
        from nemo.collections.asr.models import ASRModel
        model = ASRModel.restore_from(args.check_export, map_location="cpu")
        tensors, meta = run(model, utts)
        want = load_file(os.path.join(args.out, "tiny-tdt.outputs.safetensors"))
        ok = True
        for k, v in tensors.items():
            w = want[k]
            if v.dtype.is_floating_point:
                d = float((v.double() - w.double()).abs().max())
                scale = float(w.double().abs().max())
                print(f"{k}: max |diff| {d:.3e} (max |value| {scale:.3e})")
                ok &= d <= 1e-4 * max(1.0, scale)
            else:
                same = torch.equal(v, w)
                print(f"{k}: {'equal' if same else 'DIFFERENT'}")
                ok &= same
        with open(os.path.join(args.out, "tiny-tdt.outputs.json"), encoding="utf-8") as f:
            ok &= json.load(f)["greedy_texts"] == meta["greedy_texts"]
        print("export reproduces NeMo's outputs" if ok else "export DIFFERS")
        sys.exit(0 if ok else 1)

    tmp = tempfile.mkdtemp()
    try:
        write_tokenizer_dir(tmp)
        torch.manual_seed(1234)
        cfg = model_config(tmp, 64, 2, 4, 80, 32, 64, 2, 64)
        model = build(cfg)
        perturb(model, 99)
        model.eval()
        model.save_to(os.path.join(args.out, "tiny-tdt.nemo"))
        tensors, meta = run(model, utts)
        save_file(tensors, os.path.join(args.out, "tiny-tdt.outputs.safetensors"))
        import nemo
        meta["made_with"] = {"nemo_toolkit": nemo.__version__, "torch": torch.__version__}
        with open(os.path.join(args.out, "tiny-tdt.outputs.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, ensure_ascii=False)
            f.write("\n")
        shapes = parakeet_shapes(tmp, args.parakeet_state_dict)
        with open(os.path.join(args.out, "parakeet-tdt-0.6b.shapes.json"), "w",
                  encoding="utf-8") as f:
            json.dump(shapes, f, indent=0)
            f.write("\n")
        print(f"texts: {meta['greedy_texts']}; loss {tensors['loss'].tolist()}; "
              f"0.6B-shaped parameters {shapes['parameters']}")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
