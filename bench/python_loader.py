#!/usr/bin/env python3
"""The per-sample loading path `asrt`'s batch feed replaces, as the Python pipeline runs it: for
each utterance of a batch, decode its FLAC file, downmix if stereo, then pad the batch (the
pipeline's `__getitem__` plus `collate_asr_batch`). Decoding uses soundfile (libsndfile), where
the pipeline uses torchaudio; token ids are taken as given, where the pipeline also runs
SentencePiece per sample, so this peer is, if anything, faster than the real one.

Usage:
    python_loader.py export CORPUS DIR     write each utterance as DIR/<index>.flac (16-bit)
    python_loader.py load DIR BATCHES.json [--repeats N]
                                           time loading every batch of `asrt plan --batches`

Prints one JSON object with audio-seconds per second (median over the repeats).
"""

import json
import os
import statistics
import sys
import time

import numpy as np
import soundfile as sf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "format-spec", "reference"))
import read_corpus  # noqa: E402  (the independent reader, for the export step only)


def export(corpus, out_dir):
    read_corpus.read(corpus)  # validates the file first
    buf = np.memmap(corpus, dtype=np.uint8, mode="r")
    hdr = read_corpus.parse_header(buf, len(buf))
    sec = read_corpus.section_map(hdr, len(buf))
    ns = read_corpus.array(buf, sec, "NUM_SAMPLES", "<u4")
    po = read_corpus.array(buf, sec, "PCM_OFFSETS", "<u8")
    pcm = read_corpus.array(buf, sec, "PCM", "<i2")
    os.makedirs(out_dir, exist_ok=True)
    for i in range(len(ns)):
        a = int(po[i])
        sf.write(os.path.join(out_dir, f"{i}.flac"), pcm[a:a + int(ns[i])], 16000, subtype="PCM_16")
    print(json.dumps({"exported": len(ns)}))


def get_item(audio_dir, idx):
    waveform, sr = sf.read(os.path.join(audio_dir, f"{idx}.flac"), dtype="int16", always_2d=True)
    if waveform.shape[1] > 1:
        waveform = waveform.mean(axis=1).astype(np.int16)[:, None]
    return waveform[:, 0], sr


def collate(signals):
    lens = np.array([len(s) for s in signals], dtype=np.int64)
    padded = np.zeros((len(signals), int(lens.max())), dtype=np.int16)
    for row, s in enumerate(signals):
        padded[row, :len(s)] = s
    return padded, lens


def load(audio_dir, batches_json, repeats):
    batches = [b for b in json.load(open(batches_json))["micro_batches"] if b]
    rates = []
    seconds = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        seconds = 0.0
        for batch in batches:
            signals = [get_item(audio_dir, i)[0] for i in batch]
            padded, lens = collate(signals)
            seconds += float(lens.sum()) / 16000
        rates.append(seconds / (time.perf_counter() - t0))
    print(json.dumps({"bench": "python_loader", "batches": len(batches), "audio_seconds": seconds,
                      "audio_seconds_per_second_median": statistics.median(rates), "all": rates}))


def main(argv):
    if len(argv) >= 3 and argv[0] == "export":
        export(argv[1], argv[2])
    elif len(argv) >= 3 and argv[0] == "load":
        repeats = int(argv[argv.index("--repeats") + 1]) if "--repeats" in argv else 3
        load(argv[1], argv[2], repeats)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
