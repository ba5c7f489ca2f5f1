#!/usr/bin/env python3
"""The peer of asrt's TDT loss: transformers' pure-PyTorch TDT loss on the same logits.

    asrt-bench tdt-check --device cuda:0 --dump DIR      writes the case (logits, targets,
                                                         lengths, float64 costs and gradients)
    python3 bench/tdt_peer.py DIR [--device cuda] [--repeats 3] [--json-out FILE]

Feeds the logits to `transformers.loss.loss_tdt.tdt_loss` (transformers 5.x; reduction "none"),
compares its per-utterance costs and its gradient (autograd of the costs' sum) with asrt's
float64 path, and times its forward + backward against one log-softmax over the same logits
(the unit asrt-bench reports too). Prints one JSON object. Exits 3 when torch or transformers'
TDT loss is missing, saying so.
"""

import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", help="the folder asrt-bench tdt-check --dump wrote")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(f"tdt_peer: skipped: {e} (pip install torch numpy)", file=sys.stderr)
        sys.exit(3)
    try:
        from transformers.loss.loss_tdt import tdt_loss
    except ImportError as e:
        print(f"tdt_peer: skipped: transformers has no loss.loss_tdt ({e}); it came with transformers 5.x",
              file=sys.stderr)
        sys.exit(3)
    import transformers

    load = lambda n: np.load(os.path.join(args.case, n + ".npy"))
    meta = json.load(open(os.path.join(args.case, "case.json")))
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    logits = torch.from_numpy(load("logits")).to(device)
    targets = torch.from_numpy(load("targets")).to(device)
    frame_lens = torch.from_numpy(load("frame_lens")).to(device)
    target_lens = torch.from_numpy(load("target_lens")).to(device)
    want_costs = load("costs")
    want_grads = load("grads")
    durations = meta["durations"]
    blank = meta["blank"]
    split = blank + 1

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def loss_and_grad():
        x = logits.clone().requires_grad_(True)
        costs = tdt_loss(x[..., :split], x[..., split:], targets.int(), frame_lens.int(), target_lens.int(),
                         blank_token_id=blank, durations=durations, sigma=meta["sigma"], reduction="none")
        costs.sum().backward()
        return costs.detach(), x.grad

    loss_s, softmax_s = [], []
    costs = grads = None
    for _ in range(max(1, args.repeats)):
        sync()
        t = time.perf_counter()
        costs, grads = loss_and_grad()
        sync()
        loss_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        y = torch.log_softmax(logits, dim=-1)
        sync()
        softmax_s.append(time.perf_counter() - t)
        del y
    got_c = costs.double().cpu().numpy()
    got_g = grads.float().cpu().numpy()
    cost_rel = float(np.max(np.abs(got_c - want_costs) / np.abs(want_costs)))
    grad_abs = float(np.max(np.abs(got_g - want_grads)))
    med = lambda xs: sorted(xs)[len(xs) // 2]
    out = {
        "bench": "tdt-peer", "peer": "transformers.loss.loss_tdt.tdt_loss",
        "transformers": transformers.__version__, "torch": torch.__version__, "device": str(device),
        "dims": list(logits.shape), "costs": got_c.tolist(),
        "max_relative_cost_error_vs_asrt_f64": cost_rel,
        "max_abs_gradient_error_vs_asrt_f64": grad_abs,
        "max_abs_gradient": float(np.max(np.abs(want_grads))),
        "loss_forward_backward_seconds": med(loss_s), "log_softmax_seconds": med(softmax_s),
        "loss_over_log_softmax": med(loss_s) / med(softmax_s),
        "all": {"loss": loss_s, "log_softmax": softmax_s},
    }
    text = json.dumps(out, indent=1)
    if args.json_out:
        open(args.json_out, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
