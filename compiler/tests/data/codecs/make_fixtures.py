#!/usr/bin/env python3
"""Regenerates the decoder fixtures in this folder (compiler/tests/data/codecs/).

Every audio file here is written by a reference tool (sox, ffmpeg, flac, lame, oggenc,
opusenc), never by Python (the bad_* files are good ones cut or patched by Python), and next to it lies the reference decoder's output as raw
little-endian samples (NAME.s32 / NAME.f32 / NAME.f64). index.json describes every file:
codec, container, reference decoder and its version, sample format, rate, channels,
frames, the encoder command. The bad_* files are for reject tests (index.json "bad").

Needs: python3 with numpy, and on PATH: sox, ffmpeg, flac, lame, oggenc, opusenc, opusdec
(Debian: apt-get install sox ffmpeg flac lame vorbis-tools opus-tools).

    python3 compiler/tests/data/codecs/make_fixtures.py

Deterministic: fixed seeds, fixed Ogg serial numbers, `-D` (no dither) for sox,
`-fflags +bitexact` for ffmpeg; running it twice gives the same bytes with the same tools on
the same machine. libopus's float encoder takes the CPU's own SIMD paths, so on another CPU the
Opus files (and their decodes, and bad_truncated.opus) come out different but equally valid:
keep the committed ones when adding fixtures of other codecs.

Source signal: a speech-like test signal (a glottal-like harmonic series, f0 gliding
130 -> 170 Hz with a 5.5 Hz vibrato, formant-shaped harmonic amplitudes, a syllable
envelope, a little seeded noise), 0.3 s, peak -6 dBFS (0.5). It is computed from the same
continuous formula at every rate; the noise is seeded per rate. Stereo files carry the
signal on the left and the signal delayed by 1 ms and scaled by 0.6 on the right.
The length is 0.3 s rather than more so that the whole folder (which stores the 44.1 and
48 kHz stereo decodes as raw 32-bit samples) stays near 1.5 MB.
"""

import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DUR = 0.3  # seconds; an exact number of samples at 8000, 16000, 22050, 44100 and 48000 Hz


# ---------------------------------------------------------------------------- signal


def speech_like(rate, seed):
    n = int(round(rate * DUR))
    t = np.arange(n, dtype=np.float64) / rate
    f0 = 130.0 + 40.0 * (t / DUR) + 4.0 * np.sin(2 * np.pi * 5.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = np.zeros(n)
    formants = [(700.0, 130.0, 1.0), (1220.0, 160.0, 0.5), (2600.0, 250.0, 0.25)]
    for k in range(1, 40):
        fk = k * 170.0  # highest harmonic frequency over the glide
        if fk > min(0.45 * rate, 5000.0):
            break
        a = 1.0 / k
        a *= 0.15 + sum(g * np.exp(-0.5 * ((k * 150.0 - fc) / bw) ** 2) for fc, bw, g in formants)
        x += a * np.sin(k * phase + 0.3 * k)
    # syllable envelope: two "syllables", 8 ms raised-cosine fades at both ends
    env = 0.55 + 0.45 * np.sin(2 * np.pi * (t / DUR) * 2.0 - np.pi / 2) ** 2
    env *= np.sin(np.pi * t / DUR) ** 0.5
    fade = int(round(0.008 * rate))
    ramp = 0.5 - 0.5 * np.cos(np.pi * np.arange(fade) / fade)
    env[:fade] *= ramp
    env[-fade:] *= ramp[::-1]
    x *= env
    x /= np.max(np.abs(x))
    rng = np.random.default_rng(seed)
    x += 0.01 * rng.standard_normal(n) * (0.3 + env)
    return 0.5 * x / np.max(np.abs(x))  # peak -6 dBFS


def signal(rate, channels):
    left = speech_like(rate, seed=1000 + rate)
    if channels == 1:
        return left[:, None]
    d = int(round(0.001 * rate))
    right = 0.6 * np.concatenate([np.zeros(d), left[:-d]])
    return np.stack([left, right], axis=1)


def quantize(x, bits):
    """float in [-1, 1) -> signed integers at `bits` bits (round half to even, clipped)."""
    scale = float(1 << (bits - 1))
    return np.clip(np.round(x * scale), -scale, scale - 1).astype(np.int64)


# ---------------------------------------------------------------------------- tools


def run(cmd, cwd, capture=True):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE if capture else None,
                       stderr=subprocess.PIPE)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {shlex.join(cmd)}\n{r.stderr.decode(errors='replace')}")
    return r.stdout


def first_line(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return r.stdout.decode().strip().splitlines()[0].strip()


def tool_versions():
    for tool in ["sox", "ffmpeg", "flac", "lame", "oggenc", "oggdec", "opusenc", "opusdec"]:
        if shutil.which(tool) is None:
            sys.exit(f"missing tool: {tool}")
    v = {
        "sox": first_line(["sox", "--version"]).replace("sox:", "").strip(),
        "ffmpeg": first_line(["ffmpeg", "-version"]).split(" Copyright")[0],
        "flac": first_line(["flac", "--version"]),
        "lame": first_line(["lame", "--version"]),
        "oggenc": first_line(["oggenc", "--version"]),
        "oggdec": first_line(["oggdec", "--version"]),
        "opusenc": first_line(["opusenc", "--version"]),
        "opusdec": first_line(["opusdec", "--version"]),
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }
    return v


# ---------------------------------------------------------------------------- RIFF helpers


def riff_chunks(data):
    assert data[:4] in (b"RIFF", b"RF64") and data[8:12] == b"WAVE", "not a RIFF/WAVE file"
    p, out = 12, []
    while p + 8 <= len(data):
        cid = data[p:p + 4].decode("latin1")
        size = struct.unpack("<I", data[p + 4:p + 8])[0]
        out.append((cid, p, size))
        p += 8 + size + (size & 1)
    return out


def wav_fmt(data):
    for cid, p, size in riff_chunks(data):
        if cid == "fmt ":
            tag, ch, rate, _, align, bits = struct.unpack("<HHIIHH", data[p + 8:p + 24])
            sub = None
            if tag == 0xFFFE:
                sub = struct.unpack("<H", data[p + 32:p + 34])[0]
            return {"tag": tag, "channels": ch, "rate": rate, "block_align": align,
                    "bits": bits, "subformat": sub, "fmt_offset": p}
    raise AssertionError("no fmt chunk")


def wav_data(data):
    for cid, p, size in riff_chunks(data):
        if cid == "data":
            return p, size
    raise AssertionError("no data chunk")


def float_wav_samples(path):
    """The samples of an IEEE-float WAV (tag 3, or extensible with subformat 3)."""
    data = open(path, "rb").read()
    f = wav_fmt(data)
    assert f["tag"] == 3 or (f["tag"] == 0xFFFE and f["subformat"] == 3), f
    p, size = wav_data(data)
    dt = {32: "<f4", 64: "<f8"}[f["bits"]]
    return np.frombuffer(data[p + 8:p + 8 + size], dtype=dt).reshape(-1, f["channels"]), f


# ---------------------------------------------------------------------------- MP3 helper


def lame_tag(path):
    """Encoder delay / padding from the Xing/Info + LAME tag of the first frame."""
    data = open(path, "rb").read()
    p = 0
    if data[:3] == b"ID3":
        sz = data[6:10]
        p = 10 + ((sz[0] << 21) | (sz[1] << 14) | (sz[2] << 7) | sz[3])
    assert data[p] == 0xFF and (data[p + 1] & 0xE0) == 0xE0, "no frame sync after ID3"
    for magic in (b"Xing", b"Info"):
        q = data.find(magic, p, p + 200)
        if q >= 0:
            break
    else:
        return None
    flags = struct.unpack(">I", data[q + 4:q + 8])[0]
    r = q + 8
    frames = None
    if flags & 1:
        frames = struct.unpack(">I", data[r:r + 4])[0]
        r += 4
    if flags & 2:
        r += 4
    if flags & 4:
        r += 100
    if flags & 8:
        r += 4
    lame = data[r:r + 36]
    d = lame[21:24]
    return {"tag": magic.decode(), "mpeg_frames": frames, "encoder": lame[:9].decode("latin1"),
            "enc_delay": (d[0] << 4) | (d[1] >> 4), "enc_padding": ((d[1] & 0x0F) << 8) | d[2],
            "id3v2": data[:3] == b"ID3", "id3v1": data[-128:-125] == b"TAG"}


def last_granule(path):
    """Granule position of the last Ogg page (the stream's end, for the end trim)."""
    d = open(path, "rb").read()
    p, g = 0, None
    while p < len(d):
        assert d[p:p + 4] == b"OggS"
        g = struct.unpack("<q", d[p + 6:p + 14])[0]
        nseg = d[p + 26]
        p += 27 + nseg + sum(d[p + 27:p + 27 + nseg])
    return g


# ---------------------------------------------------------------------------- main


def main():
    versions = tool_versions()
    for k, v in versions.items():
        print(f"{k}: {v}")
    ffver = versions["ffmpeg"]
    out = HERE
    files, bad = [], []

    with tempfile.TemporaryDirectory() as tmp:
        def raw_in(name, arr, dtype):
            arr = np.asarray(arr)
            if dtype == "s24":
                v = arr.astype("<i4").reshape(-1)
                b = np.stack([(v & 0xFF), (v >> 8) & 0xFF, (v >> 16) & 0xFF], axis=1).astype(np.uint8)
                b.tofile(os.path.join(tmp, name))
            else:
                arr.astype(dtype).tofile(os.path.join(tmp, name))
            return name

        def keep(name):
            shutil.copyfile(os.path.join(tmp, name), os.path.join(out, name))

        def sox_ref_int(name, bits, via_s16=False):
            """sox's decode, as int32 at the file's own bit depth (sign-extended)."""
            if via_s16:
                pcm = np.frombuffer(run(["sox", "-D", name, "-t", "s16", "-"], tmp), "<i2").astype("<i4")
            else:
                pcm = np.frombuffer(run(["sox", "-D", name, "-t", "s32", "-"], tmp), "<i4") >> (32 - bits)
            return pcm.astype("<i4")

        def entry(**kw):
            files.append(kw)
            return kw

        # ------------------------------------------------------------------ WAV
        # (name, rate, channels, encoding, bits, sox output type, expected tag)
        wavs = [
            ("pcm_u8_8k.wav", 8000, 1, "unsigned", 8, "wav", 1),
            ("pcm_s16_16k.wav", 16000, 1, "signed", 16, "wav", 1),
            ("pcm_s16_44k_stereo.wav", 44100, 2, "signed", 16, "wav", 1),
            ("pcm_s24_48k.wav", 48000, 1, "signed", 24, "wavpcm", 1),
            ("pcm_s32_16k.wav", 16000, 1, "signed", 32, "wavpcm", 1),
            ("extensible_s24_48k_stereo.wav", 48000, 2, "signed", 24, "wav", 0xFFFE),
            ("float32_16k.wav", 16000, 1, "float", 32, "wav", 3),
            ("float64_22k.wav", 22050, 1, "float", 64, "wav", 3),
            ("alaw_8k.wav", 8000, 1, "a-law", 8, "wav", 6),
            ("mulaw_8k.wav", 8000, 1, "u-law", 8, "wav", 7),
        ]
        for name, rate, ch, enc, bits, otype, tag in wavs:
            x = signal(rate, ch)
            stem = name[:-4]
            if enc in ("signed", "unsigned"):
                q = quantize(x, bits)
                if enc == "unsigned":
                    src = raw_in(stem + ".in.raw", q + 128, "u1")
                    in_args = ["-e", "unsigned-integer", "-b", "8"]
                elif bits == 24:
                    src = raw_in(stem + ".in.raw", q, "s24")
                    in_args = ["-e", "signed-integer", "-b", "24"]
                else:
                    src = raw_in(stem + ".in.raw", q, {16: "<i2", 32: "<i4"}[bits])
                    in_args = ["-e", "signed-integer", "-b", str(bits)]
                out_args = ["-e", {"signed": "signed-integer", "unsigned": "unsigned-integer"}[enc],
                            "-b", str(bits)]
            elif enc == "float":
                q = None
                src = raw_in(stem + ".in.raw", x, "<f8")
                in_args = ["-e", "floating-point", "-b", "64"]
                out_args = ["-e", "floating-point", "-b", str(bits)]
            else:  # A-law / mu-law: sox encodes from 16-bit linear
                q = None
                src = raw_in(stem + ".in.raw", quantize(x, 16), "<i2")
                in_args = ["-e", "signed-integer", "-b", "16"]
                out_args = ["-e", enc]
            cmd = (["sox", "-D", "-t", "raw", "-r", str(rate), "-c", str(ch), "-L"] + in_args
                   + [src, "-t", otype] + out_args + [name])
            run(cmd, tmp)
            data = open(os.path.join(tmp, name), "rb").read()
            f = wav_fmt(data)
            assert f["tag"] == tag, (name, hex(f["tag"]))
            assert f["channels"] == ch and f["rate"] == rate, (name, f)
            keep(name)
            e = dict(file=name, codec="wav", container="riff-wave", format_tag=f"0x{f['tag']:04X}",
                     encoder_command=shlex.join(cmd), encoder=f"sox {versions['sox']}",
                     lossless=enc not in ("a-law", "u-law"))
            if f["tag"] == 0xFFFE:
                e["subformat"] = f"0x{f['subformat']:04X}"
            if enc == "float":
                ext = {32: "f32", 64: "f64"}[bits]
                fcodec = {32: "pcm_f32le", 64: "pcm_f64le"}[bits]
                ref = run(["ffmpeg", "-v", "error", "-c:a", fcodec, "-i", name,
                           "-f", fcodec[4:], "-c:a", fcodec, "-"], tmp)
                pcm = np.frombuffer(ref, {"f32": "<f4", "f64": "<f8"}[ext])
                parsed, _ = float_wav_samples(os.path.join(tmp, name))
                assert np.array_equal(pcm.view(np.uint8), parsed.reshape(-1).view(np.uint8)), name
                np.testing.assert_allclose(pcm.reshape(-1, ch), x, atol=1e-6)
                reff = f"{stem}.{ext}"
                open(os.path.join(out, reff), "wb").write(ref)
                e.update(reference_file=reff, reference_decoder=f"{ffver} (decoder {fcodec})",
                         sample_format=ext)
            elif enc in ("a-law", "u-law"):
                pcm = sox_ref_int(name, 16, via_s16=True)
                lin = quantize(x, 16).reshape(-1)
                assert np.max(np.abs(pcm - lin)) < 1100, name  # companding error only
                reff = stem + ".s32"
                pcm.tofile(os.path.join(out, reff))
                e.update(reference_file=reff, reference_decoder=f"sox {versions['sox']} (`sox X -t s16 -`, widened to int32)",
                         sample_format="s32", bits=16)
            else:
                pcm = sox_ref_int(name, bits)
                assert np.array_equal(pcm, q.reshape(-1)), name  # the writer kept our samples
                reff = stem + ".s32"
                pcm.tofile(os.path.join(out, reff))
                e.update(reference_file=reff,
                         reference_decoder=f"sox {versions['sox']} (`sox X -t s32 -`, shifted right by {32 - bits})",
                         sample_format="s32", bits=bits)
            e.update(rate=rate, channels=ch, frames=len(pcm) // ch)
            entry(**e)

        # WAV with a LIST/INFO chunk before data, written by ffmpeg.
        name = "pcm_s16_16k_list_chunk.wav"
        q = quantize(signal(16000, 1), 16)
        src = raw_in("list.in.raw", q, "<i2")
        cmd = ["ffmpeg", "-v", "error", "-y", "-f", "s16le", "-ar", "16000", "-ac", "1", "-i", src,
               "-fflags", "+bitexact", "-metadata", "title=asrc fixture", "-metadata", "artist=asrc",
               "-c:a", "pcm_s16le", name]
        run(cmd, tmp)
        data = open(os.path.join(tmp, name), "rb").read()
        ids = [c[0] for c in riff_chunks(data)]
        assert "LIST" in ids and ids.index("LIST") < ids.index("data"), ids
        assert wav_fmt(data)["tag"] == 1
        keep(name)
        pcm = sox_ref_int(name, 16)
        assert np.array_equal(pcm, q.reshape(-1))
        pcm.tofile(os.path.join(out, "pcm_s16_16k_list_chunk.s32"))
        entry(file=name, codec="wav", container="riff-wave", format_tag="0x0001",
              chunks=ids, encoder_command=shlex.join(cmd), encoder=ffver, lossless=True,
              reference_file="pcm_s16_16k_list_chunk.s32",
              reference_decoder=f"sox {versions['sox']} (`sox X -t s32 -`, shifted right by 16)",
              sample_format="s32", bits=16, rate=16000, channels=1, frames=len(pcm))
        for e in files:  # record every WAV's chunk order
            e.setdefault("chunks", [c[0] for c in riff_chunks(open(os.path.join(out, e["file"]), "rb").read())])

        # ------------------------------------------------------------------ FLAC
        name = "flac_16k.flac"
        cmd = ["flac", "--silent", "-8", "-P", "256", "-o", name, "pcm_s16_16k.wav"]
        run(cmd, tmp)
        keep(name)
        ref = run(["flac", "--silent", "-d", "-c", "--force-raw-format", "--endian=little",
                   "--sign=signed", name], tmp)
        pcm = np.frombuffer(ref, "<i2").astype("<i4")
        assert np.array_equal(pcm, quantize(signal(16000, 1), 16).reshape(-1))
        pcm.tofile(os.path.join(out, "flac_16k.s32"))
        entry(file=name, codec="flac", container="flac", encoder_command=shlex.join(cmd),
              encoder=versions["flac"], lossless=True, reference_file="flac_16k.s32",
              reference_decoder=f"{versions['flac']} (`flac -d --force-raw-format --endian=little --sign=signed`, widened to int32)",
              sample_format="s32", bits=16, rate=16000, channels=1, frames=len(pcm))

        # ------------------------------------------------------------------ lossy
        def ffmpeg_f32(name, decoder, ch):
            ref = run(["ffmpeg", "-v", "error", "-c:a", decoder, "-i", name,
                       "-f", "f32le", "-c:a", "pcm_f32le", "-"], tmp)
            return np.frombuffer(ref, "<f4"), ref

        def stream_rate(name):
            o = subprocess.run(["ffmpeg", "-hide_banner", "-i", name], cwd=tmp,
                               stderr=subprocess.PIPE).stderr.decode()
            line = [l for l in o.splitlines() if "Audio:" in l][0]
            return line.strip(), int(line.split(" Hz")[0].split()[-1])

        # MP3 (lame) -> ffmpeg's mp3float decoder
        mp3s = [
            ("mp3_cbr_16k.mp3", "pcm_s16_16k.wav", 16000, 1,
             ["lame", "--quiet", "-m", "m", "--cbr", "-b", "32"]),
            ("mp3_vbr_44k_stereo.mp3", "pcm_s16_44k_stereo.wav", 44100, 2,
             ["lame", "--quiet", "-V", "4", "--tt", "asrc fixture", "--add-id3v2"]),
        ]
        for name, src, rate, ch, enc in mp3s:
            cmd = enc + [src, name]
            run(cmd, tmp)
            keep(name)
            pcm, ref = ffmpeg_f32(name, "mp3float", ch)
            reff = name[:-4] + ".f32"
            open(os.path.join(out, reff), "wb").write(ref)
            tag = lame_tag(os.path.join(tmp, name))
            desc, srate = stream_rate(name)
            if tag is None:
                # lame writes no Xing/Info+LAME tag when it does not fit in the first frame
                # (a 32 kbps MPEG-2 frame at 16 kHz is 144 bytes): no gapless information,
                # so a decoder keeps the encoder delay and the padding of the last frame.
                note = ("no Xing/Info/LAME tag (the 144-byte 32 kbps MPEG-2 frame is too small for it): "
                        "ffmpeg trims nothing, so frames = whole MPEG frames x 576, including LAME's "
                        "576-sample encoder delay and the 529-sample decoder delay at the start")
            else:
                note = ("ffmpeg drops enc_delay + 529 (decoder delay) samples at the start and "
                        "enc_padding - 529 at the end, using the LAME tag; the Xing/Info frame itself "
                        "decodes to nothing")
            data = open(os.path.join(tmp, name), "rb").read()
            container = "mpeg-audio" + (" with ID3v2" if data[:3] == b"ID3" else "") + (
                " and ID3v1" if data[-128:-125] == b"TAG" else "")
            entry(file=name, codec="mp3", container=container,
                  encoder_command=shlex.join(cmd), encoder=versions["lame"], lossless=False,
                  reference_file=reff, reference_decoder=f"{ffver} (decoder mp3float)",
                  sample_format="f32", rate=srate, channels=ch, frames=len(pcm) // ch,
                  source_frames=int(round(rate * DUR)), lame_tag=tag, ffmpeg_stream=desc,
                  notes=note)

        # Ogg Vorbis (oggenc) -> ffmpeg's native vorbis decoder
        vorbis = [("vorbis_16k.ogg", "pcm_s16_16k.wav", 16000, 1, "1001"),
                  ("vorbis_44k_stereo.ogg", "pcm_s16_44k_stereo.wav", 44100, 2, "1002")]
        for name, src, rate, ch, serial in vorbis:
            cmd = ["oggenc", "--quiet", "-q", "3", "-s", serial, "-o", name, src]
            run(cmd, tmp)
            keep(name)
            pcm, ref = ffmpeg_f32(name, "vorbis", ch)
            reff = name[:-4] + ".f32"
            open(os.path.join(out, reff), "wb").write(ref)
            desc, srate = stream_rate(name)
            # libvorbis (oggdec) as a second opinion: it applies the end trim given by the
            # last page's granule position exactly.
            odec = ["oggdec", "--quiet", "--raw", "--bits", "16", "--endianness", "0", "--sign", "1",
                    "-o", name[:-4] + ".oggdec.raw", name]
            run(odec, tmp)
            opcm = np.fromfile(os.path.join(tmp, name[:-4] + ".oggdec.raw"), "<i2").astype("<i4")
            gran = last_granule(os.path.join(tmp, name))
            assert len(opcm) // ch == gran, (name, len(opcm), gran)
            n = min(len(pcm), len(opcm))
            assert np.max(np.abs(pcm[:n] - opcm[:n] / 32768.0)) < 1e-3, name
            e = entry(file=name, codec="vorbis", container="ogg", encoder_command=shlex.join(cmd),
                      encoder=versions["oggenc"], lossless=False, reference_file=reff,
                      reference_decoder=f"{ffver} (native decoder vorbis)", sample_format="f32",
                      rate=srate, channels=ch, frames=len(pcm) // ch, source_frames=int(round(rate * DUR)),
                      last_granule_position=gran, ffmpeg_stream=desc)
            alt = {"reference_decoder": f"{versions['oggdec']} (libvorbis; `{shlex.join(odec)}`)",
                   "sample_format": "s32", "bits": 16, "rate": rate, "channels": ch,
                   "frames": len(opcm) // ch}
            if len(pcm) // ch != gran:
                # keep libvorbis's decode only where the two disagree (size)
                alt["reference_file"] = name[:-4] + ".oggdec.s32"
                opcm.tofile(os.path.join(out, alt["reference_file"]))
                e["notes"] = (f"ffmpeg's decode has {len(pcm) // ch - gran} frames more than the last "
                              f"granule position ({gran}) allows: ffmpeg 5.1 does not apply the end trim "
                              f"to this stream, whose audio packets all lie in its one last (EOS) page; its first {gran} frames are the conforming decode (libvorbis, "
                              f"oggdec, gives exactly {gran})")
            else:
                alt["reference_file"] = None
                alt["note"] = "not stored (same length as ffmpeg's; agrees to 16-bit precision)"
            e["alt_references"] = [alt]

        # Ogg Opus (opusenc) -> opusdec --float (and ffmpeg's native opus decoder)
        x48 = quantize(signal(48000, 2), 16)
        raw_in("s16_48k_stereo.raw", x48, "<i2")
        run(["sox", "-D", "-t", "raw", "-r", "48000", "-c", "2", "-L", "-e", "signed-integer", "-b", "16",
             "s16_48k_stereo.raw", "pcm_s16_48k_stereo.wav"], tmp)
        opus = [("opus_16k.opus", "pcm_s16_16k.wav", 16000, 1, "2001", "24"),
                ("opus_48k_stereo.opus", "pcm_s16_48k_stereo.wav", 48000, 2, "2002", "48")]
        for name, src, rate, ch, serial, kbps in opus:
            cmd = ["opusenc", "--quiet", "--serial", serial, "--bitrate", kbps, src, name]
            run(cmd, tmp)
            keep(name)
            stem = name[:-5]
            dec = ["opusdec", "--quiet", "--float", "--no-dither", "--rate", "48000", name, stem + ".dec.wav"]
            run(dec, tmp)
            pcm, f = float_wav_samples(os.path.join(tmp, stem + ".dec.wav"))
            assert f["channels"] == ch and f["rate"] == 48000, f
            open(os.path.join(out, stem + ".f32"), "wb").write(pcm.astype("<f4").tobytes())
            fpcm, fref = ffmpeg_f32(name, "opus", ch)
            assert len(fpcm) == pcm.size and np.max(np.abs(fpcm - pcm.reshape(-1))) < 1e-2, name
            open(os.path.join(out, stem + ".ffmpeg.f32"), "wb").write(fref)
            data = open(os.path.join(tmp, name), "rb").read()
            h = data.find(b"OpusHead")
            pre_skip, in_rate = struct.unpack("<HI", data[h + 10:h + 16])
            desc, srate = stream_rate(name)
            entry(file=name, codec="opus", container="ogg", encoder_command=shlex.join(cmd),
                  encoder=versions["opusenc"], lossless=False, reference_file=stem + ".f32",
                  reference_decoder=f"{versions['opusdec']} (`{shlex.join(dec)}`)",
                  sample_format="f32", rate=48000, channels=ch, frames=pcm.shape[0],
                  source_frames=int(round(rate * DUR)), source_rate=rate,
                  opus_head={"pre_skip": pre_skip, "input_sample_rate": in_rate},
                  alt_references=[{"reference_file": stem + ".ffmpeg.f32",
                                   "reference_decoder": f"{ffver} (native decoder opus)",
                                   "sample_format": "f32", "rate": srate, "channels": ch,
                                   "frames": len(fpcm) // ch}],
                  ffmpeg_stream=desc)

        # AAC-LC (ffmpeg's native encoder) in MP4/M4A and ADTS -> ffmpeg's native aac decoder.
        # The encoder primes with 1024 samples; the MP4 muxer's edit list (elst) says the
        # recording starts at media time 1024 and lasts 300 ms. ffmpeg 5.1 drops the priming
        # (the edit's start) but not the last frame's padding (its end): its first
        # `edit_list_frames` frames are the recording, which the alignment check below confirms.
        # ADTS has no edit list: every decoder gives every frame, priming and padding included.
        aacs = [("aac_16k.m4a", "pcm_s16_16k.wav", 16000, 1, "32k", []),
                ("aac_44k_stereo.m4a", "pcm_s16_44k_stereo.wav", 44100, 2, "96k",
                 ["-movflags", "+faststart"]),
                ("aac_16k.aac", "pcm_s16_16k.wav", 16000, 1, "32k", ["-f", "adts"])]
        for name, src, rate, ch, kbps, extra in aacs:
            cmd = (["ffmpeg", "-v", "error", "-y", "-i", src, "-fflags", "+bitexact", "-c:a", "aac",
                    "-b:a", kbps] + extra + [name])
            run(cmd, tmp)
            keep(name)
            pcm, ref = ffmpeg_f32(name, "aac", ch)
            reff = name.replace(".", "_") + ".f32"
            open(os.path.join(out, reff), "wb").write(ref)
            desc, srate = stream_rate(name)
            source = quantize(signal(rate, ch), 16)[:, 0] / 32768.0
            got = pcm.reshape(-1, ch)[:, 0]
            n = len(source)
            # The lag at which ffmpeg's decode best matches the source: 0 where the priming is
            # dropped (MP4), 1024 where it is kept (ADTS).
            lags = range(0, 2048)
            lag = max(lags, key=lambda k: float(np.dot(got[k:k + n], source[:len(got[k:k + n])])))
            e = entry(file=name, codec="aac", encoder_command=shlex.join(cmd), encoder=ffver,
                      lossless=False, reference_file=reff,
                      reference_decoder=f"{ffver} (native decoder aac)", sample_format="f32",
                      rate=srate, channels=ch, frames=len(pcm) // ch, source_frames=n,
                      ffmpeg_stream=desc, source_lag=lag)
            if name.endswith(".m4a"):
                assert lag == 0, (name, lag)
                data = open(os.path.join(tmp, name), "rb").read()
                i = data.find(b"elst")
                count, duration, media_time = struct.unpack(">III", data[i + 8:i + 20])
                assert count == 1 and duration == 300 and media_time == 1024, (count, duration, media_time)
                moov, mdat = data.find(b"moov"), data.find(b"mdat")
                e.update(container="mp4 (moov " + ("before" if moov < mdat else "after") + " mdat)",
                         edit_list={"segment_duration_ms": duration, "media_time": media_time},
                         edit_list_frames=n,
                         notes=(f"ffmpeg 5.1 drops the edit list's {media_time} priming samples but "
                                f"keeps the last frame's padding: {len(pcm) // ch - n} frames past "
                                f"the edit's {n}; its first {n} are the conforming decode"))
            else:
                assert lag == 1024 and len(pcm) // ch % 1024 == 0, (name, lag, len(pcm))
                e.update(container="adts",
                         notes="no edit list: ffmpeg decodes every frame, the encoder's 1024 "
                               "priming samples and the last frame's padding included")

        # ------------------------------------------------------------------ bad files
        good = open(os.path.join(out, "pcm_s16_16k.wav"), "rb").read()
        p, size = wav_data(good)
        cut = p + 8 + size // 2
        open(os.path.join(out, "bad_truncated.wav"), "wb").write(good[:cut])
        bad.append({"file": "bad_truncated.wav",
                    "description": f"pcm_s16_16k.wav cut after {cut} of {len(good)} bytes: the data chunk header says {size} bytes, {size // 2} are present"})
        fo = wav_fmt(good)["fmt_offset"]
        b = bytearray(good)
        b[fo + 10:fo + 12] = struct.pack("<H", 0)
        open(os.path.join(out, "bad_zero_channels.wav"), "wb").write(b)
        bad.append({"file": "bad_zero_channels.wav",
                    "description": "pcm_s16_16k.wav with nChannels = 0 in the fmt chunk (block align and byte rate left as they were)"})
        b = bytearray(good)
        b[fo + 8:fo + 10] = struct.pack("<H", 0x1234)
        open(os.path.join(out, "bad_unknown_format.wav"), "wb").write(b)
        bad.append({"file": "bad_unknown_format.wav",
                    "description": "pcm_s16_16k.wav with the fmt format tag set to 0x1234 (no such codec)"})
        rng = np.random.default_rng(7)
        garbage = bytes([0xFF, 0xFB, 0x90, 0x64]) + rng.integers(0, 256, 2000, dtype=np.uint8).tobytes()
        open(os.path.join(out, "bad_garbage.mp3"), "wb").write(garbage)
        bad.append({"file": "bad_garbage.mp3",
                    "description": "a valid MPEG-1 Layer III frame header (FF FB 90 64: 128 kbps, 44.1 kHz, joint stereo, no CRC) followed by 2000 seeded random bytes"})
        op = open(os.path.join(out, "opus_16k.opus"), "rb").read()
        assert op[len(op) // 2:len(op) // 2 + 4] != b"OggS"
        open(os.path.join(out, "bad_truncated.opus"), "wb").write(op[:len(op) // 2])
        bad.append({"file": "bad_truncated.opus",
                    "description": f"the first {len(op) // 2} of {len(op)} bytes of opus_16k.opus (ends inside an Ogg page, no end-of-stream page)"})
        m4a = open(os.path.join(out, "aac_44k_stereo.m4a"), "rb").read()
        cut = m4a.find(b"mdat") + len(m4a[m4a.find(b"mdat"):]) // 2
        open(os.path.join(out, "bad_truncated.m4a"), "wb").write(m4a[:cut])
        bad.append({"file": "bad_truncated.m4a",
                    "description": f"the first {cut} of {len(m4a)} bytes of aac_44k_stereo.m4a (index before the audio; cut half way through the audio)"})
        m4a = bytearray(open(os.path.join(out, "aac_16k.m4a"), "rb").read())
        i = m4a.find(b"mdhd")
        assert m4a[i + 4] == 0 and struct.unpack(">I", m4a[i + 16:i + 20])[0] == 16000
        m4a[i + 16:i + 20] = struct.pack(">I", 32000)
        open(os.path.join(out, "bad_he_aac.m4a"), "wb").write(m4a)
        bad.append({"file": "bad_he_aac.m4a",
                    "description": "aac_16k.m4a with the audio track's timescale (mdhd) set to 32000, twice the AAC core's rate, as an HE-AAC (SBR) file's is"})
        m4a = bytearray(open(os.path.join(out, "aac_16k.m4a"), "rb").read())
        assert m4a.find(b"moov") > m4a.find(b"mdat"), "the index must follow the audio"
        # A second edit (100 ms from media time 8000): the atoms that hold elst grow by 12.
        i = m4a.find(b"elst")
        m4a[i + 8:i + 12] = struct.pack(">I", 2)
        m4a[i + 20 + 4:i + 20 + 4] = struct.pack(">IiI", 100, 8000, 1 << 16)
        for kind in (b"elst", b"edts", b"trak", b"moov"):
            j = m4a.find(kind)
            m4a[j - 4:j] = struct.pack(">I", struct.unpack(">I", m4a[j - 4:j])[0] + 12)
        open(os.path.join(out, "bad_edit_list.m4a"), "wb").write(m4a)
        bad.append({"file": "bad_edit_list.m4a",
                    "description": "aac_16k.m4a with a second edit in its edit list (100 ms from media time 8000): the track played in two pieces"})
        run(["ffmpeg", "-v", "error", "-y", "-i", "pcm_s16_16k.wav", "-fflags", "+bitexact",
             "-c:a", "alac", "bad_alac.m4a"], tmp)
        keep("bad_alac.m4a")
        bad.append({"file": "bad_alac.m4a",
                    "description": "pcm_s16_16k.wav in an M4A as Apple Lossless (ffmpeg -c:a alac): an MP4 of a codec other than AAC"})
        open(os.path.join(out, "bad_not_audio.txt"), "w").write(
            "This is not an audio file.\nIt is plain text, for the decoder's reject tests.\n")
        bad.append({"file": "bad_not_audio.txt", "description": "plain ASCII text"})

    index = {
        "generator": "make_fixtures.py",
        "tools": versions,
        "signal": {"duration_s": DUR, "peak": 0.5,
                   "description": "speech-like harmonic signal (f0 130->170 Hz glide + 5.5 Hz vibrato, formant-shaped harmonics, syllable envelope, seeded noise); stereo: right = left delayed 1 ms x 0.6"},
        "raw_formats": {"s32": "interleaved int32 little-endian, values at the file's own bit depth, sign-extended",
                        "f32": "interleaved float32 little-endian", "f64": "interleaved float64 little-endian"},
        "files": files,
        "bad": bad,
    }
    with open(os.path.join(out, "index.json"), "w") as fh:
        json.dump(index, fh, indent=1)
        fh.write("\n")
    for e in files:
        print(f"{e['file']:32s} {e['codec']:6s} rate={e['rate']} ch={e['channels']} frames={e['frames']}"
              + (f" (source {e['source_frames']})" if "source_frames" in e else ""))


if __name__ == "__main__":
    main()
