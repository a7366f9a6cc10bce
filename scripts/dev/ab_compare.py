#!/usr/bin/env python3
"""Tables of an `ab_tune.sh` run: each label's TFLOP/s over the mean of the base label's
runs, per row of the suite, with the tile each ran where it differs from the base's (a
configuration that spilled and stepped down shows here) and whether every check passed.

Usage: python3 scripts/dev/ab_compare.py OUT SUITE BASE_LABEL
"""
import collections
import glob
import json
import os
import sys


def rows(path, suite):
    out = {}
    for r in json.load(open(path))[suite]:
        key = (r["head_dim"][0], r["causal"], r.get("deterministic", False), r["seqlen"])
        tiles = r.get("receipt", "").split(" tiles")[0].split("; ")[-1]
        out[key] = (r["tflops"], tiles, r.get("ok", True))
    return out


def main(out, suite, base):
    runs = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(out, f"{suite}_*_*.json"))):
        label = os.path.basename(path)[len(suite) + 1:].rsplit("_", 1)[0]
        runs[label].append(rows(path, suite))
    if base not in runs:
        sys.exit(f"no runs of the base label {base!r} in {out}")
    others = [l for l in runs if l != base]
    print(f"| d | causal | det | seqlen | {base} | " + " | ".join(f"{l} ÷ {base}" for l in others) + " | checks |")
    print("|---|---|---|---:|---|" + "---|" * len(others) + "---|")
    for key in runs[base][0]:
        b = [r[key] for r in runs[base]]
        mean = sum(x[0] for x in b) / len(b)
        cells, ok = [], all(x[2] for x in b)
        for l in others:
            vals = [r[key] for r in runs[l] if key in r]
            ok = ok and all(v[2] for v in vals)
            note = "".join(sorted({f" ({v[1]})" for v in vals if v[1] != b[0][1]}))
            cells.append(" / ".join(f"{v[0] / mean:.3f}" for v in vals) + note)
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " / ".join(f"{x[0]:.0f}" for x in b) + " | "
              + " | ".join(cells) + f" | {'ok' if ok else 'FAILED'} |")


if __name__ == "__main__":
    main(*sys.argv[1:4])
