#!/usr/bin/env python3
"""Regenerates the dataset-format input fixtures in this folder (compiler/tests/data/inputs/).

The same four utterances (utt1..utt4), written in each ecosystem's dataset format by that
ecosystem's own writer: NeMo manifests (+ NeMo tarred shards), Hugging Face `datasets`
parquet, lhotse manifests, WebDataset shards (+ WeNet data.list), a Kaldi data directory.
Every format yields bit-identical 16 kHz 16-bit mono PCM for the same utterance id;
expected.json has each utterance's text, language, sample count and the xxh3-64 of its
int16 little-endian PCM.

Run it with the venv ~/.cache/asr-inputs-venv, made with

    python3 -m venv ~/.cache/asr-inputs-venv
    ~/.cache/asr-inputs-venv/bin/pip install lhotse datasets webdataset soundfile numpy pyarrow xxhash urllib3

    ~/.cache/asr-inputs-venv/bin/python compiler/tests/data/inputs/make_fixtures.py

The fixtures were made with Python 3.11.7, lhotse 1.33.0, datasets 5.2.0, webdataset 1.0.2,
soundfile 0.14.0 (libsndfile 1.2.2), numpy 2.4.6, pyarrow 26.0.1, xxhash 4.1.0 (the script
prints the versions it runs with). urllib3 is listed because lhotse 1.33 imports it without
declaring it.

Deterministic: fixed seeds; tar members get mtime 0; the gzip headers lhotse writes carry the
current time, so the script sets their MTIME field to 0 afterwards (the compressed data is
lhotse's, unchanged).

Utterances (16 kHz): utt1 9000 samples, utt2 12000, utt3 10000, utt4 8000. long.flac is
48000 samples (3 s) of a quiet filler signal with utt3 at samples [8000, 18000) (0.5 s,
0.625 s long) and utt4 at samples [28000, 36000) (1.75 s, 0.5 s long): all these offsets
and durations are exact binary fractions, so start * 16000 and duration * 16000 are exact.
Formats with segments (NeMo manifest, lhotse, Kaldi) give utt3/utt4 as segments of
long.flac (long.wav for Kaldi); the others (NeMo tarred, HF parquet, WebDataset) carry
utt3/utt4 as standalone files holding exactly those samples.
"""

import gzip
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile

import numpy as np
import soundfile as sf
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
SR = 16000

UTTS = [
    # id, text, lang, FLEURS raw transcription, FLEURS language name, samples, f0, seed
    ("utt1", "hello world", "en", "Hello world.", "English", 9000, 120.0, 11),
    ("utt2", "the quick brown fox", "en", "The quick brown fox.", "English", 12000, 175.0, 12),
    ("utt3", "bonjour le monde", "fr", "Bonjour le monde.", "French", 10000, 210.0, 13),
    ("utt4", "guten tag", "de", "Guten Tag.", "German", 8000, 95.0, 14),
]
LONG_SAMPLES = 48000
SEGMENTS = {"utt3": 8000, "utt4": 28000}  # start sample of each in long.flac


# ---------------------------------------------------------------------------- signals


def speech_like(n, f0_base, seed):
    """A speech-like int16 signal: gliding harmonic series, formant weights, envelope, noise."""
    t = np.arange(n) / SR
    dur = n / SR
    rng = np.random.default_rng(seed)
    f0 = f0_base * (1.0 + 0.2 * t / dur) + 0.03 * f0_base * np.sin(2 * np.pi * 5.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    formants = rng.uniform([500, 1000, 2300], [800, 1600, 2900])
    x = np.zeros(n)
    for k in range(1, 40):
        if k * f0_base * 1.25 > 6000:
            break
        a = (1.0 / k) * (0.1 + sum(np.exp(-0.5 * ((k * f0_base - fc) / 150.0) ** 2) for fc in formants))
        x += a * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
    env = np.sin(np.pi * t / dur) ** 0.6 * (0.6 + 0.4 * np.sin(2 * np.pi * 3.0 * t + seed) ** 2)
    x *= env
    x /= np.max(np.abs(x))
    x += 0.01 * rng.standard_normal(n)
    x = 0.5 * x / np.max(np.abs(x))  # peak -6 dBFS
    return np.round(x * 32767).astype(np.int16)


def filler(n, seed):
    """The quiet background of long.flac around the two utterances (about -30 dBFS)."""
    t = np.arange(n) / SR
    rng = np.random.default_rng(seed)
    x = 0.02 * np.sin(2 * np.pi * 60.0 * t) + 0.01 * rng.standard_normal(n)
    return np.round(x * 32767).astype(np.int16)


def write_audio(path, pcm, fmt):
    sf.write(path, pcm, SR, format=fmt, subtype="PCM_16")
    back, sr = sf.read(path, dtype="int16")
    assert sr == SR and np.array_equal(back, pcm), path


def xxh(pcm):
    return xxhash.xxh3_64_intdigest(pcm.astype("<i2").tobytes())


def zero_gzip_mtime(path):
    b = bytearray(open(path, "rb").read())
    assert b[:3] == b"\x1f\x8b\x08"
    b[4:8] = b"\0\0\0\0"
    open(path, "wb").write(b)


def tar_add(tar, name, data):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 0
    ti.mode = 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    tar.addfile(ti, io.BytesIO(data))


def fresh(d):
    p = os.path.join(HERE, d)
    if os.path.isdir(p):
        shutil.rmtree(p)
    os.makedirs(p)
    return p


# ---------------------------------------------------------------------------- main


def main():
    import datasets
    import lhotse
    import pyarrow
    import pyarrow.parquet as pq
    import webdataset as wds

    versions = {
        "python": sys.version.split()[0], "lhotse": lhotse.__version__,
        "datasets": datasets.__version__, "webdataset": getattr(wds, "__version__", "?"),
        "soundfile": sf.__version__, "libsndfile": sf.__libsndfile_version__,
        "numpy": np.__version__, "pyarrow": pyarrow.__version__, "xxhash": xxhash.VERSION,
    }
    datasets.disable_progress_bars()
    if versions["webdataset"] == "?":
        from importlib.metadata import version
        versions["webdataset"] = version("webdataset")
    for k, v in versions.items():
        print(f"{k}: {v}")

    # ------------------------------------------------------------------ signals
    pcm = {u[0]: speech_like(u[5], u[6], u[7]) for u in UTTS}
    long = filler(LONG_SAMPLES, 99)
    for uid, start in SEGMENTS.items():
        long[start:start + len(pcm[uid])] = pcm[uid]
    meta = {u[0]: {"text": u[1], "lang": u[2], "raw": u[3], "language": u[4], "n": u[5]} for u in UTTS}
    dur = {uid: meta[uid]["n"] / SR for uid in meta}
    offset = {uid: s / SR for uid, s in SEGMENTS.items()}

    # encoded files (libsndfile), made once and copied into each folder that needs them
    tmp = tempfile.mkdtemp(prefix="asrc-inputs-")
    for uid in pcm:
        write_audio(os.path.join(tmp, f"{uid}.flac"), pcm[uid], "FLAC")
        write_audio(os.path.join(tmp, f"{uid}.wav"), pcm[uid], "WAV")
    write_audio(os.path.join(tmp, "long.flac"), long, "FLAC")
    write_audio(os.path.join(tmp, "long.wav"), long, "WAV")
    flac = {uid: open(os.path.join(tmp, f"{uid}.flac"), "rb").read() for uid in pcm}

    def copy_audio(folder, names):
        os.makedirs(os.path.join(folder, "audio"), exist_ok=True)
        for n in names:
            shutil.copyfile(os.path.join(tmp, n), os.path.join(folder, "audio", n))

    # ------------------------------------------------------------------ 1. NeMo
    d = fresh("nemo")
    copy_audio(d, ["utt1.flac", "utt2.flac", "long.flac"])
    with open(os.path.join(d, "manifest.json"), "w") as fh:
        for uid in meta:
            if uid in SEGMENTS:
                e = {"audio_filepath": "audio/long.flac", "offset": offset[uid], "duration": dur[uid]}
            else:
                e = {"audio_filepath": f"audio/{uid}.flac", "duration": dur[uid]}
            e.update(text=meta[uid]["text"], lang=meta[uid]["lang"])
            fh.write(json.dumps(e) + "\n")

    d = fresh("nemo_tarred")
    shards = {0: ["utt1", "utt2"], 1: ["utt3", "utt4"]}
    with open(os.path.join(d, "tarred_audio_manifest.json"), "w") as fh:
        for sid, uids in shards.items():
            with tarfile.open(os.path.join(d, f"audio_{sid}.tar"), "w") as tar:
                for uid in uids:
                    tar_add(tar, f"{uid}.flac", flac[uid])
                    fh.write(json.dumps({"audio_filepath": f"{uid}.flac", "duration": dur[uid],
                                         "text": meta[uid]["text"], "lang": meta[uid]["lang"],
                                         "shard_id": sid}) + "\n")

    # ------------------------------------------------------------------ 2. Hugging Face
    d = fresh("hf")
    audio_feature = datasets.Audio(sampling_rate=SR)
    cv = datasets.Dataset.from_dict({
        "id": list(meta),
        "sentence": [m["text"] for m in meta.values()],
        "locale": [m["lang"] for m in meta.values()],
        "audio": [{"bytes": flac[uid], "path": f"{uid}.flac"} for uid in meta],
    }).cast_column("audio", audio_feature)
    cv.to_parquet(os.path.join(d, "cv_style.parquet"))
    fleurs = datasets.Dataset.from_dict({
        "id": [i + 1 for i in range(len(meta))],
        "num_samples": [m["n"] for m in meta.values()],
        "audio": [{"bytes": flac[uid], "path": f"{uid}.flac"} for uid in meta],
        "transcription": [m["text"] for m in meta.values()],
        "raw_transcription": [m["raw"] for m in meta.values()],
        "language": [m["language"] for m in meta.values()],
    }).cast_column("audio", audio_feature)
    fleurs.to_parquet(os.path.join(d, "fleurs_style.parquet"))
    with open(os.path.join(d, "SCHEMA.txt"), "w") as fh:
        for name in ["cv_style.parquet", "fleurs_style.parquet"]:
            t = pq.read_table(os.path.join(d, name))
            a = t.schema.field("audio").type
            assert pyarrow.types.is_struct(a) and [f.name for f in a] == ["bytes", "path"], a
            col = t.column("audio").to_pylist()
            for uid, row in zip(meta, col):
                assert row["bytes"] == flac[uid], (name, uid)  # the bytes are embedded
                back, _ = sf.read(io.BytesIO(row["bytes"]), dtype="int16")
                assert np.array_equal(back, pcm[uid])
            md = t.schema.metadata or {}
            fh.write(f"# {name}: {t.num_rows} rows, written by datasets {datasets.__version__} "
                     f"(Dataset.to_parquet), read back with pyarrow {pyarrow.__version__}\n")
            fh.write(t.schema.remove_metadata().to_string() + "\n")
            if b"huggingface" in md:
                fh.write("-- schema metadata 'huggingface':\n")
                fh.write(json.dumps(json.loads(md[b"huggingface"]), indent=1) + "\n")
            fh.write("\n")

    # ------------------------------------------------------------------ 3. lhotse
    from lhotse import CutSet, MonoCut, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    d = fresh("lhotse")
    copy_audio(d, ["utt1.flac", "utt2.flac", "long.flac"])
    cwd = os.getcwd()
    os.chdir(d)  # lhotse stores the path string it is given: relative to this folder
    try:
        recs = {rid: Recording.from_file(f"audio/{rid}.flac", recording_id=rid)
                for rid in ["utt1", "utt2", "long"]}
        sups, cuts = [], []
        for uid in meta:
            rid = "long" if uid in SEGMENTS else uid
            start = offset.get(uid, 0.0)
            sup = SupervisionSegment(id=uid, recording_id=rid, start=start, duration=dur[uid],
                                     channel=0, text=meta[uid]["text"], language=meta[uid]["lang"],
                                     speaker=uid)
            sups.append(sup)
            cuts.append(MonoCut(id=uid, start=start, duration=dur[uid], channel=0,
                                recording=recs[rid], supervisions=[sup.with_offset(-start)]))
        RecordingSet.from_recordings(recs.values()).to_file("recordings.jsonl.gz")
        SupervisionSet.from_segments(sups).to_file("supervisions.jsonl.gz")
        CutSet.from_cuts(cuts).to_file("cuts.jsonl.gz")
        for f in ["recordings.jsonl.gz", "supervisions.jsonl.gz", "cuts.jsonl.gz"]:
            zero_gzip_mtime(f)
        # read back with lhotse and check the samples and the stored paths
        for cut in CutSet.from_file("cuts.jsonl.gz"):
            assert not os.path.isabs(cut.recording.sources[0].source), cut.recording.sources[0].source
            assert cut.num_samples == meta[cut.id]["n"], (cut.id, cut.num_samples)
            a = cut.load_audio()  # float32, shape (1, n)
            assert np.array_equal(np.round(a[0] * 32768).astype(np.int16), pcm[cut.id]), cut.id
    finally:
        os.chdir(cwd)

    # ------------------------------------------------------------------ 4. WebDataset
    d = fresh("wds")
    os.chdir(d)
    try:
        with wds.ShardWriter("shard-%06d.tar", maxcount=2, mtime=0, verbose=0) as sink:
            for uid in meta:
                sink.write({"__key__": uid, "flac": flac[uid], "txt": meta[uid]["text"],
                            "json": {"lang": meta[uid]["lang"]}})
    finally:
        os.chdir(cwd)
    with open(os.path.join(d, "data.list"), "w") as fh:
        fh.write("shard-000000.tar\nshard-000001.tar\n")
    for i, uids in enumerate([["utt1", "utt2"], ["utt3", "utt4"]]):
        with tarfile.open(os.path.join(d, f"shard-{i:06d}.tar")) as tar:
            names = tar.getnames()
            assert names == [f"{u}.{e}" for u in uids for e in ("flac", "json", "txt")], names
            for u in uids:
                assert tar.extractfile(f"{u}.flac").read() == flac[u]

    # ------------------------------------------------------------------ 5. Kaldi
    d = fresh("kaldi")
    copy_audio(d, ["utt1.wav", "utt2.wav", "long.wav"])

    def kfile(name, lines):
        with open(os.path.join(d, name), "w") as fh:
            fh.write("".join(line + "\n" for line in sorted(lines)))

    kfile("wav.scp", [f"{r} audio/{r}.wav" for r in ["long", "utt1", "utt2"]])
    kfile("segments", [f"{u} {'long' if u in SEGMENTS else u} {offset.get(u, 0.0):g} "
                       f"{offset.get(u, 0.0) + dur[u]:g}" for u in meta])
    kfile("text", [f"{u} {meta[u]['text']}" for u in meta])
    kfile("utt2spk", [f"{u} {u}" for u in meta])
    kfile("spk2utt", [f"{u} {u}" for u in meta])
    kfile("utt2lang", [f"{u} {meta[u]['lang']}" for u in meta])

    d = fresh("kaldi_pipe")
    with open(os.path.join(d, "wav.scp"), "w") as fh:
        fh.write("utt1 sox audio/utt1.flac -t wav - |\n")
    with open(os.path.join(d, "text"), "w") as fh:
        fh.write(f"utt1 {meta['utt1']['text']}\n")

    # ------------------------------------------------------------------ expected.json
    assert xxh(long[8000:18000]) == xxh(pcm["utt3"]) and xxh(long[28000:36000]) == xxh(pcm["utt4"])
    expected = {
        "sample_rate": SR,
        "pcm": "mono int16 little-endian; xxh3_64 = xxhash.xxh3_64_intdigest(pcm_bytes) (seed 0)",
        "versions": versions,
        "utterances": {
            uid: {"text": meta[uid]["text"], "lang": meta[uid]["lang"], "num_samples": meta[uid]["n"],
                  "duration": dur[uid], "xxh3_64": xxh(pcm[uid]), "xxh3_64_hex": f"{xxh(pcm[uid]):016x}",
                  **({"in_long": {"recording": "long", "start_sample": SEGMENTS[uid],
                                  "offset": offset[uid]}} if uid in SEGMENTS else {})}
            for uid in meta
        },
        "long": {"num_samples": LONG_SAMPLES, "xxh3_64": xxh(long), "xxh3_64_hex": f"{xxh(long):016x}"},
        "order": "every format lists utt1, utt2, utt3, utt4 in this order; NeMo manifests have no "
                 "id field (match by line number, or by audio_filepath/offset), FLEURS-style ids are 1..4",
        "fleurs_language": {"English": "en", "French": "fr", "German": "de"},
    }
    with open(os.path.join(HERE, "expected.json"), "w") as fh:
        json.dump(expected, fh, indent=1)
        fh.write("\n")
    shutil.rmtree(tmp)
    print("done")


if __name__ == "__main__":
    main()
