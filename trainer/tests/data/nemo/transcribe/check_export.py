#!/usr/bin/env python3
"""Checks a `.nemo` written by `asrt export` through NeMo's user API: `ASRModel.restore_from`,
then `transcribe(timestamps=True)` with no change to its config, on the fixture's three
utterances. The tokens, text and word and segment times must equal what NeMo gave for the model
the export came from (`expected.json`, by `make.py`). Exit 0 on agreement, 1 with the
differences.

    ~/.cache/asr-nemo-venv/bin/python trainer/tests/data/nemo/transcribe/check_export.py OUT.nemo
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..", "..", ".."))


def main():
    path = sys.argv[1]
    expected = json.load(open(os.path.join(HERE, "expected.json")))
    from nemo.collections.asr.models import ASRModel

    model = ASRModel.restore_from(path, map_location="cpu")
    model.eval()
    audio = [os.path.join(ROOT, u["audio"]) for u in expected["utterances"]]
    hyps = model.transcribe(audio, batch_size=3, timestamps=True, return_hypotheses=True)
    if isinstance(hyps, tuple):
        hyps = hyps[0]
    problems = []
    for h, want in zip(hyps, expected["utterances"]):
        name = want["audio"]
        tokens = [int(t) for t in h.y_sequence]
        if tokens != want["y_sequence"]:
            problems.append(f"{name}: tokens {tokens} != {want['y_sequence']}")
        if h.text != want["text"]:
            problems.append(f"{name}: text {h.text!r} != {want['text']!r}")
        for kind in ("word", "segment"):
            got = [(w[kind], w["start_offset"], w["end_offset"]) for w in h.timestamp[kind]]
            exp = [(w[kind], w["start_offset"], w["end_offset"]) for w in want["timestamp"][kind]]
            if got != exp:
                problems.append(f"{name}: {kind}s {got} != {exp}")
    print(json.dumps({"utterances": len(hyps), "problems": problems}))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
