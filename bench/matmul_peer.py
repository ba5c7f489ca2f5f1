#!/usr/bin/env python3
"""The peer of `asrt-bench matmul`: PyTorch's matrix product (cuBLAS on CUDA) at the same cases.

    python3 bench/matmul_peer.py --sizes parakeet --operands f32 [--device cuda] [--repeats 5]
                                 [--check MM_JSON] [--json-out FILE]

Times `torch.matmul` at each case of `asrt-bench matmul --sizes SIZES` (trainer/src/bin/
asrt_bench/matmul.rs: the same shapes, and the same operands stored transposed), as that bench
times cubek's kernels: launches in a row between two waits, the median over `--repeats`.
`--operands f32` multiplies in TF32 (`torch.backends.cuda.matmul.allow_tf32`), as cubek's f32
kernels do on CUDA's tensor cores; `bf16` or `f16` rounds the operands first, as mixed precision
does, and writes f32 where this PyTorch takes `out_dtype`, else the half type. Each product's
largest error against float64 on 512 sampled outputs, relative to the sum of the terms'
magnitudes, is reported with asrt-bench's bound (1e-2: above it a product is wrong, not rounded).

Why: cubek's fastest kernel reached 81 TFLOP/s on an H200, a sixth of its dense TF32 peak
(bench/RESULTS.md, 2026-11-30). This measures what the device's own library reaches on the
same products, in the same call: the gap a different kernel could close.

`--check MM_JSON` refuses (exit 2) when asrt-bench's output there lists other cases or shapes
than this script's copy of them. Prints one JSON object. Exits 3 when torch is missing, saying
so.
"""

import argparse
import json
import statistics
import sys
import time


def attention(b, h, t, dk):
    """The attention's stacks at batch b, h heads of dk, t frames (asrt-bench's `attention`):
    (name, m, k, n, a_t, b_t, outer, heads, b's outer, summed over the outer axis)."""
    p = 2 * t - 1
    return [
        ("scores forward (q kT)", t, dk, t, False, True, b, h, b, False),
        ("position scores forward (q rT)", t, dk, p, False, True, b, h, 1, False),
        ("context forward (w v)", t, t, dk, False, False, b, h, b, False),
        ("query grad from positions (dbd r)", t, p, dk, False, False, b, h, 1, False),
        ("position grad, summed (qT dbd)", dk, t, p, True, False, b, h, b, True),
    ]


# (name, m, k, n, a stored transposed, b stored transposed[, outer, heads, b's outer, summed]):
# asrt-bench matmul's `cases`.
CASES = {
    "parakeet": [
        ("ff-up forward", 1440, 1024, 4096, False, False),
        ("ff-down forward", 1440, 4096, 1024, False, False),
        ("ff-up input grad (dy wT)", 1440, 4096, 1024, False, True),
        ("ff-up weight grad (xT dy)", 1024, 1440, 4096, True, False),
        ("projection forward", 1440, 1024, 1024, False, False),
    ],
    "small": [
        ("forward", 96, 64, 80, False, False),
        ("input grad (dy wT)", 96, 80, 64, False, True),
        ("weight grad (xT dy)", 64, 96, 80, True, False),
    ],
    "attention": attention(6, 8, 240, 128),
    "attention-small": attention(3, 2, 12, 8),
}

# asrt-bench's: errors above this are a wrong product, not rounding.
WRONG = 1e-2


def check_cases(cases, path):
    """The (case, m, k, n) asrt-bench wrote in `path`, against ours: a message where they differ."""
    try:
        data = json.load(open(path))
    except (OSError, ValueError) as e:
        return f"cannot read {path}: {e}"
    theirs = []
    for row in data.get("results", []):
        key = (row.get("case"), row.get("m"), row.get("k"), row.get("n"))
        # A kernel the device cannot run has no shape in its row; the others give it.
        if key[1] is not None and key not in theirs:
            theirs.append(key)
    ours = [(c[0], c[1], c[2], c[3]) for c in cases]
    if theirs != ours:
        return f"{path} has the cases {theirs}, this script {ours}: bench/matmul_peer.py's CASES is stale"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", choices=sorted(CASES), default="parakeet")
    ap.add_argument("--operands", choices=["f32", "bf16", "f16"], default="f32")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--check", default=None, help="asrt-bench matmul's JSON, whose cases must be these")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    cases = CASES[args.sizes]
    if args.check:
        why = check_cases(cases, args.check)
        if why:
            print(f"matmul_peer: {why}", file=sys.stderr)
            sys.exit(2)
    try:
        import torch
    except ImportError as e:
        print(f"matmul_peer: skipped: {e} (pip install torch)", file=sys.stderr)
        sys.exit(3)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    half = {"f32": None, "bf16": torch.bfloat16, "f16": torch.float16}[args.operands]
    gen = torch.Generator().manual_seed(11)

    def operand(rows, cols, transposed, lead=()):
        """`[*lead, rows, cols]` of values in [-1, 1), each matrix stored as its transpose when
        `transposed`, in the operands' type; and its logical values in float64 as that type
        holds them."""
        shape = (*lead, cols, rows) if transposed else (*lead, rows, cols)
        stored = torch.rand(shape, generator=gen) * 2 - 1
        if half is not None:
            stored = stored.to(half)
        logical = stored.transpose(-1, -2) if transposed else stored
        return logical.to(device), logical.to(torch.float64)

    def product(a, b, summed=False):
        if a.dim() > 2:
            # Stacks: torch broadcasts an outer size of 1; the half type's product cast up.
            y = torch.matmul(a, b)
            y = y if half is None else y.float()
            return y.sum(0, keepdim=True) if summed else y
        if half is None:
            return torch.matmul(a, b)
        try:
            return torch.mm(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError):
            return torch.matmul(a, b)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    out_dtype = None
    rows = []
    for case in cases:
        name, m, k, n, a_t, b_t = case[:6]
        outer, heads, b_outer, summed = case[6:] if len(case) > 6 else (None, 1, None, False)
        lead_a, lead_b = ((outer, heads), (b_outer, heads)) if outer else ((), ())
        a, a64 = operand(m, k, a_t, lead_a)
        b, b64 = operand(k, n, b_t, lead_b)
        y = product(a, b, summed)
        out_dtype = str(y.dtype).replace("torch.", "")
        sync()
        got = y.to("cpu", torch.float64).reshape(-1, m, n)
        # 512 sampled outputs (matrix g of the product, row i, column j) in float64.
        count = got.shape[0]
        g = torch.randint(0, count, (512,), generator=gen)
        idx = torch.randint(0, m * n, (512,), generator=gen)
        i, j = idx // n, idx % n
        if outer:
            a64, b64 = a64.expand(max(outer, b_outer), -1, -1, -1), b64.expand(max(outer, b_outer), -1, -1, -1)
            # Each output's terms: over k, and over the outer axis where summed.
            h = g % heads
            bt64 = b64.transpose(-1, -2)
            rows_a = a64[:, h, i, :] if summed else a64[g // heads, h, i, :].unsqueeze(0)
            cols_b = bt64[:, h, j, :] if summed else bt64[g // heads, h, j, :].unsqueeze(0)
            terms = (rows_a * cols_b).transpose(0, 1).reshape(512, -1)
        else:
            terms = a64[i, :] * b64[:, j].t()
        want, scale = terms.sum(dim=1), terms.abs().sum(dim=1).clamp_min(1e-30)
        error = float(((got[g, i, j] - want).abs() / scale).max())
        products = (max(outer, b_outer) * heads) if outer else 1
        # Launches in a row, then one wait, as asrt-bench times cubek's kernels.
        inner = 20 if products * m * k * n > 1 << 24 else 5
        for _ in range(3):
            product(a, b, summed)
        times = []
        for _ in range(max(1, args.repeats)):
            sync()
            t = time.perf_counter()
            for _ in range(inner):
                product(a, b, summed)
            sync()
            times.append((time.perf_counter() - t) / inner)
        seconds = statistics.median(times)
        rows.append({"case": name, "m": m, "k": k, "n": n, "seconds": seconds,
                     "tflops": 2.0 * products * m * k * n / seconds / 1e12, "max_error": error,
                     "correct": error <= WRONG})

    all_ok = all(r["correct"] for r in rows)
    result = {
        "bench": "matmul-peer", "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "sizes": args.sizes, "operands": args.operands,
        "precision": "tf32" if cuda and half is None else args.operands, "out_dtype": out_dtype,
        "repeats": args.repeats, "error_bound": WRONG, "results": rows,
        "total_seconds": sum(r["seconds"] for r in rows) if all_ok else None, "all_correct": all_ok,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
