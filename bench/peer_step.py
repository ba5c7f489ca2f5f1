#!/usr/bin/env python3
"""The peer of an asrt training step: transformers' ParakeetForTDT, same shape, same batch size.

    python3 bench/peer_step.py [--device cuda] [--precisions f32,tf32,bf16] [--steps 6]
                               [--batch-seconds 120] [--preset P] [--layers N] [--forward-only]
                               [--part model|encoder]
                               [--threads N] [--saved-tensors] [--json-out FILE] [--profile FILE]

Builds ParakeetForTDT (transformers 5.x) randomly initialised from a config matching asrt's
`parakeet-tdt-0.6b` preset (24 x 1024 FastConformer, 8x subsampling, 2 x 640 LSTM prediction
network, 640 joint, 1024 pieces + blank, durations 0-4; dropout 0.1, no layer drop), and runs
optimizer steps on synthetic utterances drawn as the GPU kit's corpus is (uniform 5-20 s, at most
80 tokens of a 1024-piece vocabulary), packed up to --batch-seconds of audio per step as asrt's
sampler packs them.

One step is what asrt's step is: the log-mel features of the padded batch computed on the device
(NeMo's recipe in torch: pre-emphasis 0.97, 25 ms Hann windows every 10 ms, 512-point power
spectrum, 80 Slaney mel bands, log, per-band normalisation over each utterance's frames; written
here because transformers' ParakeetFeatureExtractor needs librosa), the model's forward with its TDT loss
(transformers' pure-PyTorch `loss_tdt`, reduction "mean"), backward, gradient clipping at 1.0
and fused AdamW. The waveforms are in host memory before the step, as a data loader leaves them.

The TDT loss dominates that step (transformers' loss is written in plain PyTorch ops; the GPU
kit measured it at 2.26 s for one [4, 300, 81, 1030] case on an H100). A run named with
"+softmax-loss" replaces it by the mean of a log-softmax over the same logits, a loss as cheap as
a fused TDT kernel (asrt's and NeMo's are of that order): that run measures the model and the
optimizer, what a PyTorch trainer with a fast loss would spend.

--part encoder times the features and the encoder alone (`model.encoder`) with a surrogate loss,
the mean square of its output, forward and backward, with no clipping or update: the FastConformer
that is nearly all of a 24-layer step, compared with asrt's (`asrt-bench train-step --part encoder`)
free of either side's joint and loss.

Precisions: f32 (float32 matmuls at full precision, PyTorch's default), tf32 (float32 with TF32
tensor-core matmuls, as asrt's f32 on CUDA may use), bf16 (torch.autocast bfloat16, NeMo's
"bf16-mixed"). For each: median step seconds after the first, audio seconds per second, peak
device memory (torch.cuda.max_memory_allocated), the first step's seconds. Prints one JSON object.
--preset tiny builds asrt's `tiny` instead, --preset small the 0.6B structure at a CPU's width
(the GPU kit's dry run). Exits 3 when torch or transformers' ParakeetForTDT is missing, saying so.
"""

import argparse
import contextlib
import json
import random
import statistics
import sys
import time


def batches(rng, count, batch_seconds, min_s, max_s, max_tokens, vocab):
    """`count` batches of (seconds, labels, total seconds): utterances of uniform length in [min_s, max_s],
    packed while the batch stays within batch_seconds (at least one per batch)."""
    out = []
    for _ in range(count):
        seconds, total = [], 0.0
        while True:
            s = rng.uniform(min_s, max_s)
            if seconds and total + s > batch_seconds:
                break
            seconds.append(s)
            total += s
        labels = [[rng.randrange(vocab) for _ in range(rng.randint(max(1, max_tokens // 4), max_tokens))]
                  for _ in seconds]
        out.append((seconds, labels, total))
    return out


class LogMel:
    """Log-mel features of a padded batch on the device, with the frames' attention mask."""

    def __init__(self, torch, np, device, rate, n_fft=512, win=400, hop=160, mels=80):
        self.torch, self.device, self.n_fft, self.win, self.hop = torch, device, n_fft, win, hop
        self.window = torch.hann_window(win, periodic=False, device=device)
        self.filters = torch.from_numpy(slaney_mel(np, rate, n_fft, mels)).to(device)

    def __call__(self, waves):
        torch = self.torch
        lens = torch.tensor([len(w) for w in waves])
        pad = torch.zeros(len(waves), int(lens.max()))
        for i, w in enumerate(waves):
            pad[i, :len(w)] = torch.from_numpy(w)
        x = pad.to(self.device, non_blocking=True)
        x = torch.cat([x[:, :1], x[:, 1:] - 0.97 * x[:, :-1]], dim=1)
        spec = torch.stft(x, self.n_fft, self.hop, self.win, self.window, center=True, return_complex=True)
        power = spec.real ** 2 + spec.imag ** 2
        mel = torch.log(torch.matmul(self.filters, power) + 2.0 ** -24)  # (B, mels, frames)
        frames = (lens // self.hop + 1).to(self.device)
        mask = torch.arange(mel.shape[2], device=self.device)[None, :] < frames[:, None]
        m = mask[:, None, :].to(mel.dtype)
        mean = (mel * m).sum(2, keepdim=True) / frames[:, None, None]
        var = (((mel - mean) * m) ** 2).sum(2, keepdim=True) / (frames[:, None, None] - 1).clamp(min=1)
        mel = (mel - mean) / (var.sqrt() + 1e-5) * m
        return {"input_features": mel.transpose(1, 2).contiguous(), "attention_mask": mask}


def slaney_mel(np, rate, n_fft, mels, fmin=0.0, fmax=None):
    """Triangular mel filters on the Slaney scale, area-normalised (librosa's default)."""
    fmax = fmax or rate / 2
    def to_mel(f):
        f = np.asarray(f, dtype=np.float64)
        lin = f / (200.0 / 3)
        log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
        return np.where(f >= 1000.0, log, lin)
    def to_hz(m):
        m = np.asarray(m, dtype=np.float64)
        lin = m * (200.0 / 3)
        log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
        return np.where(m >= 15.0, log, lin)
    bins = np.linspace(0, rate / 2, n_fft // 2 + 1)
    edges = to_hz(np.linspace(to_mel(fmin), to_mel(fmax), mels + 2))
    lower = (bins[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    upper = (edges[2:, None] - bins[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    filters = np.maximum(0.0, np.minimum(lower, upper))
    filters *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return filters.astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available)")
    ap.add_argument("--precisions", default="f32,tf32,bf16,tf32+softmax-loss,bf16+softmax-loss",
                    help="runs: f32, tf32 or bf16, each optionally with +softmax-loss")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-seconds", type=float, default=120.0)
    ap.add_argument("--min-seconds", type=float, default=5.0)
    ap.add_argument("--max-seconds", type=float, default=20.0)
    ap.add_argument("--max-tokens", type=int, default=80)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--preset", choices=["parakeet-tdt-0.6b", "tiny", "small"], default="parakeet-tdt-0.6b",
                    help="the asrt preset whose shape to build (tiny: 2 x 96, 4 heads, 64 mels; small: "
                         "the 0.6B structure at a CPU's width)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--layers", type=int, default=0,
                    help="encoder layers instead of the preset's (the 0.6B shape at full width with fewer layers)")
    ap.add_argument("--forward-only", action="store_true",
                    help="time the forward pass and loss only (graph built as in training; no backward, no update)")
    ap.add_argument("--part", choices=["model", "encoder"], default="model",
                    help="model: the whole step; encoder: the log-mel features and the encoder with a "
                         "surrogate loss (the mean square of its output), forward and backward, no "
                         "clipping or update (asrt-bench train-step --part encoder)")
    ap.add_argument("--saved-tensors", action="store_true",
                    help="also count the bytes autograd keeps for backward during each forward (the "
                         "tensors its saved-tensor hooks see, each storage once, parameters left "
                         "out): the activations, to set beside asrt's device memory at the loss read")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="write torch.profiler's per-operation table (self CPU time, the steps "
                         "after the first) of the last run to FILE")
    args = ap.parse_args()

    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(f"peer_step: skipped: {e} (pip install torch numpy)", file=sys.stderr)
        sys.exit(3)
    try:
        import transformers
        from transformers import ParakeetEncoderConfig, ParakeetForTDT, ParakeetTDTConfig
    except ImportError as e:
        print(f"peer_step: skipped: transformers has no ParakeetForTDT ({e}); it came with transformers 5.x",
              file=sys.stderr)
        sys.exit(3)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    mels = 80
    cuda = device.type == "cuda"
    blank = args.vocab
    if args.preset == "small":
        enc = ParakeetEncoderConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=128, subsampling_conv_channels=16,
                                    dropout=0.1, layerdrop=0.0, activation_dropout=0.1, attention_dropout=0.1)
        dec_hidden, dec_layers = 32, 1
    elif args.preset == "tiny":
        # asrt's `tiny` (trainer/src/model/config.rs): 2 x 96, 4 heads, ff 384, 32 subsampling
        # channels, 64 mels, a 96-wide one-layer prediction network and joint, dropout 0.
        mels = 64
        enc = ParakeetEncoderConfig(hidden_size=96, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=384, subsampling_conv_channels=32, num_mel_bins=64,
                                    dropout=0.0, layerdrop=0.0, activation_dropout=0.0, attention_dropout=0.0)
        dec_hidden, dec_layers = 96, 1
    else:
        # asrt's `parakeet-tdt-0.6b`: 128 mels, as Parakeet-TDT-0.6B's preprocessor.
        mels = 128
        enc = ParakeetEncoderConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=8,
                                    intermediate_size=4096, subsampling_conv_channels=256, num_mel_bins=128,
                                    dropout=0.1, layerdrop=0.0, activation_dropout=0.1, attention_dropout=0.1)
        dec_hidden, dec_layers = 640, 2
    if args.layers > 0:
        enc.num_hidden_layers = args.layers
    config = ParakeetTDTConfig(vocab_size=args.vocab + 1, blank_token_id=blank, pad_token_id=blank,
                               decoder_hidden_size=dec_hidden, num_decoder_layers=dec_layers,
                               durations=[0, 1, 2, 3, 4], encoder_config=enc)
    rate = 16000
    features = LogMel(torch, np, device, rate, mels=mels)

    rng = random.Random(args.seed)
    plan = batches(rng, args.steps, args.batch_seconds, args.min_seconds, args.max_seconds,
                   args.max_tokens, args.vocab)
    gen = np.random.default_rng(args.seed)
    plan = [([(0.1 * gen.standard_normal(int(s * rate))).astype(np.float32) for s in seconds], labels, total)
            for seconds, labels, total in plan]

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    results = {"bench": "peer-step", "torch": torch.__version__, "transformers": transformers.__version__,
               "device": torch.cuda.get_device_name(device) if cuda else "cpu", "preset": args.preset,
               "layers": enc.num_hidden_layers, "forward_only": args.forward_only, "part": args.part,
               "threads": torch.get_num_threads(),
               "runs": {}}
    for run_name in [p for p in args.precisions.split(",") if p]:
        precision, _, surrogate = run_name.partition("+")
        if precision not in ("f32", "tf32", "bf16") or surrogate not in ("", "softmax-loss"):
            print(f"peer_step: unknown run {run_name!r} (expected f32, tf32 or bf16, optionally "
                  f"+softmax-loss)", file=sys.stderr)
            sys.exit(2)
        torch.manual_seed(args.seed)
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        model = ParakeetForTDT(config).to(device).train()
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        times, feature_times, losses, saved = [], [], [], []
        param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
        profiler = None
        for step, (waves, labels, total) in enumerate(plan):
            if args.profile and step == 1:
                # The first step warms allocators and caches; asrt's profile skips it too.
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                profiler.__enter__()
            sync()
            t0 = time.perf_counter()
            inputs = features(waves)
            width = max(len(l) for l in labels)
            lab = torch.full((len(labels), width), blank, dtype=torch.long)
            for i, l in enumerate(labels):
                lab[i, :len(l)] = torch.tensor(l)
            lab = lab.to(device, non_blocking=True)
            # The prediction network reads blank (start of sequence) then the labels.
            dec_in = torch.cat([torch.full((len(labels), 1), blank, dtype=torch.long, device=device), lab], dim=1)
            sync()
            t1 = time.perf_counter()
            features_in = inputs["input_features"].to(device)
            mask_in = inputs["attention_mask"].to(device)
            storages = {}

            def pack(t):
                # Each storage once (views share one); parameters are not activations.
                st = t.untyped_storage()
                if st.data_ptr() not in param_storages:
                    storages[st.data_ptr()] = st.nbytes()
                return t

            hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if args.saved_tensors \
                else contextlib.nullcontext()
            with hooks, torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                if args.part == "encoder":
                    out = model.encoder(input_features=features_in, attention_mask=mask_in)
                    loss = out.last_hidden_state.float().pow(2).mean()
                else:
                    out = model(input_features=features_in, attention_mask=mask_in,
                                decoder_input_ids=dec_in, labels=None if surrogate else lab)
                    loss = out.loss if not surrogate else \
                        -torch.log_softmax(out.logits.float(), dim=-1)[..., 0].mean()
            if not args.forward_only and args.part == "encoder":
                loss.backward()
                model.zero_grad(set_to_none=True)
            elif not args.forward_only:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            saved.append(sum(storages.values()))
            sync()
            t2 = time.perf_counter()
            times.append(t2 - t0)
            feature_times.append(t1 - t0)
        if profiler is not None:
            profiler.__exit__(None, None, None)
            with open(args.profile, "w") as f:
                f.write(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=60))
        steady = times[1:] or times
        audio = [total for _, _, total in plan]
        run = {
            "parameters": params,
            "steps": len(times), "first_step_seconds": times[0],
            "median_step_seconds": statistics.median(steady),
            "median_feature_seconds": statistics.median(feature_times[1:] or feature_times),
            "audio_seconds_per_step": statistics.median(audio[1:] or audio),
            "audio_seconds_per_second": statistics.median(a / t for a, t in zip(audio[1:] or audio, steady)),
            "peak_memory_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
            "losses": losses,
            "saved_mib": [b / 2**20 for b in saved] if args.saved_tensors else None,
            "utterances_per_step": [len(w) for w, _, _ in plan],
        }
        results["runs"][run_name] = run
        print(f"peer_step: {run_name}: median {run['median_step_seconds']:.3f} s/step, "
              f"{run['audio_seconds_per_second']:.1f} audio-s/s, peak {run['peak_memory_mib']} MiB, "
              f"losses {[round(x, 2) for x in losses]}"
              + (f", saved for backward {[round(b / 2**20, 1) for b in saved]} MiB" if args.saved_tensors else ""),
              file=sys.stderr)
        del model, opt, out, loss
        if cuda:
            torch.cuda.empty_cache()
    line = json.dumps(results)
    print(line)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
