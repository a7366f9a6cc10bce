"""Context parallelism on several GPUs: every strategy and layout against the same variant
on one GPU (forward O, dQ, dK, dV). Run with

    torchrun --nproc_per_node=2 python/tests/cp_check.py OUT.json

Each rank builds the whole inputs from one seed, computes the single-GPU result on its own
device, and compares its shard of the context-parallel result with that result's shard.
"""

import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

import attnc
from attnc.cp import context_parallel_attention, shard_sequence, shard_varlen

EX = pathlib.Path(__file__).resolve().parents[2] / "dsl-examples"


def rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main(out):
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    results = []
    seqlen, batch = int(os.environ.get("CP_SEQLEN", "8192")), 1
    for name in ["causal", "sliding_window", "document_mask", "grok_softcap"]:
        attn = attnc.load(EX / f"{name}.attn")
        h, hkv, d = attn.spec["q_heads"], attn.spec["kv_heads"], attn.spec["head_dim_qk"]
        g = torch.Generator(device=dev).manual_seed(7)
        q = torch.randn(batch, seqlen, h, d, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(batch, seqlen, hkv, d, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(batch, seqlen, hkv, d, device=dev, dtype=torch.bfloat16, generator=g)
        do = torch.randn(batch, seqlen, h, d, device=dev, dtype=torch.bfloat16, generator=g)
        aux = None
        if name == "document_mask":
            lengths = [300, 1200, 77, 900, 1619]
            ids = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)])
            ids = torch.cat([ids, torch.full((seqlen - len(ids),), len(lengths), dtype=torch.int32)])[:seqlen]
            aux = {"doc": ids.view(1, seqlen).to(dev)}
        # One GPU.
        qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
        of = attn(qf, kf, vf, aux=aux)
        of.backward(do)
        for strategy in ["ring", "allgather"]:
            for layout in ["zigzag", "contiguous"]:
                qs, ks, vs = (shard_sequence(t, rank, world, layout).clone().requires_grad_() for t in (q, k, v))
                dos = shard_sequence(do, rank, world, layout)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                o = context_parallel_attention(attn, qs, ks, vs, strategy=strategy, layout=layout, aux=aux)
                o.backward(dos)
                torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) * 1e3
                errs = {
                    "o": rel(o, shard_sequence(of, rank, world, layout)),
                    "dq": rel(qs.grad, shard_sequence(qf.grad, rank, world, layout)),
                    "dk": rel(ks.grad, shard_sequence(kf.grad, rank, world, layout)),
                    "dv": rel(vs.grad, shard_sequence(vf.grad, rank, world, layout)),
                }
                ok = all(e < 2e-2 for e in errs.values())
                row = {"variant": name, "strategy": strategy, "layout": layout, "rank": rank, "world": world,
                       "seqlen": seqlen, "ok": ok, "rel_l2": errs, "first_call_ms": ms,
                       "pairs": dict(attnc.cp.last_stats) if strategy == "ring" else None}
                results.append(row)
                print(("PASS" if ok else "FAIL"), json.dumps(row), flush=True)
    # Varlen: four sequences of uneven lengths (one of 3 tokens, shorter than the chunk
    # count), each cut into the layout's chunks on its own (ring).
    attn = attnc.load(EX / "varlen_causal.attn")
    h, hkv, d = attn.spec["q_heads"], attn.spec["kv_heads"], attn.spec["head_dim_qk"]
    cu = torch.tensor([0, 1021, 1024, 5118, 8190], dtype=torch.int32)
    total = int(cu[-1])
    g = torch.Generator(device=dev).manual_seed(11)
    q = torch.randn(total, h, d, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(total, hkv, d, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(total, hkv, d, device=dev, dtype=torch.bfloat16, generator=g)
    do = torch.randn(total, h, d, device=dev, dtype=torch.bfloat16, generator=g)
    qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
    attn(qf, kf, vf, cu_seqlens_q=cu, cu_seqlens_k=cu).backward(do)
    for layout in ["zigzag", "contiguous"]:
        qs, ks, vs = (shard_varlen(t, cu, rank, world, layout).clone().requires_grad_() for t in (q, k, v))
        o = context_parallel_attention(attn, qs, ks, vs, strategy="ring", layout=layout, cu_seqlens=cu)
        o.backward(shard_varlen(do, cu, rank, world, layout))
        errs = {
            "o": rel(o, shard_varlen(attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu), cu, rank, world, layout)),
            "dq": rel(qs.grad, shard_varlen(qf.grad, cu, rank, world, layout)),
            "dk": rel(ks.grad, shard_varlen(kf.grad, cu, rank, world, layout)),
            "dv": rel(vs.grad, shard_varlen(vf.grad, cu, rank, world, layout)),
        }
        ok = all(e < 2e-2 for e in errs.values())
        row = {"variant": "varlen_causal", "strategy": "ring", "layout": layout, "rank": rank, "world": world,
               "seqlen": total, "cu_seqlens": cu.tolist(), "ok": ok, "rel_l2": errs, "pairs": dict(attnc.cp.last_stats)}
        results.append(row)
        print(("PASS" if ok else "FAIL"), json.dumps(row), flush=True)
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        rows = [r for part in gathered for r in part]
        with open(out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "rows": rows}, f,
                      indent=1)
        bad = [r for r in rows if not r["ok"]]
        print(f"{len(rows) - len(bad)} passed, {len(bad)} failed")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cp_check.json")
