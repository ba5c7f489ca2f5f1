"""Float64 reference of NeMo's log-mel features (FilterbankFeatures with the defaults the
trainer uses), written with numpy's FFT, for trainer/tests/it/mel.rs.

stdin: JSON {"pcm": [[int16...], ...], "features": F, "dither": 0}
stdout: JSON {"features": [[[...F...] per frame] per utterance], "lens": [...]}
"""
import json
import sys

import numpy as np


def slaney_mel(f):
    f = np.asarray(f, dtype=np.float64)
    lin = f / (200.0 / 3.0)
    log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f < 1000.0, lin, log)


def slaney_hz(m):
    m = np.asarray(m, dtype=np.float64)
    lin = m * (200.0 / 3.0)
    log = 1000.0 * np.exp((m - 15.0) * (np.log(6.4) / 27.0))
    return np.where(m < 15.0, lin, log)


def filterbank(sr, n_fft, n_mels):
    freqs = np.arange(n_fft // 2 + 1) * sr / n_fft
    pts = slaney_hz(np.linspace(slaney_mel(0.0), slaney_mel(sr / 2), n_mels + 2))
    fb = np.zeros((n_mels, len(freqs)))
    for m in range(n_mels):
        lower = (freqs - pts[m]) / (pts[m + 1] - pts[m])
        upper = (pts[m + 2] - freqs) / (pts[m + 2] - pts[m + 1])
        fb[m] = np.maximum(0, np.minimum(lower, upper)) * 2.0 / (pts[m + 2] - pts[m])
    return fb


def features(pcm, n_mels, sr=16000, n_fft=512, win=400, hop=160, preemph=0.97):
    x = np.asarray(pcm, dtype=np.float64) / 32768.0
    x = np.concatenate([x[:1], x[1:] - preemph * x[:-1]])
    window = np.zeros(n_fft)
    off = (n_fft - win) // 2
    window[off:off + win] = np.hanning(win)  # symmetric, as torch.hann_window(periodic=False)
    padded = np.pad(x, n_fft // 2)  # center=True, zeros
    # NeMo 2 (FilterbankFeatures.get_seq_len) counts len // hop valid frames: the last centred
    # frame is padding.
    n_frames = len(x) // hop
    frames = np.stack([padded[t * hop:t * hop + n_fft] * window for t in range(n_frames)])
    power = np.abs(np.fft.rfft(frames, n=n_fft, axis=1)) ** 2
    mel = np.log(power @ filterbank(sr, n_fft, n_mels).T + 2.0 ** -24)
    mean = mel.mean(axis=0)
    std = mel.std(axis=0, ddof=1)
    return (mel - mean) / (std + 1e-5), n_frames


def main():
    req = json.load(sys.stdin)
    out, lens = [], []
    for pcm in req["pcm"]:
        f, n = features(pcm, req["features"])
        out.append(f.tolist())
        lens.append(n)
    json.dump({"features": out, "lens": lens}, sys.stdout)


if __name__ == "__main__":
    main()
