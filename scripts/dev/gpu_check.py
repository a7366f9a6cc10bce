#!/usr/bin/env python3
"""Dev check of generated kernels on a GPU, independent of attnc's Rust runtime.

Reads the cases written by `cargo run -p attnc-lower --example gpu_cases -- DIR`,
builds the physical tensors of each case's layout (contiguous, varlen, paged with a
shuffled page pool) with PyTorch, poisons the outputs with NaN, launches the PTX through
CuPy following the kernel ABI in case.json, and compares O and LSE with the f64
reference executor's results: bf16/fp16 relative L2 error <= 1e-2, no NaN/Inf where a
value is defined, LSE within 1e-3 relative. Writes a JSON summary.

Usage: python3 gpu_check.py CASES_DIR OUT_JSON
"""
import json
import math
import os
import sys
import time

import cupy as cp
import numpy as np
import torch


def ceil_div(a, b):
    return (a + b - 1) // b


def run_case(cdir, modules):
    meta = json.load(open(os.path.join(cdir, "case.json")))
    dt = torch.bfloat16 if meta["dtype"] == "bf16" else torch.float16
    dqk, dv, hq, hkv = meta["d_qk"], meta["d_v"], meta["q_heads"], meta["kv_heads"]
    seqlens = meta["seqlens"]
    B = len(seqlens)
    raw16 = np.fromfile(os.path.join(cdir, "inputs.bin"), dtype=np.uint16)
    if meta["dtype"] == "bf16":
        raw = (raw16.astype(np.uint32) << 16).view(np.float32)
    else:
        raw = raw16.view(np.float16).astype(np.float32)
    exp = np.fromfile(os.path.join(cdir, "expected.bin"), dtype=np.float32)
    seqs, off = [], 0
    for sq, sk in seqlens:
        n = [sq * hq * dqk, sk * hkv * dqk, sk * hkv * dv]
        q = raw[off:off + n[0]].reshape(sq, hq, dqk); off += n[0]
        k = raw[off:off + n[1]].reshape(sk, hkv, dqk); off += n[1]
        v = raw[off:off + n[2]].reshape(sk, hkv, dv); off += n[2]
        seqs.append((q, k, v))
    exps, off = [], 0
    for sq, sk in seqlens:
        o = exp[off:off + sq * hq * dv].reshape(sq, hq, dv); off += sq * hq * dv
        l = exp[off:off + hq * sq].reshape(hq, sq); off += hq * sq
        exps.append((o, l))
    dev = torch.device("cuda")
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev, dt)
    layout = meta["layout"]
    max_sq = max(s[0] for s in seqlens)
    max_sk = max(s[1] for s in seqlens)
    args = {}
    keep = []
    if layout == "varlen":
        Q = t(np.concatenate([s[0] for s in seqs]))
        K = t(np.concatenate([s[1] for s in seqs]))
        V = t(np.concatenate([s[2] for s in seqs]))
        O = torch.full((Q.shape[0], hq, dv), float("nan"), device=dev, dtype=dt)
        cuq = torch.tensor(np.cumsum([0] + [s[0] for s in seqlens]), dtype=torch.int32, device=dev)
        cuk = torch.tensor(np.cumsum([0] + [s[1] for s in seqlens]), dtype=torch.int32, device=dev)
        keep += [cuq, cuk]
        args.update(cu_seqlens_q=cuq.data_ptr(), cu_seqlens_k=cuk.data_ptr())
        LSE = torch.full((hq, Q.shape[0]), float("nan"), device=dev, dtype=torch.float32)
        lse_sb, lse_sh = 0, Q.shape[0]
        qsb, ksb, vsb, osb = 0, 0, 0, 0
    else:
        assert all(s[0] == seqlens[0][0] for s in seqlens)
        Q = t(np.stack([s[0] for s in seqs]))
        O = torch.full((B, max_sq, hq, dv), float("nan"), device=dev, dtype=dt)
        LSE = torch.full((B, hq, max_sq), float("nan"), device=dev, dtype=torch.float32)
        lse_sb, lse_sh = hq * max_sq, max_sq
        qsb, osb = Q.stride(0), O.stride(0)
        if layout == "contiguous":
            assert all(s[1] == seqlens[0][1] for s in seqlens)
            K = t(np.stack([s[1] for s in seqs]))
            V = t(np.stack([s[2] for s in seqs]))
            ksb, vsb = K.stride(0), V.stride(0)
        else:
            ps = meta["page_size"]
            npages = [ceil_div(sk, ps) for _, sk in seqlens]
            total = sum(npages) + 3
            perm = np.random.default_rng(7).permutation(total)
            Kp = np.random.default_rng(8).standard_normal((total, ps, hkv, dqk)).astype(np.float32) * 100
            Vp = np.random.default_rng(9).standard_normal((total, ps, hkv, dv)).astype(np.float32) * 100
            bt = np.zeros((B, max(npages)), dtype=np.int32)
            nxt = 0
            for b, (q, k, v) in enumerate(seqs):
                sk = k.shape[0]
                for p in range(npages[b]):
                    pg = perm[nxt]; nxt += 1
                    bt[b, p] = pg
                    rows = slice(p * ps, min(sk, (p + 1) * ps))
                    n = rows.stop - rows.start
                    Kp[pg, :n] = k[rows]
                    Vp[pg, :n] = v[rows]
            K, V = t(Kp), t(Vp)
            ksb, vsb = K.stride(0), V.stride(0)
            btt = torch.from_numpy(bt).to(dev)
            su = torch.tensor([s[1] for s in seqlens], dtype=torch.int32, device=dev)
            keep += [btt, su]
            args.update(block_table=btt.data_ptr(), block_table_stride=bt.shape[1], seqused_k=su.data_ptr())
    S = meta["num_splits"]
    opart = torch.full((S, B, hq, max_sq, dv), float("nan"), device=dev, dtype=torch.float32)
    lpart = torch.full((S, B, hq, max_sq), float("nan"), device=dev, dtype=torch.float32)
    args.update(
        q=Q.data_ptr(), k=K.data_ptr(), v=V.data_ptr(), o=O.data_ptr(),
        q_stride_batch=qsb, q_stride_row=Q.stride(-3), q_stride_head=Q.stride(-2),
        k_stride_batch=ksb, k_stride_row=K.stride(-3), k_stride_head=K.stride(-2),
        v_stride_batch=vsb, v_stride_row=V.stride(-3), v_stride_head=V.stride(-2),
        o_stride_batch=osb, o_stride_row=O.stride(-3), o_stride_head=O.stride(-2),
        seqlen_q=max_sq, seqlen_k=max_sk, num_splits=S,
        lse=LSE.data_ptr(), lse_stride_batch=lse_sb, lse_stride_head=lse_sh,
        o_partial=opart.data_ptr(), lse_partial=lpart.data_ptr(),
    )
    if meta["sinks"] is not None:
        sk_t = torch.tensor(meta["sinks"], dtype=torch.float32, device=dev)
        keep.append(sk_t)
        args["sinks"] = sk_t.data_ptr()
    for a in meta["aux"]:
        elem = np.float32 if a.get("elem") == "float" else np.int32
        at = torch.tensor(np.array(a["data"], dtype=elem), device=dev)
        keep.append(at)
        args["aux_" + a["name"]] = at.data_ptr()
        for j, d in enumerate(a["dims"]):
            args[f"aux_{a['name']}_dim{j}"] = d
    for p in meta["params"]:
        args["param_" + p["name"]] = p["value"]

    mod = modules[meta["ptx"]]
    G = hq // hkv
    for kinfo in meta["kernels"]:
        fn = mod.get_function(kinfo["name"])
        if kinfo["dynamic_smem_bytes"] > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = kinfo["dynamic_smem_bytes"]
        packed = []
        for p in kinfo["params"]:
            name, ty = p.split(":")
            val = args.get(name, 0)
            packed.append({"ptr": np.uint64, "i64": np.int64, "i32": np.int32, "f32": np.float32}[ty](val))
        if kinfo["role"] == "forward":
            rows = max_sq * (G if meta["pack_gqa"] else 1)
            grid = (ceil_div(rows, kinfo["block_m"]), hkv if meta["pack_gqa"] else hq, B * S)
        else:
            if S == 1:
                continue
            grid = (ceil_div(max_sq, kinfo["block_m"]), hq, B)
        fn(grid, (kinfo["threads_per_block"], 1, 1), tuple(packed), shared_mem=kinfo["dynamic_smem_bytes"])
    torch.cuda.synchronize()

    worst, worst_lse, bad = 0.0, 0.0, 0
    qoff = 0
    for b, (sq, sk) in enumerate(seqlens):
        if layout == "varlen":
            got = O[qoff:qoff + sq].float().cpu().numpy()
            got_l = LSE[:, qoff:qoff + sq].cpu().numpy()
            qoff += sq
        else:
            got = O[b, :sq].float().cpu().numpy()
            got_l = LSE[b, :, :sq].cpu().numpy()
        eo, el = exps[b]
        bad += int((~np.isfinite(got)).sum())
        err = np.linalg.norm(got - eo) / max(np.linalg.norm(eo), 1e-30)
        worst = max(worst, float(err))
        if meta["lse"]:
            fin = np.isfinite(el)
            bad += int((np.isfinite(got_l) != fin).sum())
            if fin.any():
                le = np.abs(got_l[fin] - el[fin]) / np.maximum(np.abs(el[fin]), 1.0)
                worst_lse = max(worst_lse, float(le.max()))
    ok = worst <= 1e-2 and bad == 0 and worst_lse <= 1e-3
    return dict(case=meta["case"], rel_l2=worst, lse_err=worst_lse, nonfinite=bad, ok=ok, splits=S, seqlens=seqlens)


def main():
    cdir, out = sys.argv[1], sys.argv[2]
    index = json.load(open(os.path.join(cdir, "index.json")))
    modules = {}
    for f in os.listdir(cdir):
        if f.endswith(".ptx"):
            t0 = time.time()
            modules[f] = cp.RawModule(path=os.path.join(cdir, f))
            modules[f].get_module() if hasattr(modules[f], "get_module") else None
    results = []
    for case in index:
        try:
            r = run_case(os.path.join(cdir, case), modules)
        except Exception as e:  # report and go on
            r = dict(case=case, ok=False, error=repr(e)[:500])
        results.append(r)
        print(("PASS " if r["ok"] else "FAIL ") + json.dumps(r), flush=True)
    n_ok = sum(r["ok"] for r in results)
    print(f"{n_ok} passed, {len(results) - n_ok} failed")
    json.dump(dict(device=torch.cuda.get_device_name(), results=results), open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
