"""The Python peer of `asrc compile` for the benchmark: the steps the pipeline does per sample
(seed 000 sections 3-4), done once over a manifest with 2 worker processes: clean the text,
read the FLAC with soundfile, downmix by averaging channels, resample to 16 kHz with soxr (HQ),
convert to 16-bit, tokenize `<|lang|> text` with SentencePiece, cut at 512 tokens; the main
process writes PCM and token ids to two files in manifest order.

usage: python3 bench/python_compile.py MANIFEST SPM_MODEL OUT_PREFIX [--workers 2]
"""
import argparse
import os
import re
import sys
import time
from multiprocessing import Pool

import numpy as np
import pyarrow.parquet as pq
import sentencepiece as spm
import soundfile as sf
import soxr

_TAG_RE = re.compile(r"\[.*?\]")
_PUNCT_RE = re.compile(r"[।॥.,!?;:\"'\-—()…%/+=$*@#&_^>|\\<>`~。\u0964\u0965]+")
_LANG_RE = re.compile(r"^<\|([^|]+)\|>\s*")
_sp = None


def clean_text(text):
    text = _TAG_RE.sub("", text)
    text = _PUNCT_RE.sub("", text)
    return re.sub(r"\s+", " ", text).strip()


def init(model):
    global _sp
    _sp = spm.SentencePieceProcessor(model_file=model)


def work(row):
    base, text, lang, member, tar_path = row
    m = _LANG_RE.match(text or "")
    body = clean_text(text[m.end():] if m else (text or ""))
    if not body:
        return None
    path = os.path.join(base, os.path.dirname(tar_path), member)
    try:
        x, sr = sf.read(path, dtype="float32", always_2d=True)
    except Exception:
        return None
    x = x.mean(axis=1)
    if sr != 16000:
        x = soxr.resample(x, sr, 16000, quality="HQ")
    pcm = np.clip(np.round(x * 32768.0), -32768, 32767).astype(np.int16)
    ids = _sp.encode(f"<|{lang}|> {body}")[:512]
    return pcm.tobytes(), np.asarray(ids, dtype=np.uint32).tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    t0 = time.perf_counter()
    base = os.path.dirname(os.path.abspath(args.manifest))
    t = pq.read_table(args.manifest, columns=["text", "lang", "tar_member_name", "tar_path"])
    rows = [(base, *r) for r in zip(*(t.column(c).to_pylist() for c in t.column_names))]
    samples = kept = 0
    with open(args.out + ".pcm", "wb") as fp, open(args.out + ".tok", "wb") as ft, \
            Pool(args.workers, initializer=init, initargs=(args.model,)) as pool:
        for r in pool.imap(work, rows, chunksize=16):
            if r is None:
                continue
            fp.write(r[0])
            ft.write(r[1])
            samples += len(r[0]) // 2
            kept += 1
    wall = time.perf_counter() - t0
    hours = samples / 16000 / 3600
    print(f"python: {kept} utterances, {hours:.3f} h in {wall:.2f} s: "
          f"{hours * 3600 / wall:.0f}x real time", file=sys.stderr)
    print(f"{wall:.4f}")


if __name__ == "__main__":
    main()
