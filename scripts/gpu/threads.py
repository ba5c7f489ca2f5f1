#!/usr/bin/env python3
"""Samples a training process's threads: where the host's time goes while the device trains.

    threads.py sample PID OUT.jsonl --metrics RUN/metrics.jsonl [--smi SMI.csv] [--every S]
        every S seconds (default 0.05) until PID exits, one line: the time, how many steps the
        run's metrics file holds, how many rows nvidia-smi's sampler has written (so that its
        rows can be told apart by step), and each thread's name and CPU time (user, system),
        read from /proc/PID/task/*/stat
    threads.py summary OUT.jsonl [--smi SMI.csv] [--from-step K]
        (JSON on stdout) each thread's busy share over the window from step K's start (the
        metrics file holding K - 1 steps; default K = 3, past compilation and the pool's growth)
        to the last step's end (from the last step where the run has fewer), and nvidia-smi's
        GPU utilisation over the same rows

Why: on an H200 the 0.6B step's kernels took 74-92 % of its wall time, and a faster product
kernel barely moved the step, so the host may be the bound. A thread busy for the whole window
is a bound (or spins: CubeCL's channel waits by yielding, which is system time); threads mostly
idle are not. Standard library only: the GPU machine has no network.
"""
import argparse
import json
import os
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")


def lines_in(path):
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def threads_of(pid):
    """{tid: (name, user seconds, system seconds)} of the live threads of `pid`."""
    out = {}
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return None
    for tid in tids:
        try:
            stat = open(f"{base}/{tid}/stat").read()
        except OSError:
            continue  # the thread ended between the listing and the read
        # The name sits in parentheses and may hold spaces; the fields after it are fixed.
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = (name, int(fields[11]) / TICKS, int(fields[12]) / TICKS)
    return out


def sample(args):
    with open(args.out, "w") as out:
        while True:
            t = time.monotonic()
            threads = threads_of(args.pid)
            if threads is None:
                break
            rec = {"t": t, "steps": lines_in(args.metrics),
                   "smi_rows": lines_in(args.smi) if args.smi else 0,
                   "threads": {tid: list(v) for tid, v in threads.items()}}
            out.write(json.dumps(rec) + "\n")
            out.flush()
            time.sleep(args.every)


def summary(args):
    recs = [json.loads(line) for line in open(args.samples) if line.strip()]
    if not recs:
        return {"error": "no samples"}
    last = max(r["steps"] for r in recs)
    # A short run (the dry run's 2 steps) is read from its last step.
    first = min(args.from_step, last)
    if first < 2:
        return {"error": f"the samples saw {last} step(s) written; the window needs 2 (step 1 compiles)"}
    start_steps = first - 1
    # The window: the first sample that sees step K - 1 written, to the first that sees the last.
    a = next(r for r in recs if r["steps"] >= start_steps)
    b = next(r for r in recs if r["steps"] >= last)
    wall = b["t"] - a["t"]
    if wall <= 0:
        return {"error": "the window holds no samples (steps shorter than the sampling period)"}
    rows = []
    for tid, (name, user, system) in b["threads"].items():
        u0, s0 = a["threads"].get(tid, [name, 0.0, 0.0])[1:]
        rows.append({"thread": name, "tid": int(tid), "busy": (user + system - u0 - s0) / wall,
                     "system": (system - s0) / wall})
    rows.sort(key=lambda r: -r["busy"])
    # Threads of one name (CubeCL's, a pool's) summed, for a line that stays short.
    by_name = {}
    for r in rows:
        g = by_name.setdefault(r["thread"], {"thread": r["thread"], "count": 0, "busy": 0.0, "system": 0.0})
        g["count"] += 1
        g["busy"] += r["busy"]
        g["system"] += r["system"]
    result = {"from_step": first, "to_step": last, "window_seconds": wall,
              "threads": rows, "by_name": sorted(by_name.values(), key=lambda g: -g["busy"])}
    if args.smi and os.path.exists(args.smi):
        smi = [line.split(",") for line in open(args.smi) if line.strip()]
        util = [float(x[1]) for x in smi[a["smi_rows"]:b["smi_rows"]] if len(x) > 1 and x[1].strip()]
        if util:
            util.sort()
            result["gpu_utilization_median"] = util[len(util) // 2] / 100
            result["gpu_utilization_samples"] = len(util)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("pid", type=int)
    s.add_argument("out")
    s.add_argument("--metrics", required=True)
    s.add_argument("--smi")
    s.add_argument("--every", type=float, default=0.05)
    m = sub.add_parser("summary")
    m.add_argument("samples")
    m.add_argument("--smi")
    m.add_argument("--from-step", type=int, default=3)
    args = p.parse_args()
    if args.cmd == "sample":
        sample(args)
    else:
        json.dump(summary(args), sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
