#!/usr/bin/env python3
"""A/B of hopper tune overrides at the kernels' own GPU time, in one process.

`ab_tune.sh` compares overrides by the protocol's events, one `attnc bench` process per
label and round, so a label's cells and the next label's are minutes apart; the 16k cells
of one binary moved 5-9% between such runs. Here every label's kernel of a cell is built in
one process (the override set in the environment while the package compiles it: it enters
the cache key), then timed round-robin, each round by events (the anchors' `bench_ms`) and
by GPU busy time (torch.profiler's summed kernel durations; see interleaved.py).

  PYTHONPATH=python:scripts/dev python3 scripts/dev/ab_busy.py OUT.json 'def=' 'n176=block_n=176' \
      [--dirs fwd] [--hdims 128] [--causal 0] [--seqlens 1024,...] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import time

import torch

import attnc
from interleaved import DT, bench_ms, busy_ms, spec_text

VAR = "ATTNC_HOPPER_TUNE"


def with_tune(tune, fn):
    """Runs `fn` with the override `tune` in the environment ('' for none)."""
    old = os.environ.pop(VAR, None)
    if tune:
        os.environ[VAR] = tune
    try:
        return fn()
    finally:
        os.environ.pop(VAR, None)
        if old is not None:
            os.environ[VAR] = old


def cell(labels, hd, causal, s, rounds):
    b, h = 32768 // s, 2048 // hd
    fl = 4 * b * h * s * s * hd / (2 if causal else 1)
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=DT) for _ in range(3))
    row = {"hdim": hd, "causal": causal, "seqlen": s, "events": {}, "busy": {}, "check": {}, "receipt": {}}
    fns, ref = {}, None
    with torch.no_grad():
        for label, tune in labels:
            # A name per label: each compiles its own kernel (and its own cache entry).
            text = spec_text(hd, h, causal).replace("attention prefill_", f"attention {label}_prefill_", 1)
            attn = with_tune(tune, lambda text=text: attnc.compile(text))
            o = with_tune(tune, lambda attn=attn: attn(q, k, v))
            ref = o if ref is None else ref
            row["check"][label] = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
            row["receipt"][label] = attn.receipt_text()
            fns[label] = (tune, lambda attn=attn: attn(q, k, v))
        names = list(fns)
        for r in range(rounds):
            for label in names[r % len(names):] + names[: r % len(names)]:
                tune, f = fns[label]
                ms = with_tune(tune, lambda f=f: bench_ms(f))
                row["events"].setdefault(label, []).append(round(fl / ms / 1e9, 1))
                busy, _ = with_tune(tune, lambda f=f: busy_ms(f))
                row["busy"].setdefault(label, []).append(round(fl / busy / 1e9, 1))
    base = names[0]
    for kind in ("events", "busy"):
        med = {n: statistics.median(t) for n, t in row[kind].items()}
        row[f"{kind}_median"] = med
        row[f"{kind}_vs_{base}"] = {n: round(med[n] / med[base], 3) for n in names[1:]}
        row[f"{kind}_vs_{base}_range"] = {
            n: [round(min(x / y for x, y in zip(row[kind][n], row[kind][base])), 3),
                round(max(x / y for x, y in zip(row[kind][n], row[kind][base])), 3)] for n in names[1:]}
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("labels", nargs="+", help="LABEL=TUNE (TUNE empty for the default)")
    ap.add_argument("--hdims", default="128")
    ap.add_argument("--causal", default="0")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    labels = [tuple(x.split("=", 1)) for x in a.labels]
    meta = {"device": torch.cuda.get_device_name(), "labels": dict(labels), "rounds": a.rounds,
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    rows = []
    for hd in (int(x) for x in a.hdims.split(",")):
        for causal in (c == "1" for c in a.causal.split(",")):
            for s in (int(x) for x in a.seqlens.split(",")):
                row = cell(labels, hd, causal, s, a.rounds)
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(a.out, "w") as f:
                    json.dump({"meta": meta, "cells": rows}, f, indent=1)
    base = labels[0][0]
    print(f"\n| d | causal | seqlen | {base} busy TFLOP/s | " + " | ".join(
        f"{n} ÷ {base}: busy (range) / events" for n, _ in labels[1:]) + " |")
    print("|---|---|---:|---:|" + "---|" * (len(labels) - 1))
    for r in rows:
        cols = [f"{r['busy_vs_' + base][n]} {r['busy_vs_' + base + '_range'][n]} / {r['events_vs_' + base][n]}"
                for n, _ in labels[1:]]
        print(f"| {r['hdim']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | {r['busy_median'][base]} | "
              + " | ".join(cols) + " |")


if __name__ == "__main__":
    main()
