#!/usr/bin/env python3
"""Runs the wgmma_probe kernel (crates/attnc-lower/examples/wgmma_probe.rs) on a Hopper
GPU: S = Q·Kᵀ for one 64×64×64 bf16 tile through wgmma with 128B-swizzle descriptors,
compared with torch; with `pv` the P·V probe (O = P·V, P from registers, V MN-major).
Usage: python3 wgmma_probe.py PTX OUT_JSON [pv]"""
import json, sys
import cupy as cp
import numpy as np
import torch

ptx, out = sys.argv[1], sys.argv[2]
pv = len(sys.argv) > 3 and sys.argv[3] == "pv"
mod = cp.RawModule(path=ptx)
fn = mod.get_function("wgmma_probe")
torch.manual_seed(0)
q = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
k = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
s = torch.full((64, 64), float("nan"), device="cuda", dtype=torch.float32)
fn((1, 1, 1), (128, 1, 1), (np.uint64(q.data_ptr()), np.uint64(k.data_ptr()), np.uint64(s.data_ptr())), shared_mem=16384)
torch.cuda.synchronize()
ref = q.float() @ k.float() if pv else q.float() @ k.float().T
err = ((s - ref).norm() / ref.norm()).item()
bad = int((~torch.isfinite(s)).sum())
res = dict(device=torch.cuda.get_device_name(), probe="O = P.V (wgmma rs, MN-major V)" if pv else "S = Q.K^T (wgmma ss, K-major)", rel_l2=err, nonfinite=bad, ok=bool(err < 1e-5 and bad == 0))
if not res["ok"]:
    # Where the values went: for each output element, which reference element it matches.
    sn, rn = s.cpu().numpy(), ref.cpu().numpy()
    res["sample_got"] = sn[:2, :8].tolist()
    res["sample_ref"] = rn[:2, :8].tolist()
print(json.dumps(res))
json.dump(res, open(out, "w"), indent=1)
