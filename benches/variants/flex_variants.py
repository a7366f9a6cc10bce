#!/usr/bin/env python3
"""The variant bench's peer: FlexAttention (torch.compile(flex_attention) with a BlockMask)
on the variants of this folder, and the aux tensors both sides read.

  python3 flex_variants.py write-aux DIR     # doc.bin, start.bin, layout.bin (raw i32)
  python3 flex_variants.py time DIR OUT.json # FlexAttention forward per variant

Shape: bf16, d128, 16 heads, batch 4, seqlen 8192 (the block-sparsity issue's). Documents
are 256-2816 tokens (seeded); `tag` is one of 4 per token (no block structure); `layout`
is a 16 x 512 x 512 block table with the diagonal and ~15% of the other blocks on;
`prefix` is 128. `attnc bench FILE --aux NAME=DIR/NAME.bin`
reads the same files, so both sides mask the same pairs.
"""

import array
import json
import os
import random
import sys

B, H, S, D = 4, 16, 8192, 128
PREFIX = 128
TABLE = 512


def make_aux():
    """Row-major i32 arrays (array('i')) with their shapes."""
    rng = random.Random(2026)
    doc, start = array.array("i"), array.array("i")
    for _ in range(B):
        pos, ident = 0, 0
        while pos < S:
            n = min(rng.randint(256, 2816), S - pos)
            doc.extend([ident] * n)
            start.extend([pos] * n)
            pos += n
            ident += 1
    tag = array.array("i", (rng.randrange(4) for _ in range(B * S)))
    layout = array.array("i", (1 if rng.random() < 0.15 else 0 for _ in range(H * TABLE * TABLE)))
    for h in range(H):
        for i in range(TABLE):
            layout[(h * TABLE + i) * TABLE + i] = 1
    return {
        "doc": (doc, (B, S)),
        "start": (start, (B, S)),
        "tag": (tag, (B, S)),
        "layout": (layout, (H, TABLE, TABLE)),
    }


def write_aux(d):
    os.makedirs(d, exist_ok=True)
    assert sys.byteorder == "little"
    for name, (a, shape) in make_aux().items():
        with open(os.path.join(d, name + ".bin"), "wb") as f:
            a.tofile(f)
        print(f"{name}: {shape} -> {d}/{name}.bin")


def time_flex(d, out):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.config.recompile_limit = 64
    # The backward is timed by differentiating one forward's graph repeatedly.
    torch._functorch.config.donated_buffer = False
    dev = "cuda"
    aux = {k: torch.tensor(a, dtype=torch.int32).reshape(shape).to(dev) for k, (a, shape) in make_aux().items()}
    doc, start, tag, layout = aux["doc"], aux["start"], aux["tag"], aux["layout"]

    def causal(b, h, q, k):
        return q >= k

    def sliding(b, h, q, k):
        return (q >= k) & (q - k <= 4096)

    def document(b, h, q, k):
        return (q >= k) & (doc[b, q] == doc[b, k])

    def document_prefix(b, h, q, k):
        return (doc[b, q] == doc[b, k]) & ((k <= q) | (k < start[b, k] + PREFIX))

    def scattered(b, h, q, k):
        return tag[b, q] == tag[b, k]

    def block_table(b, h, q, k):
        return layout[h, q // 128, k // 128] != 0

    def softcap(score, b, h, q, k):
        return 50.0 * torch.tanh(score / 50.0)

    def alibi(score, b, h, q, k):
        slope = torch.exp2(-8.0 * (h + 1).to(torch.float32) / H)
        return score - slope * (q - k).abs().to(torch.float32)

    variants = {
        "causal_16h": causal,
        "sliding_window_16h": sliding,
        "document_mask_16h": document,
        "document_prefix": document_prefix,
        "block_sparse_table": block_table,
        "scattered_mask": scattered,
        "softcap_16h": causal,
        "alibi_16h": causal,
    }
    # Score mods (`softcap_16h.attn`: causal, softcap(score, 50); `alibi_16h.attn`: causal,
    # ALiBi slopes 2^(-8 (h + 1) / heads)).
    score_mods = {"softcap_16h": softcap, "alibi_16h": alibi}
    flex = torch.compile(flex_attention)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, generator=g)

    def timed(fn, warmup=5, iters=25):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(iters):
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        ts.sort()
        return {"median_ms": ts[len(ts) // 2], "min_ms": ts[0], "max_ms": ts[-1]}

    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "shape": [B, H, S, D]}
    for name, mod in variants.items():
        heads = H if name == "block_sparse_table" else None
        bm = create_block_mask(mod, B, heads, S, S, device=dev)
        build = timed(lambda: create_block_mask(mod, B, heads, S, S, device=dev), warmup=2, iters=5)
        sm = score_mods.get(name)
        fwd = timed(lambda: flex(q, k, v, block_mask=bm, score_mod=sm))
        # The backward alone: the graph of one forward, differentiated repeatedly.
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        y = flex(qg, kg, vg, block_mask=bm, score_mod=sm)
        dy = torch.randn_like(y)
        bwd = timed(lambda: torch.autograd.grad(y, (qg, kg, vg), dy, retain_graph=True))
        del y
        dense = bm.to_dense()
        live = float(dense.float().mean())
        results[name] = {
            "forward": fwd,
            "backward": bwd,
            "create_block_mask": build,
            "block_density": live,
            "sparsity": bm.sparsity(),
        }
        print(f"{name}: flex forward {fwd['median_ms']:.4f} ms, backward {bwd['median_ms']:.4f} ms, "
              f"create_block_mask {build['median_ms']:.3f} ms, {100 * live:.1f}% blocks live")
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write-aux":
        write_aux(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "time":
        time_flex(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
