#!/usr/bin/env python3
"""Decode rows of an `ab_tune.sh decode` run: each label's GPU time (µs, median per
round) per shape and page size, and its ratio to the base label's mean.

Usage: python3 scripts/dev/ab_decode.py OUT BASE_LABEL
"""
import collections
import glob
import json
import os
import sys


def main(out, base):
    runs = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(out, "decode_*_*.json"))):
        label = os.path.basename(path)[len("decode_"):].rsplit("_", 1)[0]
        rows = {}
        for r in json.load(open(path))["decode"]:
            rows[(r["batch"], r["seqlen_k"], r["page_size"])] = (r["gpu_time"]["median_ms"] * 1e3, r.get("ok", True))
        runs[label].append(rows)
    if base not in runs:
        sys.exit(f"no runs of the base label {base!r} in {out}")
    others = [l for l in runs if l != base]
    print(f"| batch | seqlen_k | page | {base} GPU µs | " + " | ".join(f"{l} ÷ {base} (time)" for l in others) + " | checks |")
    print("|---:|---:|---:|---|" + "---|" * len(others) + "---|")
    for key in runs[base][0]:
        b = [r[key] for r in runs[base] if key in r]
        mean = sum(x[0] for x in b) / len(b)
        ok = all(x[1] for x in b)
        cells = []
        for l in others:
            vals = [r[key] for r in runs[l] if key in r]
            ok = ok and all(v[1] for v in vals)
            cells.append(" / ".join(f"{v[0] / mean:.3f}" for v in vals))
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " / ".join(f"{x[0]:.1f}" for x in b) + " | "
              + " | ".join(cells) + f" | {'ok' if ok else 'FAILED'} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
