#!/usr/bin/env python3
"""Verdicts of the GPU kit's steps (scripts/gpu/run.sh) and its summary.

Each check prints one line, "VERDICT: what was seen", VERDICT being PASS, FAIL or SKIPPED, and
writes the figures it read to WORK/summary-STEP.json. `summary` writes OUT/results.json and
OUT/results.md. Standard library only: the GPU machine has no network.
"""

import json
import os
import re
import statistics
import subprocess
import sys

# The memory log's summary formats its sizes; d's verdict shows them the same way.
from pool_summary import fmt

# Largest errors the TDT kernels may show against the float64 path on the same (rounded)
# logits. The kernels accumulate the lattice's log-probabilities (alpha, beta) in f32 whatever
# the logits' type: each of the T + U steps to a node rounds at the scale of the cost, so the
# log-space error of a node grows like 2^-24 * cost * sqrt(T + U) (a random walk), and a
# gradient, exp(alpha + beta + log p - cost), carries it as a relative error (gradients are at most
# 1); the cost itself carries 2^-24 * sqrt(T + U) relative. Measured on an H100 (bench/RESULTS.md,
# f32 kernels): gradients 0.1x to 0.9x of the bound below, costs up to 0.3x. f16 and bf16 outputs
# then round to the logits' type: half a unit in the last place, 2^-11 and 2^-8 relative, added.
# The floor, 2^-22, is a few units of the log-softmax's own f32 rounding.
ROUNDING = {"f32": 0.0, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}
FLOOR = 2.0 ** -22


def bounds(case):
    """(relative cost bound, absolute gradient bound) of one tdt-check case."""
    _, t, u1, _ = case["dims"]
    cost = max([abs(c) for c in case.get("costs", []) if c == c] or [0.0])
    walk = 2.0 ** -24 * (t + u1 - 1) ** 0.5
    r = ROUNDING[case["dtype"]]
    return max(FLOOR, 4 * walk) + 2 * r, max(FLOOR, 2 * walk * cost) + 2 * r


# The loss's forward + backward over one log-softmax of the same logits: the goal.
LOSS_OVER_SOFTMAX_GOAL = 3.0

# Dense bf16 tensor-core peaks, TFLOP/s, from NVIDIA's datasheets (without sparsity): H100 SXM
# and H200 989.4, H100 PCIe 756.5. MFU is reported against the device's bf16 peak whatever the
# run's precision (f32 runs use TF32, whose peak is half of it).
BF16_PEAK_TFLOPS = {"H100 80GB HBM3": 989.4, "H200": 989.4, "H100 PCIe": 756.5, "H100 NVL": 835.5}

# Encoder frames per audio second: 10 ms mel hop, subsampled 8x.
FRAMES_PER_SECOND = 100 / 8


def step_flops(parameters, audio_seconds):
    """Model FLOPs of one optimizer step, counted the 6ND way with encoder frames as tokens:
    every parameter does one multiply-add per frame forward (2 FLOPs) and two backward (4). Left
    out, each small at 5-20 s: the joint's lattice (B x T x (U+1) x 640 x 1030 multiply-adds, about
    4 % of the encoder's at 12 s and 40 tokens), attention's T x T products (about 1 %), the
    subsampling convolutions before the 8x reduction (about 1 %). So this undercounts a little."""
    return 6.0 * parameters * audio_seconds * FRAMES_PER_SECOND


def tail(path, n=3):
    try:
        lines = open(path, errors="replace").read().strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:])[-300:]


def panicked(log):
    try:
        return "panicked" in open(log, errors="replace").read()
    except OSError:
        return False


def save(work, step, figures):
    with open(os.path.join(work, f"summary-{step}.json"), "w") as f:
        json.dump(figures, f, indent=1)


def load_json(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None


def metrics(path):
    try:
        return [json.loads(line) for line in open(path) if line.strip()]
    except (OSError, ValueError):
        return []


def check_tdt(rc, log, result):
    work = os.path.dirname(result)
    data = load_json(result)
    if rc != 0 or data is None:
        return f"FAIL: exit {rc}; {tail(log)}"
    worst, failures, ratios, unsupported = {}, [], [], []
    for c in data["cases"]:
        if not c.get("supported"):
            unsupported.append(f"{c['case']} {c['dtype']}")
            continue
        cost_bound, grad_bound = bounds(c)
        cost, grad = c["max_relative_cost_error"], c["max_abs_gradient_error"]
        w = worst.setdefault(c["dtype"], [0.0, 0.0])
        w[0], w[1] = max(w[0], cost if cost == cost else float("inf")), max(w[1], grad if grad == grad else float("inf"))
        c["bounds"] = [cost_bound, grad_bound]
        if not (cost <= cost_bound and grad <= grad_bound):
            failures.append(f"{c['case']} {c['dtype']}: cost {cost:.2e} (bound {cost_bound:.1e}), "
                            f"gradient {grad:.2e} (bound {grad_bound:.1e})")
        if c["case"].startswith("parakeet") or c["case"].startswith("small"):
            ratios.append((c["case"], c["dtype"], c["loss_over_log_softmax"], c["loss_forward_backward_seconds"]))
    figures = {"worst": worst, "loss_over_log_softmax": ratios,
               "errors_and_bounds": [[c["case"], c["dtype"], c["max_relative_cost_error"],
                                      c["max_abs_gradient_error"]] + c.get("bounds", [])
                                     for c in data["cases"] if c.get("supported")], "unsupported": unsupported,
               "loaded_libraries": data.get("loaded_libraries", [])}
    save(work, "a", figures)
    worst_s = ", ".join(f"{d}: cost {w[0]:.1e} grad {w[1]:.1e}" for d, w in worst.items())
    ratio_s = ", ".join(f"{n} {d} {r:.2f}x ({s * 1e3:.1f} ms)" for n, d, r, s in ratios)
    slow = [r for r in ratios if r[2] > LOSS_OVER_SOFTMAX_GOAL]
    verdict = "FAIL" if failures else "PASS"
    note = f"worst {worst_s}; loss / log-softmax {ratio_s}"
    if slow:
        note += f"; above the {LOSS_OVER_SOFTMAX_GOAL}x goal: {len(slow)}"
    if unsupported:
        note += f"; unsupported: {', '.join(unsupported)}"
    if failures:
        note = "; ".join(failures[:3]) + "; " + note
    return f"{verdict}: {note}"


def step_result(rc, log, path):
    """A step's JSON result, or the verdict it gets without one: SKIPPED where the step exited 3
    (what it needs is missing here), FAIL where it failed or wrote nothing."""
    if rc == 3:
        return None, f"SKIPPED: {tail(log, 1)}"
    data = load_json(path)
    if rc != 0 or data is None:
        return None, f"FAIL: exit {rc}; {tail(log)}"
    return data, None


def check_peer(rc, log, result, ours):
    work = os.path.dirname(result)
    data, verdict = step_result(rc, log, result)
    if verdict:
        return verdict
    a = load_json(ours) or {"cases": []}
    peer_case = [c for c in a["cases"] if c["case"] == "peer"]
    figures = dict(data)
    figures.pop("all", None)
    note = (f"PyTorch ({data['device']}) vs asrt's f64 path: cost {data['max_relative_cost_error_vs_asrt_f64']:.1e}, "
            f"gradient {data['max_abs_gradient_error_vs_asrt_f64']:.1e}; PyTorch loss "
            f"{data['loss_forward_backward_seconds'] * 1e3:.1f} ms = {data['loss_over_log_softmax']:.1f}x its log-softmax")
    if peer_case:
        ours_s = peer_case[0]["loss_forward_backward_seconds"]
        figures["asrt_loss_seconds"] = ours_s
        figures["pytorch_over_asrt"] = data["loss_forward_backward_seconds"] / ours_s
        note += f"; asrt {ours_s * 1e3:.1f} ms ({figures['pytorch_over_asrt']:.1f}x faster)"
    save(work, "b", figures)
    # PyTorch's loss accumulates in f32, as the kernels do: the same bounds as asrt's f32 kernels
    # on this case (on the CPU at this case's size: 2.4e-7 and 8.9e-5, bench/RESULTS.md).
    if peer_case:
        cost_bound, grad_bound = bounds(peer_case[0])
    else:
        cost_bound, grad_bound = 1e-5, 1e-3
    ok = (data["max_relative_cost_error_vs_asrt_f64"] <= cost_bound
          and data["max_abs_gradient_error_vs_asrt_f64"] <= grad_bound)
    return f"{'PASS' if ok else 'FAIL'}: {note}"


def step_times(ms):
    return [m["ranks"][0]["step_seconds"] for m in ms if m.get("ranks")]


def check_train_tiny(rc, log, work, reference):
    if rc != 0:
        return f"FAIL: exit {rc}; {tail(log)}"
    ms = metrics(os.path.join(work, "c-run", "metrics.jsonl"))
    ms2 = metrics(os.path.join(work, "c-run2", "metrics.jsonl"))
    ev = load_json(os.path.join(work, "c-eval.json")) or {}
    times, times2 = step_times(ms), step_times(ms2)
    figures = {
        "steps": len(ms), "losses": [m["loss"] for m in ms],
        "first_step_seconds": times[0] if times else None,
        "steady_step_seconds": statistics.median(times[1:]) if len(times) > 1 else None,
        "warm_cache_first_step_seconds": times2[0] if times2 else None,
        "eval_wer": ev.get("overall", {}).get("wer"), "eval_cer": ev.get("overall", {}).get("cer"),
    }
    note = (f"{len(ms)} steps, first {figures['first_step_seconds']:.2f} s (cold kernel cache), steady "
            f"{figures['steady_step_seconds'] or float('nan'):.3f} s, first with warm cache "
            f"{figures['warm_cache_first_step_seconds'] or float('nan'):.2f} s; eval WER {figures['eval_wer']}")
    verdict = "PASS" if ms and all(m["loss"] == m["loss"] for m in ms) else "FAIL"
    if reference != "none":
        ref = metrics(reference)
        pairs = list(zip([m["loss"] for m in ref], figures["losses"]))
        rel = [abs(a - b) / abs(a) for a, b in pairs]
        figures["loss_rel_diff_vs_cpu"] = rel
        if rel:
            note += (f"; losses vs the CPU run: step 1 {rel[0]:.1e}, max over {len(rel)} steps {max(rel):.1e} "
                     f"(TF32 matmuls carry 10 mantissa bits: 1e-3 relative per product, compounding over steps)")
            # Step 1 sees the same weights and batch: only arithmetic differs.
            if rel[0] > 1e-2:
                verdict = "FAIL"
    save(work, "c", figures)
    return f"{verdict}: {note}"


def norms_by_step(path):
    """ASRT_GRAD_NORMS's lines: {step: {path: norm}}."""
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    out[row["step"]] = dict(row["norms"])
    return out


def worst_parameters(got, want, n=3):
    """The n parameters whose norms differ most, relative to the larger of the CPU's norm and
    1e-3 of the step's global norm (a parameter with almost no gradient is not news)."""
    floor = 1e-3 * sum(v * v for v in want.values()) ** 0.5
    rows = []
    for name in sorted(set(got) | set(want)):
        g, w = got.get(name), want.get(name)
        if g is None or w is None:
            rows.append((float("inf"), name, g, w))
            continue
        rows.append((abs(g - w) / max(abs(w), floor, 1e-30), name, g, w))
    rows.sort(key=lambda r: -r[0])
    return rows[:n]


def rel_diff(got, want):
    """|got - want| / |want|; infinite where `got` is missing or not finite (JSON's null)."""
    if got is None or want is None or got != got:
        return float("inf")
    return abs(got - want) / max(abs(want), 1e-30)


# cg's bound on a run's global gradient norm against the CPU run's at step 1 (lavapipe: 4.4e-4
# at most; 5x that): both the verdict and the cause read it.
STEP1_BOUND = 2e-3


def grad_norm_cause(figures, bound=STEP1_BOUND):
    """cg's reading of which runs agree with the CPU run: fused (Burn's products, fused),
    unfused, unit (the plain product kernel, dense output), dense (Burn's CUDA product kernel,
    dense output). Step 1 alone decides: the same weights and batch, only the arithmetic
    differs (lavapipe: 4.4e-4 at most, an H200's unfused run 3.2e-5; `bound` is 5x lavapipe's).
    Later steps differ wherever step 1 did a little, since AdamW divides each gradient by its
    own scale: on the H200 (2026-11-29) the unfused run was 3.2e-5 off at step 1 and 1.2e-2 at
    step 3."""
    good = {k: f.get("grad_norm_rel_diff_vs_cpu", [1.0])[0] <= bound
            for k, f in figures.items() if k in ("fused", "unfused", "unit", "dense")}
    if all(good.values()):
        return "none: every run agrees with the CPU run at step 1"
    if not good["fused"] and good["dense"] and good["unit"]:
        return ("the products' output layout: Burn's product (rows padded to CUDA's pitch) differs, "
                "the same kernel writing dense rows agrees" + ("" if good["unfused"] else "; unfused differs too"))
    if not good["fused"] and not good["dense"] and good["unit"]:
        return "the product kernel: only the plain unit kernel agrees (TF32 or the CMMA kernel)"
    if not good["fused"] and good["unfused"]:
        return "fusion: the unfused run agrees, the fused ones with any product differ"
    return "not the products and not fusion alone: " + ", ".join(f"{k} {'agrees' if v else 'differs'}"
                                                              for k, v in good.items())


def check_grad_norms(rc, log, work):
    """cg: each step's gradient norm, fused, unfused, with the unit matmul kernel, with Burn's
    kernel writing dense rows and with cuBLAS's products, against the CPU reference's, the
    parameters whose norms differ most from the CPU run's, and the fused run again with poisoned
    buffers (the same bits, or a kernel reads what no kernel wrote). A run with no metrics (the
    cublas run's failure is only logged) fails the verdict and is named."""
    if rc != 0:
        return f"FAIL: exit {rc}; {tail(log)}"
    runs = {k: metrics(os.path.join(work, f"cg-{k}", "metrics.jsonl"))
            for k in ("fused", "unfused", "unit", "dense", "cublas")}
    figures = {k: {"losses": [m["loss"] for m in ms], "grad_norms": [m["grad_norm"] for m in ms]}
               for k, ms in runs.items()}
    cpu = norms_by_step(os.path.join(work, "cg-cpu.jsonl"))
    reference = metrics(os.path.join(work, "cg-cpu", "metrics.jsonl"))[:3]
    parts, ok = [], all(len(f["grad_norms"]) == 3 for f in figures.values()) and len(cpu) == 3
    per_run = {k: norms_by_step(os.path.join(work, f"cg-{k}.jsonl")) for k in figures}
    for k, f in figures.items():
        mine = per_run[k]
        ok = ok and len(mine) == 3
        f["worst_parameters"] = {step: [[name, rel, g, w] for rel, name, g, w in
                                        worst_parameters(mine.get(step, {}), cpu.get(step, {}), 10)]
                                 for step in sorted(cpu)}
        rel = [rel_diff(g, r["grad_norm"]) for g, r in zip(f["grad_norms"], reference)]
        loss = [rel_diff(g, r["loss"]) for g, r in zip(f["losses"], reference)]
        f["grad_norm_rel_diff_vs_cpu"], f["loss_rel_diff_vs_cpu"] = rel, loss
        # Step 1: the same weights and batch, only arithmetic differs (STEP1_BOUND). Each
        # parameter's norm too (lavapipe: 5.1e-3 at most, the bound 10x): on an H200 the LSTM's read of padding left the global norm within 3.2e-5
        # and its parameters' norms 25-110 % off.
        worst = worst_parameters(mine.get(1, {}), cpu.get(1, {}), 3)
        ok = ok and len(rel) == 3 and rel[0] <= STEP1_BOUND and all(r <= 5e-2 for r, _, _, _ in worst)
        if not f["grad_norms"]:
            parts.append(f"{k}: no steps (see the log)")
            ok = False
            continue
        note = f"{k}: |g| vs the CPU run " + ", ".join(f"{x:.1e}" for x in rel)
        note += "; step 1's most different norms: " + ", ".join(f"{name} {r:.1e}" for r, name, _, _ in worst)
        parts.append(note)
    # The poisoned run (new kernel buffers filled with NaN) must be the fused run bit for bit.
    poisoned = metrics(os.path.join(work, "cg-poisoned", "metrics.jsonl"))
    mine = norms_by_step(os.path.join(work, "cg-poisoned.jsonl"))
    fused = per_run["fused"]
    pairs = [(mine.get(s, {}).get(n), v) for s in fused for n, v in fused[s].items()]
    pairs += list(zip([m.get("loss") for m in poisoned], figures["fused"]["losses"]))
    pairs += list(zip([m.get("grad_norm") for m in poisoned], figures["fused"]["grad_norms"]))
    unequal = sum(1 for g, w in pairs if g != w)
    nan = sorted({n for s in mine for n, v in mine[s].items() if v is None or v != v})
    figures["poisoned"] = {"losses": [m.get("loss") for m in poisoned],
                           "grad_norms": [m.get("grad_norm") for m in poisoned],
                           "values_unequal_to_fused": unequal, "non_finite_parameters": nan}
    ok = ok and len(poisoned) == 3 and unequal == 0
    parts.append(f"poisoned buffers: {unequal} of {len(pairs)} values differ from the fused run's"
                 + (f", non-finite: {', '.join(nan[:5])}" if nan else ""))
    # Each run's global norm (the optimizer's reduction on the device, which clips) against the
    # float64 norm of its parameters' norms (read to the host): a difference is the reduction's,
    # not the gradients'. Lavapipe: at most 9.4e-8 over 3 steps.
    worst_sum = 0.0
    per_run["poisoned"] = mine
    for k, f in figures.items():
        mine = per_run[k]
        rel = []
        for step, g in zip(sorted(mine), f["grad_norms"]):
            whole = sum(v * v for v in mine[step].values() if v is not None) ** 0.5
            rel.append(rel_diff(g, whole))
        f["norm_vs_parameters_rel_diff"] = rel
        worst_sum = max([worst_sum] + rel)
        ok = ok and len(rel) == 3
    ok = ok and worst_sum <= 5e-7
    parts.append(f"global norm vs its parameters' norms: at most {worst_sum:.1e} (bound 5e-7)")
    figures["cause"] = cause = grad_norm_cause(figures)
    parts.append(f"cause: {cause}")
    save(work, "cg", figures)
    return f"{'PASS' if ok else 'FAIL'}: " + "; ".join(parts)


def device_facts(work):
    """env's log, where this call ran env; else nvidia-smi's name for the device (a later call
    on the same machine, --only dm,db, has no env log: its MFU was "no peak known")."""
    path = os.path.join(work, "logs", "env.log")
    if os.path.exists(path):
        return open(path, errors="replace").read()
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def check_train_big(rc, log, work, name="d"):
    if rc != 0:
        return f"FAIL: exit {rc}; {tail(log)}"
    ms = metrics(os.path.join(work, f"{name}-run", "metrics.jsonl"))
    if not ms:
        return f"FAIL: no metrics; {tail(log)}"
    steady = ms[1:] or ms
    step_s = statistics.median([m["ranks"][0]["step_seconds"] + m["ranks"][0]["wait_seconds"] for m in steady])
    wait = sum(m["ranks"][0]["wait_seconds"] for m in steady)
    total = sum(m["ranks"][0]["step_seconds"] + m["ranks"][0]["wait_seconds"] for m in steady)
    audio = statistics.median([m["audio_seconds_per_second"] for m in steady])
    mem = None
    try:
        # Rows of "memory MiB, utilisation %" (run.sh's `measured`).
        rows = [line.split(",") for line in open(os.path.join(work, f"{name}-memory.csv")) if line.strip()]
        vals = [float(r[0]) for r in rows if r[0].strip()]
        mem = max(vals) if vals else None
    except OSError:
        pass
    figures = {"steps": len(ms), "median_step_seconds": step_s, "audio_seconds_per_second": audio,
               "data_wait_share": wait / total if total else None, "peak_memory_mib_nvidia_smi": mem,
               "first_step_seconds": ms[0]["ranks"][0]["step_seconds"],
               "audio_seconds_per_step": statistics.median([m["audio_seconds"] for m in steady]),
               # Each step from the third (the second allocates the pool's pages, 1.3-2 s on an
               # H200): the median above is over steps 2.., and one configuration's runs spread
               # about 10 % (bench/RESULTS.md, 2026-11-30 evening), so these are what two runs'
               # steps of the same shapes are compared by.
               "step_seconds_from_3": [m["ranks"][0]["step_seconds"] + m["ranks"][0]["wait_seconds"] for m in ms[2:]]}
    shape = load_json(os.path.join(work, "d-shape.json")) or {}
    mfu_s = "MFU not computed (no parameter count)"
    if shape.get("parameters"):
        flops = step_flops(shape["parameters"], figures["audio_seconds_per_step"])
        figures["model_tflops_per_step"] = flops / 1e12
        figures["achieved_tflops"] = flops / step_s / 1e12
        peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in device_facts(work)), None)
        figures["bf16_peak_tflops"] = peak
        if peak:
            figures["mfu_vs_bf16_peak"] = figures["achieved_tflops"] / peak
            mfu_s = f"{figures['achieved_tflops']:.1f} TFLOP/s = MFU {100 * figures['mfu_vs_bf16_peak']:.1f} % of the {peak} bf16 peak"
        else:
            mfu_s = f"{figures['achieved_tflops']:.3f} TFLOP/s (no peak known for this device)"
    # The pool's own counts (asrt's metrics, `device_memory`): the largest in live buffers at each
    # phase of a step, and the largest reserved, over all steps.
    pool = [m["device_memory"] for m in ms if m.get("device_memory")]
    pool_s = ""
    if pool:
        for key in ("forward_bytes", "gradients_bytes", "update_bytes", "reserved_bytes"):
            vals = [p[key] for p in pool if p.get(key) is not None]
            if vals:
                figures[f"pool_{key[:-6]}_mib"] = max(vals) / 2**20
        phases = ", ".join(f"{k} {figures[f'pool_{k}_mib']:.0f}" for k in ("forward", "gradients", "update")
                           if f"pool_{k}_mib" in figures)
        pool_s = f" (pool: in use {phases} MiB; reserved {figures.get('pool_reserved_mib', 0):.0f} MiB)"
    # d's memory log, summarised (pool_summary.py): the pages of each page size.
    layout = load_json(os.path.join(work, f"{name}-pool.json"))
    if layout:
        taken = [p for p in layout["pools"] if p["pages"]]
        figures["pool_pages"] = [{"page_bytes": p["page_bytes"], "pages": p["pages"],
                                  "reserved_bytes": p["reserved_bytes"], "in_use_bytes": p["in_use_bytes"],
                                  "largest_request_bytes": p["largest_request_bytes"]} for p in taken]
        figures["pool_largest_request_bytes"] = layout["largest_request_bytes"]
        pages = ", ".join(f"{p['pages']} x {fmt(p['page_bytes'])}" for p in taken if p["page_bytes"])
        pool_s += f"; pages: {pages or 'none'} (largest buffer asked {fmt(layout['largest_request_bytes'])})"
    host_s = host_phases(ms, figures)
    host_s += host_threads(work, name, figures)
    host_s += matmul_fallbacks(log, figures)
    save(work, name, figures)
    mem_s = f"{mem:.0f} MiB" if mem is not None else "not read (no nvidia-smi)"
    mem_s += pool_s
    each = ", ".join(f"{t:.3f}" for t in figures["step_seconds_from_3"])
    each_s = f"; steps 3-{len(ms)}: {each} s" if each else ""
    return (f"PASS: {len(ms)} steps, median {step_s:.3f} s/step{each_s} ({figures['audio_seconds_per_step']:.0f} audio-s per step), "
            f"{audio:.1f} audio-s/s, data wait {100 * figures['data_wait_share']:.1f} %, peak device memory {mem_s}; "
            f"{mfu_s}{host_s}")


PHASES = ("forward", "backward", "loss_read", "device_check", "reduce", "norm", "update", "update_check")
# The phases in which the training thread waits for the device (`norm` lays out the gradients first).
WAITS = ("loss_read", "device_check", "norm", "update_check")


def steady_phases(ms):
    """asrt's `host_seconds` (the training thread's wall time by phase: queuing, or waiting for
    the device) of steps 3.. (2.. for fewer steps)."""
    return [m["host_seconds"] for m in (ms[2:] if len(ms) > 2 else ms[1:] or ms) if m.get("host_seconds")]


def phase_medians(hs):
    """Each phase's median over the steps' `host_seconds` `hs`."""
    return {k: statistics.median([h.get(k, 0.0) for h in hs]) for k in PHASES}


def host_phases(ms, figures):
    """The steady steps' phase medians (`steady_phases`), into `figures`, as a sentence."""
    steady = steady_phases(ms)
    if not steady:
        return ""
    med = phase_medians(steady)
    figures["host_seconds_median"] = med
    shown = ", ".join(f"{k.replace('_', ' ')} {v:.3f}" for k, v in med.items() if v >= 0.0005)
    waits = sum(med[k] for k in WAITS)
    return f"; training thread by phase (median s): {shown} (sum {sum(med.values()):.3f}, of it waits and reads {waits:.3f})"


def check_train_ab(rc, log, work, name, variant):
    """run.sh's `alternate`: the default's runs NAMEa1, NAMEa2 and the variant's NAMEb1, NAMEb2,
    run a b a b. Each step from the third (the second allocates the pool's pages; a dry run's
    two steps give the second alone) of a variant's run over the same step of the default's
    run of its round: the same batch shape, minutes apart."""
    if rc != 0:
        return f"FAIL: exit {rc}; {tail(log)}"
    runs, reserved, phases = {}, {}, {"a": [], "b": []}
    for tag in ("a1", "b1", "a2", "b2"):
        ms = metrics(os.path.join(work, f"{name}{tag}-run", "metrics.jsonl"))
        if not ms:
            return f"FAIL: no metrics for {name}{tag}; {tail(log)}"
        runs[tag] = [m["ranks"][0]["step_seconds"] + m["ranks"][0]["wait_seconds"] for m in ms]
        phases[tag[0]] += steady_phases(ms)
        pool = [m["device_memory"]["reserved_bytes"] for m in ms if m.get("device_memory")]
        if pool:
            reserved[tag[0]] = max(reserved.get(tag[0], 0), max(pool))
    first = 2 if min(len(v) for v in runs.values()) > 2 else 1
    ratios, rounds = [], []
    for r in ("1", "2"):
        a, b = runs["a" + r][first:], runs["b" + r][first:]
        pairs = [y / x for x, y in zip(a, b) if x > 0]
        ratios += pairs
        rounds.append(pairs)
    if not ratios:
        return f"FAIL: no steps to compare; {tail(log)}"
    a_all = [t for r in ("1", "2") for t in runs["a" + r][first:]]
    b_all = [t for r in ("1", "2") for t in runs["b" + r][first:]]
    figures = {"variant": variant, "from_step": first + 1, "ratio_median": statistics.median(ratios),
               "ratios_by_round": rounds, "default_median_step_seconds": statistics.median(a_all),
               "variant_median_step_seconds": statistics.median(b_all),
               "step_seconds": {tag: v for tag, v in runs.items()}}
    mem_s = ""
    if "a" in reserved and "b" in reserved:
        figures["pool_reserved_mib"] = {"default": reserved["a"] / 2**20, "variant": reserved["b"] / 2**20}
        mem_s = f"; the pool's reserved memory: default {reserved['a'] / 2**20:.0f} MiB, variant {reserved['b'] / 2**20:.0f} MiB"
    faster = sum(1 for x in ratios if x < 1)
    save(work, name, figures)
    each = "; ".join(f"round {i + 1}: " + ", ".join(f"{x:.3f}" for x in rr) for i, rr in enumerate(rounds))
    # The training thread's time (asrt's `host_seconds`, steps 3..): queuing against waiting.
    host_s = ""
    if phases["a"] and phases["b"]:
        split = {"default": phase_medians(phases["a"]), "variant": phase_medians(phases["b"])}
        figures["host_seconds_median"] = split
        host_s = "; training thread, queuing / waiting (median s): " + ", ".join(
            f"{label} {sum(v for p, v in med.items() if p not in WAITS):.3f} / "
            f"{sum(med[p] for p in WAITS):.3f}" for label, med in split.items())
    return (f"PASS: {variant} over the default, step by step from step {first + 1}: median "
            f"{figures['ratio_median']:.3f} ({each}); the variant faster in {faster} of {len(ratios)}; "
            f"median s/step: default {figures['default_median_step_seconds']:.3f}, "
            f"variant {figures['variant_median_step_seconds']:.3f}{mem_s}{host_s}")


def matmul_fallbacks(log, figures):
    """The products `--matmul`'s kernel could not run (its warnings: which product, the weight's
    shape, why), into `figures`, and a clause for the verdict; empty where there were none or no
    kernel was chosen. On an H200 the joint's [640, 1030] weight was the one that fell back, until
    its operands' rows were aligned (device_matmul's aligned_rows)."""
    try:
        text = open(log, errors="replace").read()
    except OSError:
        return ""
    found = re.findall(r"warning: --matmul (\S+): cannot run the (.+?) product of a \[(\d+), (\d+)\] "
                       r"weight on this device \((.*?)\); Burn's product is used there", text)
    # The attention's stacks of products under `--matmul cublas` (device_matmul's stacked).
    stacks = re.findall(r"warning: --matmul cublas: cannot run the attention's (.+?) products through "
                        r"cuBLAS on this device \((.*?)\); Burn's product is used there", text)
    clause = ""
    if found:
        figures["matmul_fallbacks"] = [{"kernel": k, "product": p, "weight": [int(i), int(o)], "why": w[:200]}
                                       for k, p, i, o, w in found]
        sites = ", ".join(f"{p} of [{i}, {o}]" for _, p, i, o, _ in found)
        clause = f"; --matmul {found[0][0]} fell back to Burn's product in {len(found)} products: {sites}"
    if stacks:
        figures["stack_fallbacks"] = [{"products": p, "why": w[:200]} for p, w in stacks]
        clause += (f"; the attention's stacks fell back to Burn's product in {len(stacks)} forms: "
                   + ", ".join(p for p, _ in stacks) + f" ({stacks[0][1][:80]})")
    return clause


def host_threads(work, name, figures):
    """The run's threads' busy shares over its steady steps (threads.py), into `figures`, and a
    clause for the verdict: the three busiest thread names and the GPU's utilisation."""
    samples = os.path.join(work, f"{name}-threads.jsonl")
    if not os.path.exists(samples):
        return ""
    smi = os.path.join(work, f"{name}-memory.csv")
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "threads.py"),
                          "summary", samples, "--smi", smi], capture_output=True, text=True)
    try:
        t = json.loads(out.stdout)
    except ValueError:
        return f"; threads not read ({out.stderr.strip()[-200:]})"
    if "error" in t:
        return f"; threads not read ({t['error']})"
    figures["host_threads"] = t
    busiest = ", ".join(f"{g['thread']}{' x' + str(g['count']) if g['count'] > 1 else ''} "
                        f"{100 * g['busy']:.0f} % (system {100 * g['system']:.0f} %)" for g in t["by_name"][:3])
    gpu = (f"; GPU utilisation {100 * t['gpu_utilization_median']:.0f} % (nvidia-smi median)"
           if "gpu_utilization_median" in t else "")
    return (f"; host threads over steps {t['from_step']}-{t['to_step']} ({t['window_seconds']:.1f} s): "
            f"{busiest}{gpu}")


def check_matmul(rc, log, work, name="mm"):
    """mm (f32 operands) and mb (bf16): every kernel ran right or said why not; the fastest
    correct kernel over Burn's."""
    data = load_json(os.path.join(work, f"{name}.json"))
    if rc != 0 or data is None:
        return f"FAIL: exit {rc}; {tail(log)}"
    rows = data["results"]
    wrong = sorted({r["kernel"] for r in rows if r.get("available") and not r.get("correct")})
    unavailable = sorted({r["kernel"] for r in rows if not r.get("available")})
    totals = {t["kernel"]: t["total_seconds"] for t in data["totals"]}
    best = data.get("fastest_correct")
    burn = totals.get("burn")
    note = []
    if best:
        note.append(f"fastest correct {best['kernel']} {best['total_seconds'] * 1e3:.2f} ms over the cases")
        if burn:
            note.append(f"burn {burn * 1e3:.2f} ms ({burn / best['total_seconds']:.2f}x)")
    peak = max((r["tflops"] for r in rows if r.get("correct")), default=0.0)
    note.append(f"best case {peak:.1f} TFLOP/s")
    # Each case's fastest correct kernel: what a choice per product form would give over the
    # one kernel for all (worth building only if this total is well under the fastest's).
    per_case = {}
    for r in rows:
        if r.get("correct") and r.get("seconds"):
            c = per_case.get(r["case"])
            if c is None or r["seconds"] < c["seconds"]:
                per_case[r["case"]] = {"kernel": r["kernel"], "seconds": r["seconds"], "tflops": r["tflops"]}
    cases = {r["case"] for r in rows}
    per_case_total = sum(c["seconds"] for c in per_case.values()) if len(per_case) == len(cases) else None
    if best and per_case_total:
        note.append(f"each case's fastest {per_case_total * 1e3:.2f} ms "
                    f"({best['total_seconds'] / per_case_total:.2f}x the fastest kernel's total)")
    peer = matmul_peer(work, name, best)
    note.append(peer["note"])
    if wrong:
        note.append("WRONG (error over " + str(data["error_bound"]) + "): " + ", ".join(wrong))
    if unavailable:
        note.append(f"{len(unavailable)} unavailable here")
    save(work, name, {"operands": data.get("operands", "f32"), "totals": data["totals"],
                      "fastest_correct": best, "fastest_per_case": per_case,
                      "per_case_total_seconds": per_case_total, "peer": peer.get("figures")})
    return f"{'PASS' if best and not wrong else 'FAIL'}: " + "; ".join(note)


def matmul_peer(work, name, best):
    """PyTorch's product at mm's (or mb's) cases (bench/matmul_peer.py's NAME-peer.json): a
    clause for the verdict, and its figures against the fastest correct kernel's, per case and in
    all. Not part of the verdict: the peer is the device library's rate, not a check."""
    data = load_json(os.path.join(work, f"{name}-peer.json"))
    if data is None:
        return {"note": "PyTorch's product not timed (see the log)"}
    rows = data["results"]
    if not data.get("all_correct"):
        wrong = ", ".join(r["case"] for r in rows if not r["correct"])
        return {"note": f"PyTorch's product WRONG at {wrong} (error over {data['error_bound']})",
                "figures": data}
    total = data["total_seconds"]
    figures = {"device": data["device"], "torch": data["torch"], "precision": data["precision"],
               "out_dtype": data["out_dtype"], "total_seconds": total,
               "cases": {r["case"]: {"seconds": r["seconds"], "tflops": r["tflops"]} for r in rows}}
    note = (f"PyTorch ({data['precision']}, {data['out_dtype']} out) {total * 1e3:.2f} ms over the cases, "
            f"best case {max(r['tflops'] for r in rows):.1f} TFLOP/s")
    if best:
        figures["fastest_kernel_over_pytorch"] = best["total_seconds"] / total
        note += f"; {best['kernel']} takes {figures['fastest_kernel_over_pytorch']:.2f}x its time"
    return {"note": note, "figures": figures}


def check_profile(rc, log, work, dry="0"):
    """dp: one steady step's launches and device time (profile_summary.py's JSON), against dw's
    wall time per step when dw ran on the same device (not in a dry run, whose dw is the CPU's)."""
    data = load_json(os.path.join(work, "dp.json"))
    if rc != 0 or data is None:
        return f"FAIL: exit {rc}; {tail(log)}"
    if data["launches_per_step"] <= 0:
        return f"FAIL: no launches logged (CUBECL_DEBUG_LOG); {tail(log)}"
    figures = {k: v for k, v in data.items() if k != "by_kernel"}
    figures["top_kernels"] = data["by_kernel"][:10]
    wall = None if dry == "1" else (load_json(os.path.join(work, "summary-dw.json")) or {}).get("median_step_seconds")
    share = ""
    if wall:
        figures["device_share_of_dw_step"] = data["device_seconds_per_step"] / wall
        share = f" ({100 * figures['device_share_of_dw_step']:.0f} % of dw's {wall:.3f} s step)"
    save(work, "dp", figures)
    top = "; ".join(f"{r['kernel']} {r['seconds_per_step']:.4f} s in {r['launches_per_step']:.0f}"
                    for r in data["by_kernel"][:3])
    return (f"PASS: one steady step launches {data['launches_per_step']:.0f} kernels "
            f"({data['compilations_per_step']:.1f} compiled), {data['device_seconds_per_step']:.4f} s of device time{share}; "
            f"most time: {top}")


def check_host_profile(rc, log, work):
    """hp: each host thread's CPU time per step, split into work and spinning (host_profile.py)."""
    data, verdict = step_result(rc, log, os.path.join(work, "hp.json"))
    if verdict:
        return verdict
    save(work, "hp", data)
    parts = []
    for t in data["threads"][:3]:
        shares = ", ".join(f"{c} {100 * v:.0f} %" for c, v in t["shares"].items() if v >= 0.01)
        top = "; ".join(f"{w['symbol']} {100 * w['share_of_thread']:.0f} %" for w in t["top_work"][:2])
        parts.append(f"{t['thread']} {t['cpu_seconds_per_step']:.3f} s/step ({shares}; most work: {top})")
    return f"PASS: perf over {data['steps']} steps at {data['frequency']:.0f} Hz: " + " / ".join(parts)


def check_peer_step(rc, log, work):
    data, verdict = step_result(rc, log, os.path.join(work, "e.json"))
    if verdict:
        return verdict
    # The warm-cache run (dw) when there is one: d's steps include kernel compilation.
    ours = load_json(os.path.join(work, "summary-dw.json")) or load_json(os.path.join(work, "summary-d.json")) or {}
    figures = dict(data)
    parts = []
    ok = True
    for precision, run in data["runs"].items():
        finite = all(x == x and abs(x) != float("inf") for x in run["losses"])
        ok = ok and finite
        mem = f", peak {run['peak_memory_mib']:.0f} MiB" if run.get("peak_memory_mib") else ""
        s = (f"{precision} {run['median_step_seconds']:.3f} s/step, {run['audio_seconds_per_second']:.1f} audio-s/s"
             f"{mem}{'' if finite else ', NON-FINITE LOSS'}")
        if ours.get("audio_seconds_per_second"):
            ratio = ours["audio_seconds_per_second"] / run["audio_seconds_per_second"]
            figures[f"asrt_f32_over_pytorch_{precision}"] = ratio
            s += f" (asrt f32 = {ratio:.2f}x)"
        parts.append(s)
    save(work, "e", figures)
    return f"{'PASS' if ok else 'FAIL'}: ParakeetForTDT on {data['device']}: " + "; ".join(parts)


def check_oom(rc, log):
    text = open(log, errors="replace").read()
    if panicked(log):
        return f"FAIL: a panic; {tail(log)}"
    # Out of memory, or first (a batch too large for CubeCL's 32-bit launches) its refusal.
    said = "ran out of memory" in text or "more than a GPU kernel can index" in text
    m = re.search(r"max_batch_seconds = ([0-9.]+)", text)
    second = "second run at" in text
    trained = len(re.findall(r"trained to step [1-9]", text))
    runs = re.findall(r"second run at max_batch_seconds = ([0-9.]+)", text)
    if said and m and second and rc == 0 and trained >= 1:
        return (f"PASS: the error named the batch and suggested max_batch_seconds = {m.group(1)}; "
                f"runs at {', '.join(runs)}: the last trained a step")
    if said and m and second:
        return f"FAIL: the suggested max_batch_seconds = {m.group(1)} did not train (exit {rc}); {tail(log)}"
    if not said:
        return f"FAIL: no out-of-memory error seen (exit {rc}); {tail(log)}"
    return f"FAIL: exit {rc}; {tail(log)}"


def check_refusals(rc, log, dry):
    text = open(log, errors="replace").read()
    if panicked(log):
        return f"FAIL: a panic; {tail(log)}"
    if dry == "1":
        # A build without CUDA refuses cuda:N while parsing, and has no NCCL check.
        ok = text.count("built without cuda") >= 3
        return ("PASS" if ok else "FAIL") + ": cuda:N refused by a build without CUDA" + ("" if ok else f"; {tail(log)}")
    twice = "listed twice" in text
    missing = re.search(r"cuda:63: this machine has (\d+) CUDA device", text)
    nccl = None
    m = re.search(r"\{.*\"bench\":\s*\"nccl-check\".*\}", text)
    if m:
        try:
            nccl = json.loads(m.group(0))
        except ValueError:
            nccl = None
    nccl_ok = bool(nccl and nccl["in_process_all_reduce_ok"] and nccl["communicator_ok"]
                   and nccl.get("fused_all_reduce_ok"))
    ok = twice and missing and nccl_ok
    nccl_s = (f"NCCL at world size 1: in-process {'ok' if nccl['in_process_all_reduce_ok'] else 'WRONG'} "
              f"({nccl['in_process_seconds']:.2f} s), fused {'ok' if nccl.get('fused_all_reduce_ok') else 'WRONG'}, communicator {'ok' if nccl['communicator_ok'] else 'WRONG'} "
              f"({nccl['communicator_seconds']:.2f} s)") if nccl else f"NCCL check failed: {tail(log, 2)}"
    return (f"{'PASS' if ok else 'FAIL'}: duplicate ordinal {'refused' if twice else 'NOT refused'}, "
            f"missing ordinal {'refused naming ' + missing.group(1) + ' device(s)' if missing else 'NOT refused'}; "
            f"{nccl_s}")


def summary(records, work, out, dry):
    rows = []
    for line in open(records):
        name, verdict, secs, note = line.rstrip("\n").split("\t", 3)
        rows.append({"step": name, "verdict": verdict, "seconds": float(secs), "note": note,
                     "figures": load_json(os.path.join(work, f"summary-{name}.json"))})
    env = open(os.path.join(work, "logs", "env.log"), errors="replace").read() if os.path.exists(
        os.path.join(work, "logs", "env.log")) else ""
    result = {"dry_run": dry == "1", "steps": rows, "environment": env}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    names = {"env": "environment", "a": "TDT kernels vs float64", "b": "PyTorch TDT loss",
             "c": "tiny, 40 steps + eval", "cg": "tiny, 3 steps' gradient norms, fused, unfused, unit, dense and cuBLAS matmul, poisoned", "d": "0.6B preset steps", "dw": "0.6B preset, warm kernel cache", "dk": "0.6B preset, warm, Burn's product (--matmul burn)", "dr": "0.6B preset, warm, operations resolved on the training thread", "dj": "0.6B preset, warm, parameters' graphs not joined", "dp": "0.6B preset, one step's kernels", "hp": "0.6B preset, host threads under perf", "du": "0.6B preset, warm, fusion off", "db": "0.6B preset, bf16-mixed (second run)", "d2": "0.6B preset, larger batch", "mm": "matmul kernels at the 0.6B products", "ma": "the attention's stacks of products, Burn's and cuBLAS's", "dm": "0.6B preset, warm, mm's fastest matmul", "dc": "dm's cuBLAS run, each product waited for", "ds": "dm's cuBLAS run, the attention's stacks through cuBLAS",
             "mb": "matmul kernels on bf16 operands, f32 out", "bm": "0.6B preset, bf16-mixed, mb's fastest matmul (second run)",
             "e": "PyTorch ParakeetForTDT steps", "f": "out of memory", "g": "device refusals"}
    md = ["| step | what | verdict | seconds | seen |", "|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['step']} | {names.get(r['step'], '')} | {r['verdict']} | {r['seconds']:.1f} | "
                  f"{r['note'].replace('|', '/')} |")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(("dry run (wgpu/CPU, small sizes)\n\n" if dry == "1" else "") + "\n".join(md) + "\n")


def main():
    kind, args = sys.argv[1], sys.argv[2:]
    if kind == "summary":
        summary(*args)
        return
    rc = int(args[0])
    print({
        "tdt-check": lambda: check_tdt(rc, *args[1:]),
        "tdt-peer": lambda: check_peer(rc, *args[1:]),
        "train-tiny": lambda: check_train_tiny(rc, *args[1:]),
        "grad-norms": lambda: check_grad_norms(rc, *args[1:]),
        "train-big": lambda: check_train_big(rc, *args[1:]),
        "train-ab": lambda: check_train_ab(rc, *args[1:]),
        "profile": lambda: check_profile(rc, *args[1:]),
        "matmul": lambda: check_matmul(rc, *args[1:]),
        "peer-step": lambda: check_peer_step(rc, *args[1:]),
        "host-profile": lambda: check_host_profile(rc, *args[1:]),
        "oom": lambda: check_oom(rc, *args[1:]),
        "refusals": lambda: check_refusals(rc, *args[1:]),
    }[kind]())


if __name__ == "__main__":
    main()
