#!/usr/bin/env python3
"""Operations fusion's stream executes in one training step, by kind and by shape.

Reads two logs of `asrt train` run with BURN_FUSION_LOG=full (Burn's fusion prints a table of
every operation it executes), one of N steps and one of N + 1, and prints the difference: the
operations of one step. bench/fusion_ops.sh makes the two logs; bench/RESULTS.md, 2026-12-01.

    fusion_ops.py SHORT.log LONG.log [--shapes OP ...] [--top N]

--shapes OP prints, for each named operation kind (`BaseFloat::Reshape`), its count a step
by input and output shapes (tensor ids removed).
"""
import argparse
import collections
import re
import sys

HEADER = re.compile(r"^idx +block ")
ROW = re.compile(r"^\d+\s")
TENSOR_ID = re.compile(r"\bt\d+:")


def read(path):
    """(kind counts, (kind, inputs, outputs) counts) over every table row in `path`."""
    kinds, shapes = collections.Counter(), collections.Counter()
    cols = None
    with open(path, errors="replace") as log:
        for line in log:
            # The idx column is as wide as its widest index: a table of 1,000 operations or
            # more has "idx   block" (bench/RESULTS.md, 2026-12-06: such tables were skipped).
            if HEADER.match(line):
                # The columns are padded to their widest cell: their offsets come from the header.
                cols = (line.index(" op ") + 1, line.index(" inputs") + 1, line.index(" outputs") + 1)
                continue
            if cols is None or line.startswith("---"):
                continue
            if not ROW.match(line):
                cols = None
                continue
            op = line[cols[0]:cols[1]].strip()
            inputs = TENSOR_ID.sub("", line[cols[1]:cols[2]].strip())
            outputs = TENSOR_ID.sub("", line[cols[2]:].strip())
            kinds[op] += 1
            shapes[(op, inputs, outputs)] += 1
    return kinds, shapes


def difference(long, short):
    return {k: long[k] - short[k] for k in set(long) | set(short) if long[k] != short[k]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("short")
    parser.add_argument("long")
    parser.add_argument("--shapes", nargs="*", default=[], metavar="OP")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    (ks, ss), (kl, sl) = read(args.short), read(args.long)
    kinds = difference(kl, ks)
    if not kinds:
        sys.exit("no fusion tables differ: were both logs made with BURN_FUSION_LOG=full?")
    print(f"operations a step: {sum(kinds.values())}")
    for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{n:7d}  {kind}")
    shapes = difference(sl, ss)
    for op in args.shapes:
        rows = sorted(((n, i, o) for (k, i, o), n in shapes.items() if k == op), reverse=True)
        print(f"\n{op}: {sum(n for n, _, _ in rows)} a step")
        for n, i, o in rows[: args.top]:
            print(f"{n:7d}  {i}  ->  {o}")


if __name__ == "__main__":
    main()
