"""Generates the compile benchmark's input: utterances of 2-4 sentences spoken by espeak-ng in
the example's 12 languages with random speed and pitch, written as FLAC at mixed rates (8, 16,
22.05, 44.1, 48 kHz), channel counts and bit depths, plus one training-ready manifest per size.

usage: python3 bench/make_compile_input.py OUT_DIR --hours 1 2

Every utterance's audio is distinct (so audio deduplication keeps all of them). Deterministic for
a given espeak-ng version (seeded random choices). Runs 2 synthesis processes.
"""
import argparse
import csv
import os
import random
import subprocess
import tempfile
from multiprocessing import Pool

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
FORMATS = [(8000, 1, 16), (16000, 1, 16), (22050, 1, 16), (44100, 2, 16), (48000, 1, 24),
           (16000, 2, 24), (44100, 1, 16), (48000, 2, 16)]


def sentences():
    by_lang = {}
    path = os.path.join(HERE, "..", "examples", "espeak", "sentences.tsv")
    for r in csv.reader(open(path, encoding="utf-8"), delimiter="\t"):
        if r and not r[0].startswith("#"):
            by_lang.setdefault(r[0].split("-")[0], []).append(r[2])
    return by_lang


def make(job):
    i, lang, text, speed, pitch, (rate, ch, bits), out_dir = job
    name = f"u{i:06d}.flac"
    path = os.path.join(out_dir, "audio", name)
    if not os.path.exists(path):
        with tempfile.NamedTemporaryFile(suffix=".wav") as wav:
            subprocess.run(["espeak-ng", "-v", lang, "-s", str(speed), "-p", str(pitch), "-w",
                            wav.name, text], check=True)
            subprocess.run(["sox", "-D", wav.name, "-b", str(bits), path, "channels", str(ch),
                            "rate", "-v", str(rate)], check=True)
    dur = float(subprocess.run(["soxi", "-D", path], capture_output=True, text=True).stdout)
    return dict(segment_id=f"u{i:06d}", shard_id="bench", text=f"<|{lang}|> {text}",
                duration=round(dur, 3), lang=lang, tar_member_name=name,
                tar_path="audio/bench.tar", source="espeak-ng")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hours", type=float, nargs="+", default=[1.0, 2.0])
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "audio"), exist_ok=True)
    rng = random.Random(20261122)
    by_lang = sentences()
    langs = sorted(by_lang)
    target = max(args.hours) * 3600
    rows, total, i = [], 0.0, 0
    with Pool(2) as pool:
        while total < target:
            jobs = []
            for _ in range(64):
                lang = rng.choice(langs)
                text = " ".join(rng.choice(by_lang[lang]) for _ in range(rng.randint(2, 4)))
                jobs.append((i, lang, text, rng.randint(120, 200), rng.randint(25, 75),
                             rng.choice(FORMATS), args.out))
                i += 1
            for r in pool.map(make, jobs):
                rows.append(r)
                total += r["duration"]
    for h in args.hours:
        acc, n = 0.0, 0
        while n < len(rows) and acc < h * 3600:
            acc += rows[n]["duration"]
            n += 1
        name = os.path.join(args.out, f"manifest-{h:g}h.parquet")
        pq.write_table(pa.Table.from_pylist(rows[:n]), name)
        print(f"{name}: {n} rows, {acc / 3600:.3f} h")


if __name__ == "__main__":
    main()
