#!/usr/bin/env python3
"""attnc beside FlashAttention-4 and cuDNN in one process, cell by cell, round-robin.

The side-by-side commands run `attnc bench` and the anchors' bench.py one after the other,
a minute apart: a cell's ratio then also holds whatever the GPU's clocks did in between
(the same binary's 16k forward cells moved 5-9% between runs a minute apart,
docs/results/2026-11-28-h100-prefill-16k-spread/). Here every backend of a cell is timed
in each of several rounds, the backends' order rotated per round, with the anchors'
methods (`bench_ms` of ../shared/bench/anchors/bench.py: CUDA events around one call,
the median of the runs; the backward as `torch.autograd.grad` of a kept graph), attnc
through its PyTorch custom op (`import attnc`). Per cell and backend it reports each
round's TFLOP/s and their median; per cell the ratio attnc / best(FA4, cuDNN) of the
medians and the range of the per-round ratios.

  PYTHONPATH=python:<peers' site> python3 scripts/dev/interleaved.py OUT.json \
      [--dirs fwd,bwd] [--hdims 64,128] [--seqlens 1024,...] [--rounds 3] [--iters 20] [--direct]

`--direct` adds attnc's backward called straight through the package's Rust binding
(`Kernel.backward`, preallocated gradients) beside the autograd call, and every backend's
host time per call (`host_us`: the GPU idle before it) is reported. `--busy` adds each
backend's GPU busy time per call from torch.profiler (the summed durations of its kernels,
memsets and copies): the kernels' own speed, free of every backend's host prelude; per
kernel (`kernels_us`, µs per call), so a gap shows in the main kernel or the ones around it.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnc
import attnc.torch as at

DT = torch.bfloat16


def bench_ms(fn, warmup=5, iters=20):
    """The anchors' timing: events around each call, the median."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def host_us(fn, iters=10):
    """The host's median time to enqueue one call, µs (the GPU idle before each)."""
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    return round(statistics.median(times), 1)


def busy_ms(fn, n=10):
    """The GPU's busy time per call, ms: the summed durations of the device activities
    (kernels, memsets, copies) the profiler records over `n` calls, divided by `n`: no
    host prelude, no gaps between launches — the same measure for every backend, whatever
    its Python and autograd cost before its first kernel."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    busy, count, by_name = 0.0, 0, {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.time_range.elapsed_us()
            busy += us
            count += 1
            name = short_name(e.name)
            by_name[name] = by_name.get(name, 0.0) + us / n
    return busy / n / 1e3, count / n, by_name


def short_name(name):
    """A kernel's name short enough for a table (CUTLASS-DSL names run to 300 characters):
    the part before the first '(' or '<', at most 60 characters."""
    for sep in ("(", "<"):
        name = name.split(sep)[0]
    return name[:60]


def spec_text(hd, heads, causal):
    mask = "\n  mask causal" if causal else ""
    return f"attention prefill_d{hd}_{'causal' if causal else 'full'} {{\n  dtype bf16\n  head_dim {hd}\n  heads {heads}{mask}\n}}\n"


def forward_fns(hd, heads, causal):
    """name -> f(q, k, v) -> o, for each backend that imports; and attnc's variant."""
    fns = {}
    attn = attnc.compile(spec_text(hd, heads, causal))
    fns["attnc"] = lambda q, k, v: attn(q, k, v)
    try:
        from flash_attn.cute import flash_attn_func

        def fa4(q, k, v):
            o = flash_attn_func(q, k, v, causal=causal)
            return o[0] if isinstance(o, tuple) else o

        fns["fa4"] = fa4
    except Exception as e:  # noqa: BLE001
        print(f"FA4 not importable: {type(e).__name__}: {e}", file=sys.stderr)

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=causal)
        return o.transpose(1, 2)

    fns["cudnn"] = cudnn
    return fns, attn


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def cell(direction, hd, causal, s, rounds, iters, direct, busy):
    b, h = 32768 // s, 2048 // hd
    fl = 4 * b * h * s * s * hd / (2 if causal else 1) * (2.5 if direction == "bwd" else 1.0)
    fns, attn = forward_fns(hd, h, causal)
    torch.manual_seed(0)
    grad = direction == "bwd"
    q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=DT, requires_grad=grad) for _ in range(3))
    row = {"dir": direction, "hdim": hd, "causal": causal, "seqlen": s, "batch": b, "heads": h, "rounds": {},
           "check": {}, "errors": {}}
    timed = {}
    g = torch.randn(b, s, h, hd, device="cuda", dtype=DT)
    with torch.no_grad():
        ref = fns["cudnn"](q, k, v)
    ref_dq = None
    # cuDNN first: its dQ is what the others' is compared with.
    for name in sorted(fns, key=lambda n: n != "cudnn"):
        f = fns[name]
        try:
            if grad:
                o = f(q, k, v)
                dq = torch.autograd.grad(o, (q,), g, retain_graph=True)[0]
                ref_dq = dq if name == "cudnn" else ref_dq
                row["check"][name] = {"o": rel_l2(o.detach(), ref), "dq": rel_l2(dq, ref_dq)}
                timed[name] = lambda o=o: torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
            else:
                with torch.no_grad():
                    o = f(q, k, v)
                row["check"][name] = {"o": rel_l2(o, ref)}
                timed[name] = lambda f=f: f(q, k, v)
        except Exception as e:  # noqa: BLE001
            row["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
    if grad and "attnc" in timed and direct:
        # attnc's backward called directly (the Rust call the custom op makes), without
        # autograd's engine and the gradients' allocation: what the kernel costs.
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        with torch.no_grad():
            o, lse = at.attention(attn, qd, kd, vd, return_lse=True)
        kern = attn.kernel(0)
        dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
        timed["attnc_direct"] = lambda: kern.backward(qd, kd, vd, o, lse, g, dq, dk, dv, at._stream(qd),
                                                      {"deterministic": False})
    names = list(timed)
    with torch.no_grad() if not grad else torch.enable_grad():
        row["host_us"] = {n: host_us(f) for n, f in timed.items()}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            with torch.no_grad() if not grad else torch.enable_grad():
                ms = bench_ms(timed[name], iters=iters)
            row["rounds"].setdefault(name, []).append(round(fl / ms / 1e9, 1))
            if busy:
                # Each round's busy time right after its event timing: the same state of
                # the GPU's clocks for both measures and, round-robin, for every backend.
                try:
                    with torch.no_grad() if not grad else torch.enable_grad():
                        ms, kernels, by_name = busy_ms(timed[name])
                    got = row.setdefault("busy", {}).setdefault(name, {"rounds": [], "activities_per_call": kernels})
                    got["rounds"].append(round(fl / ms / 1e9, 1))
                    # Each activity's µs per call, per round: which kernel holds a gap.
                    for kn, us in by_name.items():
                        got.setdefault("kernels_us", {}).setdefault(kn, []).append(round(us, 1))
                except Exception as e:  # noqa: BLE001
                    row["errors"][f"busy {name}"] = f"{type(e).__name__}: {str(e)[:300]}"
    for got in row.get("busy", {}).values():
        got["tflops"] = statistics.median(got["rounds"])
        got["kernels_us"] = {kn: statistics.median(us) for kn, us in got.get("kernels_us", {}).items()}
    row["median"] = {n: statistics.median(t) for n, t in row["rounds"].items()}
    row["attnc_receipt"] = attn.receipt_text()
    peers = [n for n in ("fa4", "cudnn") if n in row["median"]]
    if "attnc" in row["median"] and peers:
        best = max(row["median"][n] for n in peers)
        row["ratio"] = round(row["median"]["attnc"] / best, 3)
        per_round = [row["rounds"]["attnc"][i] / max(row["rounds"][n][i] for n in peers) for i in range(rounds)]
        row["ratio_range"] = [round(min(per_round), 3), round(max(per_round), 3)]
    if "attnc_direct" in row["median"] and peers:
        row["ratio_direct"] = round(row["median"]["attnc_direct"] / best, 3)
    if busy and "attnc" in row.get("busy", {}) and any(n in row["busy"] for n in peers):
        bp = [n for n in peers if n in row["busy"]]
        row["ratio_busy"] = round(row["busy"]["attnc"]["tflops"] / max(row["busy"][n]["tflops"] for n in bp), 3)
        per_round = [row["busy"]["attnc"]["rounds"][i] / max(row["busy"][n]["rounds"][i] for n in bp)
                     for i in range(min(len(row["busy"][n]["rounds"]) for n in ["attnc", *bp]))]
        row["ratio_busy_range"] = [round(min(per_round), 3), round(max(per_round), 3)]
    del q, k, v, timed
    torch.cuda.empty_cache()
    return row


def print_kernel_table(rows):
    """Per cell: each backend's longest kernel and the sum of the rest (µs per call, busy time)."""
    if any("busy" in r for r in rows):
        print("\n| dir | hdim | causal | seqlen | attnc µs: longest kernel + the rest | FA4 µs | cuDNN µs | "
              "time of the longest kernel, attnc ÷ best peer (> 1: slower) | time of the rest, attnc ÷ best peer |")
        print("|---|---|---|---:|---|---|---|---:|---:|")
        for r in rows:
            split = {}
            for n in ("attnc", "fa4", "cudnn"):
                ks = r.get("busy", {}).get(n, {}).get("kernels_us")
                if ks:
                    main_us = max(ks.values())
                    split[n] = (main_us, sum(ks.values()) - main_us)
            peers = [n for n in ("fa4", "cudnn") if n in split]
            cells = [f"{split[n][0]:.0f} + {split[n][1]:.0f}" if n in split else "-" for n in ("attnc", "fa4", "cudnn")]
            if "attnc" in split and peers:
                best = min(peers, key=lambda n: sum(split[n]))
                main_ratio = f"{split['attnc'][0] / split[best][0]:.3f}"
                rest_ratio = f"{split['attnc'][1] / split[best][1]:.2f}" if split[best][1] > 0 else "-"
            else:
                main_ratio = rest_ratio = "-"
            print(f"| {r['dir']} | {r['hdim']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | "
                  f"{' | '.join(cells)} | {main_ratio} | {rest_ratio} |")



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dirs", default="fwd,bwd")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--direct", action="store_true", help="also time attnc's backward called directly")
    ap.add_argument("--busy", action="store_true", help="also each backend's GPU busy time (torch.profiler)")
    a = ap.parse_args()
    rows = []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "attnc": attnc.__version__,
            "cudnn": torch.backends.cudnn.version(), "rounds": a.rounds, "iters": a.iters,
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    for direction in a.dirs.split(","):
        for hd in (int(x) for x in a.hdims.split(",")):
            for causal in (c == "1" for c in a.causal.split(",")):
                for s in (int(x) for x in a.seqlens.split(",")):
                    t0 = time.time()
                    row = cell(direction, hd, causal, s, a.rounds, a.iters, a.direct, a.busy)
                    row["seconds"] = round(time.time() - t0, 1)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    with open(a.out, "w") as f:
                        json.dump({"meta": meta, "cells": rows}, f, indent=1)
    print("\n| dir | hdim | causal | seqlen | attnc | attnc direct | FA4 | cuDNN | ratio (median) | per-round range "
          "| direct ratio | host µs attnc / direct / FA4 / cuDNN | busy TFLOP/s attnc / FA4 / cuDNN | busy ratio "
          "| busy per-round range |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|---|---:|---|")
    for r in rows:
        m, hu = r["median"], r.get("host_us", {})
        print(f"| {r['dir']} | {r['hdim']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | "
              f"{m.get('attnc', '-')} | {m.get('attnc_direct', '-')} | {m.get('fa4', '-')} | {m.get('cudnn', '-')} | "
              f"{r.get('ratio', '-')} | {r.get('ratio_range', '-')} | {r.get('ratio_direct', '-')} | "
              f"{' / '.join(str(hu.get(n, '-')) for n in ('attnc', 'attnc_direct', 'fa4', 'cudnn'))} | "
              f"{' / '.join(str(r.get('busy', {}).get(n, {}).get('tflops', '-')) for n in ('attnc', 'fa4', 'cudnn'))} | "
              f"{r.get('ratio_busy', '-')} | {r.get('ratio_busy_range', '-')} |")
    print_kernel_table(rows)

if __name__ == "__main__":
    main()
