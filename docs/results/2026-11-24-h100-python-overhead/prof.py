"""Host time per call, by piece (1-token decode, 256 keys: GPU work negligible)."""
import time, torch, attnc
import torch.nn.functional as F
from attnc._tensors import describe_torch
dec = attnc.compile("attention decode {\n dtype bf16\n head_dim 128\n heads 32 kv 8\n}\n", "decode.attn")
dev = torch.device("cuda")
q = torch.randn(1, 1, 32, 128, device=dev, dtype=torch.bfloat16)
k = torch.randn(1, 256, 8, 128, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
o = torch.empty_like(q)
def t(fn, n=3000):
    for _ in range(100): fn()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter(); torch.cuda.synchronize(); return round((t1 - t0) / n * 1e6, 2)
kern = dec.kernel(0)
d = [describe_torch(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("o", o))]
s = torch._C._cuda_getCurrentRawStream(0)
rows = {
  "attnc full call": t(lambda: dec(q, k, v)),
  "rust forward, descriptors ready": t(lambda: kern.forward(d[0], d[1], d[2], d[3], None, s, None)),
  "describe_torch x4": t(lambda: [describe_torch(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("o", o))]),
  "q.new_empty": t(lambda: q.new_empty((1, 1, 32, 128))),
  "torch.compiler.is_compiling": t(lambda: torch.compiler.is_compiling()),
  "raw stream": t(lambda: torch._C._cuda_getCurrentRawStream(0)),
  "sdpa": t(lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)),
}
try:
    from flash_attn.cute import flash_attn_func
    rows["fa4 flash_attn_func"] = t(lambda: flash_attn_func(q, k, v))
except Exception as e:  # noqa: BLE001
    rows["fa4 error"] = f"{type(e).__name__}: {e}"[:300]
for kk, vv in rows.items():
    print(f"{kk:40s} {vv}")
print(dec.receipt_text())
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(3000): dec(q, k, v)
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
