#!/usr/bin/env python3
"""Records what NeMo's user API, `model.transcribe(...)`, returns for `../tiny-tdt.nemo`.

Environment (CPU only; what this fixture was made with):
    ~/.cache/asr-nemo-venv, Python 3.11.7, nemo_toolkit 2.7.3 (`pip install "nemo_toolkit[asr]==2.7.3"`,
    all from PyPI), torch 2.15.0 (the PyPI wheel, +cu132 build, run on the CPU), lightning 2.4.0,
    pytorch-lightning 2.6.6, omegaconf 2.3.0, hydra-core 1.3.2, transformers 4.57.6, huggingface_hub 0.36.2,
    lhotse 1.33.0, soundfile 0.14.0, numpy 2.4.6. See README.md beside this file for how it was built.

Run from anywhere (it finds the repository from its own path; takes about a minute on 2 cores):
    ~/.cache/asr-nemo-venv/bin/python trainer/tests/data/nemo/transcribe/make.py

It writes, beside itself:
    expected.json   per utterance: audio file, text, token ids (y_sequence), per-token frame (timestamp),
                    per-token duration (token_duration) and the `timestamp` dict NeMo returns
                    (timestep / char / word / segment, offsets in encoder frames and start/end in seconds);
                    the model's window_stride, subsampling factor, cfg.decoding; whether transcribe() ran
                    out of the box (and the exact error and fix if not); the blank-row experiment (which
                    vector the prediction network gets at the first decoding step); NeMo's own word/segment
                    timestamps for hand-made token sequences; file:line citations into NeMo 2.7.3's source.
    blank-row.nemo  tiny-tdt.nemo with the blank row of the prediction network's embedding set to 3.0, kept
                    only when its greedy_batch hypotheses differ from a zero-vector start.

The audio is the same three utterances that ../make.py used (en-0001, hi-0001, ta-0001), read by NeMo from
the FLAC files of the example corpus (examples/espeak/audio/shard-000/<id>.flac, 16 kHz mono 16 bit);
the script checks that these files hold exactly the PCM recorded in ../tiny-tdt.outputs.safetensors.
"""

import copy
import inspect
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import soundfile
import torch
from omegaconf import OmegaConf, open_dict
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
NEMO_DIR = os.path.dirname(HERE)
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", "..", ".."))
UTTERANCES = ("en-0001", "hi-0001", "ta-0001")  # as in ../make.py
AUDIO = [os.path.join("examples", "espeak", "audio", "shard-000", u + ".flac") for u in UTTERANCES]
BATCH_SIZE = 3  # one padded batch, as ../make.py ran them
BLANK_ROW_FILL = 3.0
BLANK_ROW_RANDN_SCALE, BLANK_ROW_RANDN_SEED = 5.0, 0


def restore():
    from nemo.collections.asr.models import ASRModel
    m = ASRModel.restore_from(os.path.join(NEMO_DIR, "tiny-tdt.nemo"), map_location="cpu")
    m.eval()
    return m


def audio_paths():
    return [os.path.join(ROOT, a) for a in AUDIO]


def add_validation_ds(model):
    """The user-level workaround: tiny-tdt.nemo's config has no `validation_ds`, which
    EncDecRNNTBPEModel._setup_transcribe_dataloader reads (`self.cfg.validation_ds.get(...)`)."""
    with open_dict(model.cfg):
        model.cfg.validation_ds = {}


def jsonable(x):
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def hyp_record(model, audio, h):
    tok = model.tokenizer
    ids = [int(t) for t in jsonable(h.y_sequence)]
    ts = h.timestamp
    rec = {
        "audio": audio,
        "text": h.text,
        "y_sequence": ids,
        "pieces": tok.ids_to_tokens(ids) if ids else [],
        "score": float(h.score),
        "encoded_length": int(jsonable(h.length)),
    }
    # per-token frame index and duration, as the hypothesis holds them
    if isinstance(ts, dict):
        rec["timestep"] = jsonable(ts.get("timestep"))
    else:
        rec["timestep"] = jsonable(ts)
    rec["token_duration"] = jsonable(h.token_duration) if h.token_duration is not None else None
    rec["timestamp"] = jsonable(ts)
    return rec


def transcribe(model, **kw):
    out = model.transcribe(audio_paths(), batch_size=BATCH_SIZE, timestamps=True, return_hypotheses=True,
                           verbose=False, **kw)
    if isinstance(out, tuple):  # (best, all) in some configurations
        out = out[0]
    return [hyp_record(model, a, h) for a, h in zip(AUDIO, out)]


def short(recs):
    return [{"y_sequence": r["y_sequence"], "timestep": r["timestep"], "token_duration": r["token_duration"]}
            for r in recs]


def load_pcm():
    """The utterances as float32 in [-1, 1), checked against ../tiny-tdt.outputs.safetensors."""
    want = load_file(os.path.join(NEMO_DIR, "tiny-tdt.outputs.safetensors"))
    out = []
    for i, p in enumerate(audio_paths()):
        pcm, sr = soundfile.read(p, dtype="int16")
        assert sr == 16000 and pcm.ndim == 1
        n = int(want["pcm_lens"][i])
        assert n == len(pcm) and torch.equal(want["pcm"][i, :n], torch.from_numpy(pcm)), p
        out.append(pcm.astype(np.float32) / 32768.0)
    return out


@torch.no_grad()
def encode(model, pcms):
    lens = torch.tensor([len(p) for p in pcms])
    x = torch.zeros(len(pcms), int(lens.max()))
    for i, p in enumerate(pcms):
        x[i, : len(p)] = torch.from_numpy(p)
    enc, elens = model.forward(input_signal=x, input_signal_length=lens)  # [B, D, T]
    return enc, elens


@torch.no_grad()
def manual_greedy_tdt(model, enc, elen, start):
    """Greedy TDT for one utterance, written out: the same rules as NeMo's label-looping decoder
    (blank => duration at least 1; max_symbols tokens on one frame => move on one frame), with the
    prediction network's first input either the embedding of the blank id (`start="blank_row"`, what
    GreedyBatchedTDTInfer does) or a zero vector (`start="zero"`, what GreedyTDTInfer / training's
    add_sos do)."""
    dec, joint = model.decoder, model.joint
    durations = [int(d) for d in model.cfg.decoding.durations]
    nd = len(durations)
    blank = dec.blank_idx
    max_symbols = model.cfg.decoding.greedy.get("max_symbols", None)
    f = joint.project_encoder(enc.transpose(0, 1).unsqueeze(0))  # [1, T, H]
    if start == "zero":
        g, state = dec.predict(None, None, add_sos=False, batch_size=1)
    elif start == "blank_row":
        g, state = dec.predict(torch.tensor([[blank]]), None, add_sos=False, batch_size=1)
    else:
        raise ValueError(start)
    g = joint.project_prednet(g)
    t, T = 0, int(elen)
    ids, frames, durs = [], [], []
    while t < T:
        logits = joint.joint_after_projection(f[:, t : t + 1], g)[0, 0, 0]
        k = int(logits[:-nd].argmax())
        d = durations[int(logits[-nd:].argmax())]
        if k == blank:
            t += max(d, 1)
            continue
        ids.append(k)
        frames.append(t)
        durs.append(d)
        g, state = dec.predict(torch.tensor([[k]]), state, add_sos=False, batch_size=1)
        g = joint.project_prednet(g)
        t += d
        if max_symbols is not None and d == 0 and frames.count(frames[-1]) >= max_symbols:
            t += 1
    return {"y_sequence": ids, "timestep": frames, "token_duration": durs}


def manual_all(model, pcms, start):
    # transcribe() leaves encoder, decoder and joint in training mode (its teardown calls
    # NeMoModule.unfreeze(partial=True), which ends with self.train()): dropout would be on.
    model.eval()
    enc, elens = encode(model, pcms)
    return [manual_greedy_tdt(model, enc[i], elens[i], start) for i in range(len(pcms))]


def with_strategy(model, strategy):
    cfg = copy.deepcopy(model.cfg.decoding)
    with open_dict(cfg):
        cfg.strategy = strategy
    model.change_decoding_strategy(cfg, verbose=False)


def set_blank_row(model, row):
    with torch.no_grad():
        model.decoder.prediction.embed.weight[model.decoder.blank_idx].copy_(row)


def cite(obj, needle, nth=1):
    """path:line (path relative to site-packages) of the nth line of obj's source file holding needle."""
    path = inspect.getsourcefile(obj)
    seen = 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if needle in line:
                seen += 1
                if seen == nth:
                    rel = path[path.index("nemo" + os.sep):]
                    return f"{rel}:{i}"
    raise LookupError(f"{needle!r} not in {path}")


def sources():
    from nemo.collections.asr.models import rnnt_bpe_models, rnnt_models
    from nemo.collections.asr.modules import rnnt
    from nemo.collections.asr.parts.submodules import rnnt_decoding, rnnt_greedy_decoding
    from nemo.collections.asr.parts.submodules.transducer_decoding import tdt_label_looping
    from nemo.collections.asr.parts.utils import timestamp_utils, tokenizer_utils
    from nemo.collections.asr.parts.mixins import transcription
    from nemo.core.classes import module
    c = {
        "validation_ds_read_in_setup_transcribe_dataloader":
            cite(rnnt_bpe_models, "'use_start_end_token': self.cfg.validation_ds.get("),
        "greedy_batch_tdt_builds_GreedyBatchedTDTInfer":
            cite(rnnt_decoding, "self.decoding = rnnt_greedy_decoding.GreedyBatchedTDTInfer("),
        "greedy_tdt_builds_GreedyTDTInfer": cite(rnnt_decoding, "self.decoding = rnnt_greedy_decoding.GreedyTDTInfer("),
        "GreedyBatchedTDTInfer_uses_label_looping_computer_when_blank_as_pad":
            cite(rnnt_greedy_decoding, "self.decoding_computer = GreedyBatchedTDTLabelLoopingComputer("),
        "label_looping_SOS_is_blank": cite(tdt_label_looping, "self._SOS = self._blank_index"),
        "label_looping_torch_impl_first_labels_SOS":
            cite(tdt_label_looping, "labels = torch.full_like(batch_indices, fill_value=self._SOS)"),
        "label_looping_torch_impl_first_predict":
            cite(tdt_label_looping, "decoder_output, state, *_ = self.decoder.predict(", 1),
        "label_looping_cuda_graphs_first_labels_SOS": cite(tdt_label_looping, "self.state.labels.fill_(self._SOS)"),
        "label_looping_blank_duration_forced_to_1":
            cite(tdt_label_looping, "durations.masked_fill_(torch.logical_and(durations == 0, blank_mask), 1)"),
        "label_looping_max_symbols_force_blank": cite(tdt_label_looping, "time_indices += force_blank_mask"),
        "RNNTDecoder_predict_embeds_y": cite(rnnt, 'y = self.prediction["embed"](y)'),
        "RNNTDecoder_predict_None_is_zero_vector": cite(rnnt, "y = torch.zeros((B, 1, self.pred_hidden)", 2),
        "RNNTDecoder_predict_add_sos_zero_vector": cite(rnnt, "start = torch.zeros((B, 1, H)", 1),
        "RNNTDecoder_embedding_padding_idx_blank":
            cite(rnnt, "embed = torch.nn.Embedding(vocab_size + 1, pred_n_hidden, padding_idx=self.blank_idx)"),
        "GreedyTDTInfer_first_label_SOS": cite(rnnt_greedy_decoding, "last_label = self._SOS", 3),
        "_pred_step_SOS_int_is_predict_None":
            cite(rnnt_greedy_decoding, "return self.decoder.predict(None, hidden, add_sos=add_sos, batch_size=batch_size)"),
        "transcribe_output_processing_seconds":
            cite(rnnt_models, "hyp = process_timestamp_outputs("),
        "compute_rnnt_timestamps": cite(rnnt_decoding, "def compute_rnnt_timestamps("),
        "tdt_uses_compute_offsets_tdt_and_refine_tdt": cite(rnnt_decoding, "self._compute_offsets = self._compute_offsets_tdt"),
        "tdt_token_duration_on_when_timestamps":
            cite(rnnt_decoding, "self.tdt_include_token_duration = self.tdt_include_token_duration or self.compute_timestamps"),
        "_compute_offsets_tdt_formula": cite(rnnt_decoding, '{"char": [t], "start_offset": s, "end_offset": s + d}'),
        "_refine_timestamps_tdt_punctuation":
            cite(rnnt_decoding, "encoded_char_offsets[i]['start_offset'] = offset['start_offset'] = char_offsets[i - 1]['end_offset']"),
        "word_seperator_default": cite(rnnt_decoding, "self.word_seperator = self.cfg.get('word_seperator', ' ')"),
        "segment_seperators_default": cite(rnnt_decoding, "self.segment_seperators = self.cfg.get('segment_seperators', ['.', '?', '!'])"),
        "supported_punctuation_from_tokenizer": cite(rnnt_decoding, "supported_punctuation = tokenizer.supported_punctuation"),
        "extract_punctuation_from_vocab": cite(tokenizer_utils, "def extract_punctuation_from_vocab("),
        "define_spe_tokenizer_type": cite(tokenizer_utils, "def define_spe_tokenizer_type("),
        "get_words_offsets": cite(timestamp_utils, "def get_words_offsets("),
        "bpe_word_start_condition": cite(timestamp_utils, "return lambda token, token_text, next_non_delimeter_token: token != token_text or ("),
        "get_segment_offsets": cite(timestamp_utils, "def get_segment_offsets("),
        "process_timestamp_outputs": cite(timestamp_utils, "def process_timestamp_outputs("),
        "seconds_formula": cite(timestamp_utils, "start = start_offset * window_stride * subsampling_factor"),
        "transcribe_teardown_unfreezes_modules": cite(transcription, "self.encoder.unfreeze(partial=True)"),
        "NeMoModule_unfreeze_calls_train": cite(module, "        self.train()"),
    }
    return c


def synthetic_timestamps(model):
    """NeMo's own char/word/segment timestamps for hand-made TDT token sequences (ids, frames,
    durations chosen here), run through the same functions transcribe() uses
    (compute_rnnt_timestamps, then process_timestamp_outputs)."""
    from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis
    from nemo.collections.asr.parts.utils.timestamp_utils import process_timestamp_outputs
    tok = model.tokenizer
    cases = [
        # (name, text, frame gap before the final token (punctuation after silence), duration pattern)
        ("en_sentence", "The weather is very pleasant today.", 9, [1, 2, 0, 3, 4, 1]),
        ("en_two_sentences_comma", "The weather, today, is very pleasant. Is it?", 0, [2, 1, 3, 0, 1]),
        ("hi_sentence_danda", "आज मौसम बहुत अच्छा है।", 5, [1, 1, 2, 4]),
        ("ta_sentence", "இன்று வானிலை நன்றாக உள்ளது.", 0, [3, 0, 1, 2]),
    ]
    out = []
    for name, text, gap, pattern in cases:
        ids = tok.text_to_ids(text)
        frames, durs, t = [], [], 2
        for i, _ in enumerate(ids):
            if i == len(ids) - 1:
                t += gap
            d = pattern[i % len(pattern)]
            frames.append(t)
            durs.append(d)
            t += d
        h = Hypothesis(score=0.0, y_sequence=list(ids), timestamp=list(frames), token_duration=list(durs))
        h = model.decoding.decode_hypothesis([h])[0]
        h = model.decoding.compute_rnnt_timestamps(h, "all")
        h = process_timestamp_outputs([h], model.encoder.subsampling_factor,
                                      model.cfg.preprocessor.window_stride)[0]
        out.append({
            "name": name, "input_text": text, "y_sequence": list(ids), "pieces": tok.ids_to_tokens(ids),
            "token_text": [model.decoding.decode_ids_to_str([i]) for i in ids],
            "timestep": frames, "token_duration": durs, "text": h.text, "timestamp": jsonable(h.timestamp),
        })
    return out


def main():
    import nemo
    import lightning

    pcms = load_pcm()
    result = {
        "made_with": {
            "nemo_toolkit": nemo.__version__, "torch": torch.__version__, "lightning": lightning.__version__,
            "omegaconf": __import__("omegaconf").__version__, "python": sys.version.split()[0],
            "device": "cpu",
        },
        "model": "trainer/tests/data/nemo/tiny-tdt.nemo",
        "call": f"model.transcribe([3 paths], batch_size={BATCH_SIZE}, timestamps=True, return_hypotheses=True, "
                "verbose=False)",
    }

    model = restore()
    result["cfg_decoding"] = OmegaConf.to_container(model.cfg.decoding, resolve=True, enum_to_str=True)
    result["window_stride"] = float(model.cfg.preprocessor.window_stride)
    result["subsampling_factor"] = int(model.encoder.subsampling_factor)
    result["cfg_encoder_subsampling_factor"] = int(model.cfg.encoder.subsampling_factor)
    result["seconds_per_encoder_frame"] = result["window_stride"] * result["subsampling_factor"]
    result["blank_id"] = int(model.decoding.blank_id)
    result["vocab_size"] = int(model.tokenizer.vocab_size)
    result["supported_punctuation"] = sorted(model.decoding.supported_punctuation or [])
    result["tokenizer_type"] = model.decoding.tokenizer_type
    result["word_seperator"] = model.decoding.word_seperator
    result["segment_seperators"] = list(model.decoding.segment_seperators)
    result["segment_gap_threshold"] = model.decoding.segment_gap_threshold
    result["decoding_classes"] = {
        "decoding": type(model.decoding).__name__,
        "greedy": type(model.decoding.decoding).__name__,
        "computer": type(getattr(model.decoding.decoding, "decoding_computer", None)).__name__,
    }
    blank_row = model.decoder.prediction.embed.weight[model.decoder.blank_idx].detach().clone()
    result["tiny_tdt_blank_row_norm"] = float(blank_row.norm())

    # 1. transcribe() as a user calls it
    try:
        transcribe(model)
        result["transcribe_out_of_the_box"] = {"ok": True}
    except Exception as e:  # noqa: BLE001 -- recorded verbatim
        result["transcribe_out_of_the_box"] = {
            "ok": False, "exception": f"{type(e).__module__}.{type(e).__name__}", "message": str(e),
            "workaround": "with open_dict(model.cfg): model.cfg.validation_ds = {}",
        }
        add_validation_ds(model)
    utts = transcribe(model)
    result["utterances"] = utts
    result["cfg_decoding_after_transcribe"] = OmegaConf.to_container(model.cfg.decoding, resolve=True, enum_to_str=True)

    # the same hypotheses as ../make.py recorded (rnnt_decoder_predictions_tensor on its own batch)?
    with open(os.path.join(NEMO_DIR, "tiny-tdt.outputs.json"), encoding="utf-8") as f:
        fixture = json.load(f)
    greedy = load_file(os.path.join(NEMO_DIR, "tiny-tdt.outputs.safetensors"))["greedy"]
    same = [u["text"] == t for u, t in zip(utts, fixture["greedy_texts"])]
    same_ids = [u["y_sequence"] == [int(x) for x in g if x >= 0] for u, g in zip(utts, greedy)]
    result["same_as_tiny_tdt_outputs"] = {"texts": same, "token_ids": same_ids}

    # one utterance at a time gives the same?
    one = model.transcribe(audio_paths(), batch_size=1, timestamps=True, return_hypotheses=True, verbose=False)
    one = [hyp_record(model, a, h) for a, h in zip(AUDIO, one)]
    result["batch_size_1_same"] = [short([a]) == short([b]) for a, b in zip(utts, one)]

    # 2. first prediction-network input: decode by hand both ways, and with strategy "greedy"
    man_blank = manual_all(model, pcms, "blank_row")
    man_zero = manual_all(model, pcms, "zero")
    with_strategy(model, "greedy")
    greedy_single = transcribe(model)
    with_strategy(model, "greedy_batch")
    result["first_step"] = {
        "manual_blank_row_start_equals_transcribe": short(utts) == man_blank,
        "manual_zero_start": man_zero,
        "manual_zero_start_equals_transcribe": short(utts) == man_zero,
        "strategy_greedy_GreedyTDTInfer": short(greedy_single),
        "strategy_greedy_equals_manual_zero_start": short(greedy_single) == man_zero,
    }

    # 3. the blank row made large: does greedy_batch (transcribe's default here) change?
    variants = {
        "fill_3.0": torch.full_like(blank_row, BLANK_ROW_FILL),
        "randn_x5_seed0": BLANK_ROW_RANDN_SCALE * torch.randn(
            blank_row.shape, generator=torch.Generator().manual_seed(BLANK_ROW_RANDN_SEED)),
    }
    result["blank_row_variants"] = {}
    saved = None
    for name, row in variants.items():
        m = restore()
        set_blank_row(m, row)
        tmp = None
        if saved is None:
            tmp = os.path.join(tempfile.mkdtemp(), "blank-row.nemo")
            m.save_to(tmp)  # before transcribe touches its cfg
        add_validation_ds(m)
        recs = transcribe(m)
        mz = manual_all(m, pcms, "zero")
        mb = manual_all(m, pcms, "blank_row")
        with_strategy(m, "greedy")
        gs = transcribe(m)
        differs = short(recs) != mz
        result["blank_row_variants"][name] = {
            "row": row.tolist(),
            "transcribe_greedy_batch": short(recs),
            "texts": [r["text"] for r in recs],
            "manual_blank_row_start_equals_transcribe": short(recs) == mb,
            "manual_zero_start": mz,
            "zero_start_same_as_tiny_tdt_zero_start": mz == man_zero,
            "strategy_greedy_equals_manual_zero_start": short(gs) == mz,
            "transcribe_differs_from_zero_start": differs,
            "transcribe_differs_from_tiny_tdt": short(recs) != short(utts),
        }
        if tmp is not None and not (differs and saved is None):
            shutil.rmtree(os.path.dirname(tmp))
        if differs and saved is None:
            dst = os.path.join(HERE, "blank-row.nemo")
            shutil.move(tmp, dst)
            shutil.rmtree(os.path.dirname(tmp))
            saved = name
            result["blank_row_model"] = {
                "file": "trainer/tests/data/nemo/transcribe/blank-row.nemo",
                "made_from": "tiny-tdt.nemo, decoder.prediction.embed.weight[blank_id] := " + name,
                "size_bytes": os.path.getsize(dst),
                "utterances": recs,
                "zero_start": mz,
            }
    result["blank_row_model_saved"] = saved
    dst = os.path.join(HERE, "blank-row.nemo")
    if saved is None:
        if os.path.exists(dst):
            os.remove(dst)
    else:  # the saved file, restored as a user would, gives the recorded hypotheses
        from nemo.collections.asr.models import ASRModel
        m = ASRModel.restore_from(dst, map_location="cpu")
        m.eval()
        add_validation_ds(m)
        again = transcribe(m)
        result["blank_row_model"]["restored_file_reproduces"] = (
            short(again) == short(result["blank_row_model"]["utterances"])
            and [r["timestamp"] for r in again] == [r["timestamp"] for r in result["blank_row_model"]["utterances"]])

    # 4. NeMo's word/segment rules on hand-made sequences
    result["synthetic_timestamps"] = synthetic_timestamps(model)
    result["nemo_source"] = sources()

    with open(os.path.join(HERE, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("transcribe out of the box:", result["transcribe_out_of_the_box"])
    print("texts:", [u["text"] for u in utts], "same as tiny-tdt.outputs:", same, same_ids)
    print("first step:", {k: v for k, v in result["first_step"].items() if isinstance(v, bool)})
    for k, v in result["blank_row_variants"].items():
        print(k, {a: b for a, b in v.items() if isinstance(b, bool)})
    print("saved blank-row model:", saved,
          result.get("blank_row_model", {}).get("restored_file_reproduces"))


if __name__ == "__main__":
    main()
