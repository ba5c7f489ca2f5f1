#!/usr/bin/env python3
"""The Python batch sampler `asrt` replaces, as our users run it today (DurationBucketBatchSampler
of the NeMo-based pipeline), kept as the reference for equivalence tests and as the peer in
benchmarks. The planning logic below is the pipeline's, unchanged; only the command-line driver
around it is ours.

One detail the pipeline's listing does not show is how a bucket's last, partly filled batch is
handled; this keeps it (dropping it would silently lose data), and so does `asrt`.

Usage:
    python_sampler.py DURATIONS.f64 LANGUAGES.u16 [--world-size W] [--rank R | --all-ranks]
        [--epoch E] [--grad-accum G] [--seed S] [--temperature T] [--max-dur X]
        [--boundaries 3,5,8,12,16] [--out FILE] [--time]

DURATIONS.f64 holds little-endian float64 seconds, LANGUAGES.u16 little-endian uint16 ids.
Prints (or writes to FILE) a JSON list of the rank's batches (utterance indices), or with
--all-ranks a list of such lists. --time prints the planning time on stderr.
"""

import argparse
import bisect
import json
import math
import random
import resource
import sys
import time
from collections import defaultdict

import numpy as np


class DurationBucketBatchSampler:
    def __init__(self, durations, languages, boundaries, max_dur, temperature,
                 world_size, rank, grad_accum, seed):
        self.durations = durations
        self.languages = languages
        self.boundaries = boundaries
        self.max_dur = max_dur
        self.temperature = temperature
        self.world_size = world_size
        self.rank = rank
        self.grad_accum = grad_accum
        self.seed = seed
        self.epoch = 0
        self._num_batches = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def _assign_bucket(self, dur):
        return bisect.bisect_right(self.boundaries, dur)

    def build(self):
        rng = random.Random(self.seed + self.epoch)
        lang_counts = defaultdict(int)
        for lang in self.languages:
            lang_counts[lang] += 1
        total = len(self.durations)
        if self.temperature <= 0:
            lang_w = {l: 1.0 for l in lang_counts}
        else:
            lang_w = {l: math.pow(c, self.temperature) for l, c in lang_counts.items()}
        ws = sum(lang_w.values())
        lang_props = {l: w / ws for l, w in lang_w.items()}
        sample_weights = []
        for lang in self.languages:
            actual = lang_counts[lang] / total
            target = lang_props[lang]
            sample_weights.append(target / actual if actual > 0 else 0)

        buckets = defaultdict(list)
        for i, dur in enumerate(self.durations):
            buckets[self._assign_bucket(dur)].append(i)

        all_batches = []
        for b_id, indices in buckets.items():
            keyed = [(rng.random() ** (1.0 / max(sample_weights[i], 1e-12)), i) for i in indices]
            keyed.sort(reverse=True)
            sorted_idx = [i for _, i in keyed]
            batch, batch_dur = [], 0.0
            for idx in sorted_idx:
                d = self.durations[idx]
                if batch_dur + d > self.max_dur and batch:
                    all_batches.append(batch)
                    batch, batch_dur = [], 0.0
                batch.append(idx)
                batch_dur += d
            if batch:
                all_batches.append(batch)

        def _batch_cost(b):
            max_dur = max(self.durations[i] for i in b)
            return len(b) * max_dur

        all_batches.sort(key=_batch_cost, reverse=True)
        usable = (len(all_batches) // self.world_size) * self.world_size
        all_batches = all_batches[:usable]
        rank_batches = all_batches[self.rank:usable:self.world_size]

        if self.grad_accum > 1:
            trim = len(rank_batches) - (len(rank_batches) % self.grad_accum)
            rank_batches = rank_batches[:trim]
        rng.shuffle(rank_batches)
        self._num_batches = len(rank_batches)
        return rank_batches


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("durations")
    p.add_argument("languages")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--all-ranks", action="store_true")
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.3)
    p.add_argument("--max-dur", type=float, default=90.0)
    p.add_argument("--boundaries", default="3,5,8,12,16")
    p.add_argument("--out")
    p.add_argument("--time", action="store_true")
    a = p.parse_args()
    # The pipeline holds its manifest columns as Python lists (pandas rows); so does this driver.
    durations = np.fromfile(a.durations, dtype="<f8").tolist()
    languages = np.fromfile(a.languages, dtype="<u2").tolist()
    boundaries = [float(x) for x in a.boundaries.split(",")]
    ranks = range(a.world_size) if a.all_ranks else [a.rank]
    results = []
    for r in ranks:
        s = DurationBucketBatchSampler(durations, languages, boundaries, a.max_dur, a.temperature,
                                       a.world_size, r, a.grad_accum, a.seed)
        s.set_epoch(a.epoch)
        t0 = time.perf_counter()
        results.append(s.build())
        if a.time:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"plan_seconds {time.perf_counter() - t0:.3f} peak_rss_mib {peak:.0f}", file=sys.stderr)
    doc = results if a.all_ranks else results[0]
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f)
    else:
        json.dump(doc, sys.stdout)


if __name__ == "__main__":
    main()
