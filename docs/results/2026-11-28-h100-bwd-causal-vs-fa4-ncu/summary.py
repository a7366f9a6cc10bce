#!/usr/bin/env python3
"""Summarizes prof.sh's ncu exports: per head dim, attnc's and FA4's backward main kernels
side by side (duration, instructions, pipe and issue use, warps), executed instructions and
stall-sample shares per opcode, and attnc's instructions with the most stall samples (FA4's
listing is the peer's code: only its counts are printed).  python3 summary.py DIR"""
import collections
import csv
import os
import sys

METRICS = [
    ("Duration", "duration"),
    ("Elapsed Cycles", "elapsed cycles"),
    ("SM Frequency", "SM clock (GHz)"),
    ("Executed Instructions", "warp instructions executed"),
    ("SM Busy", "SM busy % (its busiest pipe: the tensor cores)"),
    ("Issue Slots Busy", "issue slots busy %"),
    ("Achieved Active Warps Per SM", "achieved warps per SM"),
    ("Registers Per Thread", "registers"),
    ("Dynamic Shared Memory Per Block", "dynamic shared memory"),
    ("L2 Hit Rate", "L2 hit rate %"),
]


def is_main(name):
    return "hopper_bwd" in name or ("bwd_sm90" in name and "process" not in name)


def details(path):
    got = {}
    with open(path) as f:
        for r in csv.DictReader(l for l in f if l.startswith('"')):
            if is_main(r.get("Kernel Name", "")) and r["Metric Name"] not in got:
                got[r["Metric Name"]] = f'{r["Metric Value"]} {r["Metric Unit"]}'.strip()
    return got


def sass(path):
    """(opcode counts, opcode stall samples, [(stall samples, executed, source)]) of the main kernel."""
    ex, st, rows, on, hdr = collections.Counter(), collections.Counter(), [], False, None
    for r in csv.reader(open(path)):
        if r and r[0] == "Kernel Name":
            on, hdr = is_main(r[1]), None
            continue
        if not on:
            continue
        if r and r[0] == "Address":
            hdr = r
            continue
        if hdr and len(r) > 5:
            d = dict(zip(hdr, r))
            src = d.get("Source", "").strip()
            op_src = src.split(None, 1)[1] if src.startswith("@") and " " in src else src
            op = op_src.split()[0].split(".")[0] if op_src else "?"
            n = int((d.get("Instructions Executed") or "0").replace(",", "") or 0)
            s = int((d.get("Warp Stall Sampling (All Samples)") or "0").replace(",", "") or 0)
            ex[op] += n
            st[op] += s
            rows.append((s, n, src))
    return ex, st, rows


def main(dirp):
    for d in (64, 128):
        a_det, f_det = (os.path.join(dirp, f"{w}_d{d}_details.csv") for w in ("attnc", "fa4"))
        if not (os.path.exists(a_det) and os.path.exists(f_det)):
            print(f"## d{d}: missing exports\n")
            continue
        a, f = details(a_det), details(f_det)
        print(f"## d{d} causal, b4 x 8k x {2048 // d} heads: the backward main kernels\n")
        print("| | attnc | FA4 |\n|---|---:|---:|")
        for key, label in METRICS:
            print(f"| {label} | {a.get(key, '-')} | {f.get(key, '-')} |")
        (ae, ast, arows), (fe, fst, _) = (sass(os.path.join(dirp, f"{w}_d{d}_sass.csv")) for w in ("attnc", "fa4"))
        at, ft, ats, fts = sum(ae.values()), sum(fe.values()), max(1, sum(ast.values())), max(1, sum(fst.values()))
        print(f"\nExecuted warp instructions (SASS page): attnc {at / 1e6:.1f} M, FA4 {ft / 1e6:.1f} M; "
              f"stall samples attnc {ats}, FA4 {fts}.\n")
        print("| opcode | attnc (M) | FA4 (M) | attnc stall % | FA4 stall % |\n|---|---:|---:|---:|---:|")
        for op in sorted(set(ae) | set(fe), key=lambda o: -(ae[o] + fe[o]))[:24]:
            print(f"| {op} | {ae[op] / 1e6:.1f} | {fe[op] / 1e6:.1f} | {100 * ast[op] / ats:.1f} | {100 * fst[op] / fts:.1f} |")
        print("\nattnc's 16 instructions with the most stall samples:\n")
        print("| stall % | executed (M) | instruction |\n|---:|---:|---|")
        for s, n, src in sorted(arows, reverse=True)[:16]:
            print(f"| {100 * s / ats:.1f} | {n / 1e6:.2f} | `{src[:90]}` |")
        print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
