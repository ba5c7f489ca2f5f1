#!/usr/bin/env python3
"""Writes `lhotse_shar/`: the lhotse fixture's cut set (`lhotse/cuts.jsonl.gz`, made by
make_fixtures.py) in Lhotse Shar form, by lhotse's own writer (`CutSet.to_shar`, FLAC
recordings, two cuts a shard), then reads it back with lhotse and checks every cut's samples
against the xxh3-64 in expected.json.

    ~/.cache/asr-inputs-venv/bin/pip install lhotse==1.33.0 soundfile numpy xxhash urllib3
    ~/.cache/asr-inputs-venv/bin/python compiler/tests/data/inputs/make_shar_fixture.py

Deterministic: tar members carry the writer's defaults except mtime, which is zeroed by
rewriting each archive member for member (same names, order and bytes); the gzip headers of the
cut manifests get MTIME 0. utt3 and utt4 are segments of `long.flac` in the cut set; Shar stores
each cut's own audio, so here they are files of their own, and every cut starts at 0.
"""

import json
import os
import shutil
import sys
import tarfile

# The other fixtures' helpers (gzip MTIME, tar members with mtime 0).
from make_fixtures import HERE, tar_add, zero_gzip_mtime


def zero_tar_mtimes(path):
    with tarfile.open(path) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            tar_add(tar, name, data)
    return [name for name, _ in members]


def main():
    import lhotse
    import numpy as np
    import soundfile as sf
    import xxhash
    from lhotse import CutSet

    print("python", sys.version.split()[0], "lhotse", lhotse.__version__, "soundfile", sf.__version__,
          "libsndfile", sf.__libsndfile_version__, "numpy", np.__version__)
    expected = json.load(open(os.path.join(HERE, "expected.json")))["utterances"]
    out = os.path.join(HERE, "lhotse_shar")
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    cwd = os.getcwd()
    # The cut set's audio paths are relative to its folder.
    os.chdir(os.path.join(HERE, "lhotse"))
    try:
        cuts = CutSet.from_file("cuts.jsonl.gz").to_eager()
        written = cuts.to_shar(out, fields={"recording": "flac"}, shard_size=2)
    finally:
        os.chdir(cwd)
    print("written:", {k: [os.path.basename(p) for p in v] for k, v in written.items()})
    for p in written["cuts"]:
        zero_gzip_mtime(p)
    for i, p in enumerate(written["recording"]):
        names = zero_tar_mtimes(p)
        uids = ["utt1", "utt2"] if i == 0 else ["utt3", "utt4"]
        assert names == [f"{u}.{e}" for u in uids for e in ("flac", "json")], names

    # Read back through lhotse's Shar reader: each cut's samples are the fixture's.
    back = CutSet.from_shar(in_dir=out)
    seen = []
    for cut in back:
        assert cut.start == 0, (cut.id, cut.start)
        a = cut.load_audio()
        pcm = np.round(a[0] * 32768).astype("<i2")
        u = expected[cut.id]
        assert len(pcm) == u["num_samples"], (cut.id, len(pcm))
        assert xxhash.xxh3_64_intdigest(pcm.tobytes()) == u["xxh3_64"], cut.id
        assert cut.supervisions[0].text == u["text"], cut.id
        seen.append(cut.id)
    assert seen == ["utt1", "utt2", "utt3", "utt4"], seen
    print("checked:", seen)


if __name__ == "__main__":
    main()
