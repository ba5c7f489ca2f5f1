#!/usr/bin/env python3
"""Writes kaldi_ark/: the kaldi/ fixture's recordings inside one Kaldi archive, as `wav-copy
ark:... ark,scp:wav.ark,wav.scp` leaves a data directory, written by kaldiio's own archive
writer (`kaldiio.WriteHelper`, which stores a (rate, int16 array) as Kaldi's wave holder does:
`KEY ` then a RIFF/WAVE file, no binary marker).

Needs kaldiio, soundfile, numpy and xxhash (see README.md):

    ~/.cache/asr-inputs-venv/bin/pip install kaldiio soundfile numpy xxhash
    ~/.cache/asr-inputs-venv/bin/python compiler/tests/data/inputs/make_kaldi_ark_fixture.py

Deterministic: the same bytes on every run with the same versions. The script reads the
archive back through kaldiio's scp reader and checks every utterance's samples against
expected.json, and every entry's offset against a RIFF header.
"""

import json
import os
import shutil

import kaldiio
import numpy as np
import soundfile
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "kaldi")
OUT = os.path.join(HERE, "kaldi_ark")


def main():
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    recordings = []
    with open(os.path.join(SRC, "wav.scp")) as f:
        for line in f:
            rec, path = line.split()
            x, rate = soundfile.read(os.path.join(SRC, path), dtype="int16")
            recordings.append((rec, rate, x))
    # kaldiio writes the scp's archive path as given: relative, from inside the directory,
    # as the data directory's own paths are.
    cwd = os.getcwd()
    os.chdir(OUT)
    try:
        with kaldiio.WriteHelper("ark,scp:wav.ark,wav.scp") as w:
            for rec, rate, x in recordings:
                w[rec] = (rate, x)
    finally:
        os.chdir(cwd)
    for name in ("text", "segments", "utt2lang"):
        shutil.copyfile(os.path.join(SRC, name), os.path.join(OUT, name))

    # Read back through kaldiio, and cut the segments out as a Kaldi recipe would.
    ark = open(os.path.join(OUT, "wav.ark"), "rb").read()
    scp = {}
    with open(os.path.join(OUT, "wav.scp")) as f:
        for line in f:
            rec, entry = line.split()
            path, offset = entry.rsplit(":", 1)
            assert path == "wav.ark" and ark[int(offset):int(offset) + 4] == b"RIFF", entry
            assert ark[int(offset) - len(rec) - 1:int(offset)] == (rec + " ").encode(), entry
            scp[rec] = entry
    os.chdir(OUT)
    try:
        loaded = {k: v for k, v in kaldiio.load_scp("wav.scp").items()}
    finally:
        os.chdir(cwd)
    expected = json.load(open(os.path.join(HERE, "expected.json")))["utterances"]
    with open(os.path.join(OUT, "segments")) as f:
        for line in f:
            utt, rec, start, end = line.split()
            rate, x = loaded[rec]
            assert rate == 16000
            seg = x[int(round(float(start) * rate)):int(round(float(end) * rate))]
            want = expected[utt]
            assert len(seg) == want["num_samples"], (utt, len(seg))
            assert xxhash.xxh3_64_intdigest(seg.astype("<i2").tobytes()) == want["xxh3_64"], utt
    versions = {"kaldiio": kaldiio.__version__ if hasattr(kaldiio, "__version__") else "?",
                "soundfile": soundfile.__version__, "numpy": np.__version__}
    print(f"kaldi_ark/: {len(scp)} recordings in wav.ark ({len(ark)} bytes), {versions}")


if __name__ == "__main__":
    main()
