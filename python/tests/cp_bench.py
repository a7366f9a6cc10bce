"""Context-parallel speed on several GPUs beside one GPU: causal attention (and a document
mask), bf16, d128, 32 heads, forward + backward. Run with

    torchrun --nproc_per_node=2 python/tests/cp_bench.py OUT.json [TOKENS ...]

Times are medians of CUDA-synchronized wall clock over the iterations after a warm-up
(which also compiles); the one-GPU baseline runs on rank 0 alone while the others wait.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import attnc
from attnc.cp import context_parallel_attention, last_stats, shard_sequence

CAUSAL = "attention cp_causal {\n dtype bf16\n head_dim 128\n heads 32\n mask causal\n}\n"
DOC = ("attention cp_doc {\n dtype bf16\n head_dim 128\n heads 32\n aux doc: int[batch, seqlen_k]\n"
       " mask causal && doc[b, q] == doc[b, k]\n}\n")


def timed(fn, iters):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main(out, sizes):
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    rows = []
    for tokens in sizes:
        iters = 3 if tokens <= 131072 else 1
        for name, src in [("causal", CAUSAL), ("document_mask", DOC)]:
            if name == "document_mask" and tokens > 131072:
                continue
            attn = attnc.compile(src, f"{name}.attn")
            g = torch.Generator(device=dev).manual_seed(1)
            shape = (1, tokens, 32, 128)
            q, k, v, do = (torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(4))
            aux = None
            if name == "document_mask":
                n = torch.Generator().manual_seed(2)
                lens = torch.randint(2048, 16384, (tokens // 2048,), generator=n)
                ids = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32), lens)[:tokens]
                ids = torch.cat([ids, torch.full((tokens - len(ids),), len(lens), dtype=torch.int32)])
                aux = {"doc": ids.view(1, tokens).to(dev)}
            flops = 4 * tokens * tokens * 128 * 32 * 0.5 * 3.5  # causal fwd + bwd (2.5x)
            row = {"variant": name, "tokens": tokens, "world": world, "device": torch.cuda.get_device_name(dev)}
            # One GPU (rank 0), if it fits.
            if rank == 0:
                try:
                    qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))

                    def one():
                        qf.grad = kf.grad = vf.grad = None
                        attn(qf, kf, vf, aux=aux).backward(do)

                    one()
                    torch.cuda.synchronize()
                    ts = []
                    for _ in range(iters):
                        t0 = time.perf_counter()
                        one()
                        torch.cuda.synchronize()
                        ts.append((time.perf_counter() - t0) * 1e3)
                    ts.sort()
                    row["one_gpu_ms"] = ts[len(ts) // 2]
                    row["one_gpu_peak_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
                    del qf, kf, vf
                except torch.OutOfMemoryError as e:
                    row["one_gpu_error"] = f"out of memory: {e}"[:200]
                torch.cuda.empty_cache()
            dist.barrier()
            for strategy in ["ring", "allgather"]:
                qs, ks, vs = (shard_sequence(t, rank, world, "zigzag").clone().requires_grad_() for t in (q, k, v))
                dos = shard_sequence(do, rank, world, "zigzag")

                def cp():
                    qs.grad = ks.grad = vs.grad = None
                    context_parallel_attention(attn, qs, ks, vs, strategy=strategy, layout="zigzag",
                                               aux=aux).backward(dos)

                try:
                    row[f"{strategy}_ms"] = timed(cp, iters)
                    if strategy == "ring":
                        # The last backward's chunk pairs on this rank: run and skipped.
                        row["ring_pairs_rank0"] = dict(last_stats)
                except torch.OutOfMemoryError as e:
                    row[f"{strategy}_error"] = f"out of memory: {e}"[:200]
                torch.cuda.empty_cache()
            if "one_gpu_ms" in row:
                for s in ["ring", "allgather"]:
                    if f"{s}_ms" in row:
                        row[f"{s}_speedup"] = row["one_gpu_ms"] / row[f"{s}_ms"]
            row["causal_tflops_per_gpu_ring"] = (flops / world / (row["ring_ms"] * 1e-3) / 1e12
                                                 if "ring_ms" in row else None)
            if rank == 0:
                rows.append(row)
                print(json.dumps(row), flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2:]] or [131072, 524288])
