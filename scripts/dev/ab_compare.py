#!/usr/bin/env python3
"""Tables of an `ab_tune.sh` run: each label's TFLOP/s over the mean of the base label's
runs, per row of the suite, with the tile each ran where it differs from the base's (a
configuration that spilled and stepped down shows here) and whether every check passed.
For the decode suite: each label's GPU time (µs) over the base's, per shape and page size.

Usage: python3 scripts/dev/ab_compare.py OUT SUITE BASE_LABEL   (SUITE: prefill, backward, decode)
"""
import collections
import glob
import json
import os
import sys


def rows(path, suite):
    out = {}
    for r in json.load(open(path))[suite]:
        if suite == "decode":
            out[(r["batch"], r["seqlen_k"], r["page_size"])] = (r["gpu_time"]["median_ms"] * 1e3, "", r.get("ok", True))
            continue
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
    if suite == "decode":
        head, fmt = f"| batch | seqlen_k | page | {base} GPU µs | ", "{:.1f}"
        print(head + " | ".join(f"{l} ÷ {base} (time)" for l in others) + " | checks |")
        print("|---:|---:|---:|---|" + "---|" * len(others) + "---|")
    else:
        head, fmt = f"| d | causal | det | seqlen | {base} | ", "{:.0f}"
        print(head + " | ".join(f"{l} ÷ {base}" for l in others) + " | checks |")
        print("|---|---|---|---:|---|" + "---|" * len(others) + "---|")
    for key in runs[base][0]:
        b = [r[key] for r in runs[base] if key in r]
        mean = sum(x[0] for x in b) / len(b)
        cells, ok = [], all(x[2] for x in b)
        for l in others:
            vals = [r[key] for r in runs[l] if key in r]
            ok = ok and all(v[2] for v in vals)
            note = "".join(sorted({f" ({v[1]})" for v in vals if v[1] != b[0][1]}))
            cells.append(" / ".join(f"{v[0] / mean:.3f}" for v in vals) + note)
        print("| " + " | ".join(str(k) for k in key) + " | " + " / ".join(fmt.format(x[0]) for x in b) + " | "
              + " | ".join(cells) + f" | {'ok' if ok else 'FAILED'} |")


if __name__ == "__main__":
    main(*sys.argv[1:4])
