#!/usr/bin/env python3
"""Dev timing of a generated forward kernel (contiguous layout, no params/aux) next to
PyTorch's SDPA (flash backend) on the same inputs. Not the benchmark protocol's full
matrix (that is `attnc bench`); a quick probe while tuning.

Usage: python3 gpu_perf.py PTX META_JSON OUT_JSON [SEQLENS]
   or: python3 gpu_perf.py --dir DIR OUT_JSON [SEQLENS]   (every DIR/<tag>.ptx + <tag>.json)
META_JSON holds "kernels" (KernelInfo list), "d_qk" and "spec" or "causal".
"""
import json
import os
import sys

import cupy as cp
import numpy as np
import torch


def ceil_div(a, b):
    return (a + b - 1) // b


def time_it(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


def main():
    if sys.argv[1] == "--dir":
        d, out = sys.argv[2], sys.argv[3]
        seqlens = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
        allr = []
        for f in sorted(os.listdir(d)):
            if f.endswith(".ptx"):
                tag = f[:-4]
                print("==", tag, flush=True)
                allr.append(dict(tag=tag, results=probe(os.path.join(d, f), os.path.join(d, tag + ".json"), seqlens)))
        json.dump(dict(device=torch.cuda.get_device_name(), configs=allr), open(out, "w"), indent=1)
        return
    ptx, meta_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    seqlens = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
    results = probe(ptx, meta_path, seqlens)
    json.dump(dict(device=torch.cuda.get_device_name(), results=results), open(out, "w"), indent=1)


def probe(ptx, meta_path, seqlens=None):
    meta = json.load(open(meta_path))
    kinfo = [k for k in meta["kernels"] if k["role"] == "forward"][0]
    mod = cp.RawModule(path=ptx)
    fn = mod.get_function(kinfo["name"])
    if kinfo["dynamic_smem_bytes"] > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = kinfo["dynamic_smem_bytes"]
    d = meta["d_qk"]
    causal = meta.get("causal", "causal" in meta["spec"])
    results = []
    for seqlen in seqlens or [1024, 2048, 4096, 8192, 16384]:
        batch, heads = 32768 // seqlen, 2048 // d
        q = torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn_like(q); v = torch.randn_like(q)
        o = torch.empty_like(q)
        args = dict(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
                    q_stride_batch=q.stride(0), q_stride_row=q.stride(1), q_stride_head=q.stride(2),
                    k_stride_batch=k.stride(0), k_stride_row=k.stride(1), k_stride_head=k.stride(2),
                    v_stride_batch=v.stride(0), v_stride_row=v.stride(1), v_stride_head=v.stride(2),
                    o_stride_batch=o.stride(0), o_stride_row=o.stride(1), o_stride_head=o.stride(2),
                    seqlen_q=seqlen, seqlen_k=seqlen, num_splits=1)
        packed = []
        for p in kinfo["params"]:
            name, ty = p.split(":")
            packed.append({"ptr": np.uint64, "i64": np.int64, "i32": np.int32, "f32": np.float32}[ty](args.get(name, 0)))
        grid = (ceil_div(seqlen, kinfo["block_m"]), heads, batch)
        launch = lambda: fn(grid, (kinfo["threads_per_block"], 1, 1), tuple(packed), shared_mem=kinfo["dynamic_smem_bytes"])
        ms = time_it(launch)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            ms_ref = time_it(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        err = (o.float() - ref.transpose(1, 2).float()).norm() / ref.float().norm()
        flops = 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
        r = dict(seqlen=seqlen, d=d, causal=causal, attnc_ms=ms, attnc_tflops=flops / ms / 1e9,
                 sdpa_flash_ms=ms_ref, sdpa_flash_tflops=flops / ms_ref / 1e9, rel_l2_vs_sdpa=float(err))
        print(json.dumps(r), flush=True)
        results.append(r)
    return results


if __name__ == "__main__":
    main()
