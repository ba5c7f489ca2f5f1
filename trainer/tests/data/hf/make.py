#!/usr/bin/env python3
"""Records what transformers' own user API computes from `asrt export --format hf` of the NeMo fixture.

Environment (CPU only; what this fixture was made with): a venv with transformers 5.17.0 and torch from PyPI
(`python3 -m venv ~/.cache/asr-torch-venv && ~/.cache/asr-torch-venv/bin/pip install torch numpy safetensors
sentencepiece protobuf librosa transformers==5.17.0`); the versions used are recorded in expected.json.

Make (from the repository root, after `cargo build -p asr-trainer --bin asrt`):
    ~/.cache/asr-torch-venv/bin/python trainer/tests/data/hf/make.py [--asrt PATH]
Check an export against the recording (what trainer/tests/it/hf.rs runs when such a Python exists):
    PYTHON trainer/tests/data/hf/make.py --check DIR [--model tiny|blank-row]

Making, it exports ../nemo/tiny-tdt.nemo and ../nemo/transcribe/blank-row.nemo (the same model with the blank
row of the prediction network's embedding set to 3.0) with `asrt export --format hf`, then for each:
  - loads the directory with `ParakeetForTDT.from_pretrained` (float32, its default SDPA attention) and
    `AutoProcessor.from_pretrained`, recording the loading report (missing, unexpected, mismatched keys);
  - records the state-dict keys and shapes of transformers' own model built from the exported config.json;
  - runs the processor and `generate()` on each of the three fixture utterances (the PCM recorded in
    ../nemo/tiny-tdt.outputs.safetensors), recording the emitted token ids, their encoder frames and
    durations, and `processor.decode(..., durations=...)`'s text and times;
  - records the joint's logits over the lattice of each greedy hypothesis (`model(input_features,
    attention_mask, decoder_input_ids=[blank] + tokens)`): every valid encoder frame, the first 8 label
    positions; and the same from NeMo's recorded mel features (the network alone), with the largest
    difference between transformers' features and NeMo's;
  - for the tokenizer: whether the exported tokenizer.json equals, as JSON, the one transformers' own
    `ParakeetConverter` builds from the same SentencePiece model with the same added tokens, and the ids
    the exported tokenizer gives the fixture's texts (and SentencePiece's own ids, for comparison).
It writes expected.json and expected.safetensors beside itself.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "../../../.."))
NEMO = os.path.join(HERE, "../nemo")
MODELS = {"tiny": os.path.join(NEMO, "tiny-tdt.nemo"), "blank-row": os.path.join(NEMO, "transcribe/blank-row.nemo")}
SPM = os.path.join(REPO, "examples/espeak/spm.model")
LOGIT_POSITIONS = 8


def pcm():
    from safetensors.numpy import load_file

    t = load_file(os.path.join(NEMO, "tiny-tdt.outputs.safetensors"))
    x, lens = t["pcm"].astype(np.float32) / 32768.0, t["pcm_lens"].astype(np.int64)
    return [x[b, : lens[b]] for b in range(x.shape[0])]


def converter_tokenizer_json(blank_pad):
    """tokenizer.json as transformers' conversion (convert_nemo_to_hf.write_processor) builds it."""
    from tokenizers import AddedToken
    from transformers import ParakeetTokenizer
    from transformers.convert_slow_tokenizer import ParakeetConverter

    tok = ParakeetTokenizer(tokenizer_object=ParakeetConverter(SPM).converted(), clean_up_tokenization_spaces=False)
    tok.add_tokens([AddedToken("<blank>", normalized=False, special=True)])
    # This SentencePiece model has no <pad>: the export pads with the blank (see hf/tokenizer.rs).
    pad = "<blank>" if blank_pad else "<pad>"
    tok.add_special_tokens({"pad_token": AddedToken(pad, normalized=False, special=True),
                            "unk_token": AddedToken("<unk>", normalized=False, special=True)})
    d = tempfile.mkdtemp()
    try:
        tok.save_pretrained(d)
        return json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    finally:
        shutil.rmtree(d)


def run_model(d):
    from transformers import AutoProcessor, ParakeetForTDT, ParakeetTDTConfig

    processor = AutoProcessor.from_pretrained(d)
    # The default attention (SDPA). With attn_implementation="eager" transformers 5.17.0 gives NaN encoder
    # outputs for the shorter utterances of a padded batch (its masked scores are -inf, and a fully masked
    # padding row's softmax spreads through the convolution module), so generate() emits token 0 there.
    model, info = ParakeetForTDT.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    model.eval()
    report = {k: sorted(map(str, v)) for k, v in info.items() if k in ("missing_keys", "unexpected_keys",
                                                                        "mismatched_keys")}
    fresh = ParakeetForTDT(ParakeetTDTConfig.from_pretrained(d))
    keys = {k: list(v.shape) for k, v in fresh.state_dict().items()}
    cfg = model.config
    blank, vocab = cfg.blank_token_id, cfg.vocab_size
    utts, tensors = [], {}
    from safetensors.numpy import load_file

    rec = load_file(os.path.join(NEMO, "tiny-tdt.outputs.safetensors"))
    nemo_feats, nemo_lens = rec["features"].astype(np.float32), rec["feature_lens"].astype(np.int64)
    # One utterance per call, as a user transcribes a file. In a padded batch transformers 5.17.0's
    # generate() goes on decoding a shorter utterance past its last encoder frame (tokens at frames beyond
    # its length until the longest is done), so a batch is not the reference.
    for b, audio in enumerate(pcm()):
        inputs = processor(audio, sampling_rate=16000, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(input_features=inputs["input_features"], attention_mask=inputs["attention_mask"])
        texts, stamps = processor.decode(out.sequences, durations=out.durations, skip_special_tokens=True)
        ids, dur = out.sequences[0], out.durations[0]
        frame = dur.cumsum(-1) - dur
        keep = ids != blank
        u = {"tokens": ids[keep].tolist(), "frames": frame[keep].tolist(), "durations": dur[keep].tolist(),
             "text": texts[0], "timestamps": stamps[0]}
        utts.append(u)
        # The lattice of the greedy hypothesis: [blank] + tokens through the prediction network.
        y = torch.tensor([[blank] + u["tokens"]], dtype=torch.long)
        with torch.no_grad():
            res = model(input_features=inputs["input_features"], attention_mask=inputs["attention_mask"],
                        decoder_input_ids=y)
            enc = model.get_audio_features(input_features=inputs["input_features"],
                                           attention_mask=inputs["attention_mask"])
        n = int(enc.attention_mask.sum())
        tensors[f"logits.{b}"] = res.logits[0, :n, :LOGIT_POSITIONS].contiguous().to(torch.float32)
        # The same lattice from NeMo's recorded mel features (which asrt's front end reproduces): the
        # network alone, without transformers' feature extractor.
        f = torch.from_numpy(nemo_feats[b, :, : nemo_lens[b]].T.copy())[None]
        with torch.no_grad():
            res2 = model(input_features=f, attention_mask=torch.ones(f.shape[:2], dtype=torch.long),
                         decoder_input_ids=y)
        tensors[f"net_logits.{b}"] = res2.logits[0, :n, :LOGIT_POSITIONS].contiguous().to(torch.float32)
        hf_f = inputs["input_features"][0, : nemo_lens[b]]
        u["features_max_abs_diff_vs_nemo"] = float((hf_f - f[0]).abs().max())
    return {"report": report, "model_keys": keys, "vocab_size": vocab, "blank": blank,
            "pad_token_id": cfg.pad_token_id, "utterances": utts}, tensors, processor


def tokenizer_facts(d, processor):
    ours = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    ref = converter_tokenizer_json(blank_pad=True)
    differ = sorted(k for k in set(ours) | set(ref) if ours.get(k) != ref.get(k))
    texts = json.load(open(os.path.join(NEMO, "tiny-tdt.outputs.json"), encoding="utf-8"))["texts"]
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=SPM)
    return {"equals_converter": not differ, "differing_sections": differ,
            "texts": texts, "ids": [processor.tokenizer(t, add_special_tokens=False).input_ids for t in texts],
            "sentencepiece_ids": [sp.encode(t) for t in texts]}


def check(d, which):
    want = json.load(open(os.path.join(HERE, "expected.json"), encoding="utf-8"))["models"][which]
    got, _, processor = run_model(d)
    problems = []
    if any(got["report"].values()):
        problems.append(f"loading report: {got['report']}")
    for k in ("model_keys", "vocab_size", "blank", "pad_token_id"):
        if got[k] != want[k]:
            problems.append(f"{k} differs")
    for b, (g, w) in enumerate(zip(got["utterances"], want["utterances"])):
        for k in ("tokens", "frames", "durations", "text"):
            if g[k] != w[k]:
                problems.append(f"utterance {b}: {k}: transformers now gives {g[k]}, recorded {w[k]}")
    if which == "tiny":
        t = tokenizer_facts(d, processor)
        if not t["equals_converter"]:
            problems.append(f"tokenizer.json differs from ParakeetConverter's in {t['differing_sections']}")
    for p in problems:
        print("MISMATCH:", p)
    print(f"{which}: {'OK' if not problems else 'FAILED'}: {len(got['utterances'])} utterances through "
          f"ParakeetForTDT.from_pretrained + generate()")
    return 0 if not problems else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--asrt", default=os.path.join(os.environ.get("CARGO_TARGET_DIR",
                    os.path.expanduser("~/.cache/asr-target")), "debug/asrt"))
    ap.add_argument("--check", metavar="DIR")
    ap.add_argument("--model", default="tiny", choices=sorted(MODELS))
    a = ap.parse_args()
    torch.manual_seed(0)
    if a.check:
        return check(a.check, a.model)
    import safetensors.torch
    import transformers

    work = tempfile.mkdtemp()
    models, tensors = {}, {}
    try:
        for name, src in MODELS.items():
            d = os.path.join(work, name)
            subprocess.run([a.asrt, "export", src, "--format", "hf", "-o", d], check=True)
            rec, ts, processor = run_model(d)
            if name == "tiny":
                rec["tokenizer"] = tokenizer_facts(d, processor)
            models[name] = rec
            tensors.update({f"{name}.{k}": v for k, v in ts.items()})
    finally:
        shutil.rmtree(work)
    meta = {"made_with": {"transformers": transformers.__version__, "torch": torch.__version__,
                          "python": sys.version.split()[0]},
            "logit_positions": LOGIT_POSITIONS, "models": models}
    with open(os.path.join(HERE, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    safetensors.torch.save_file(tensors, os.path.join(HERE, "expected.safetensors"))
    for name, rec in models.items():
        print(name, "report", rec["report"], "tokens", [len(u["tokens"]) for u in rec["utterances"]])
    print("tokenizer equals ParakeetConverter's:", models["tiny"]["tokenizer"]["equals_converter"],
          models["tiny"]["tokenizer"]["differing_sections"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
