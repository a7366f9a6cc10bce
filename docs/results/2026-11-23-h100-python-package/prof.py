import cProfile, pstats, time, torch, attnc
from attnc._tensors import describe_torch
dec = attnc.compile("attention decode {\n dtype bf16\n head_dim 128\n heads 32 kv 8\n}\n", "decode.attn")
dev = torch.device("cuda")
q = torch.randn(1, 1, 32, 128, device=dev, dtype=torch.bfloat16)
k = torch.randn(1, 256, 8, 128, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
o = torch.empty_like(q)
def t(fn, n=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter(); torch.cuda.synchronize(); return (t1 - t0) / n * 1e6
kern = dec.kernel(0)
d = [describe_torch(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("o", o))]
s = torch.cuda.current_stream().cuda_stream
print("full call", t(lambda: dec(q, k, v)))
print("rust forward, descriptors ready", t(lambda: kern.forward(d[0], d[1], d[2], d[3], None, s, None)))
print("rust forward, splits=1", t(lambda: kern.forward(d[0], d[1], d[2], d[3], None, s, {"splits": 1})))
print("describe x4", t(lambda: [describe_torch(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("o", o))]))
print("current_stream", t(lambda: torch.cuda.current_stream(q.device).cuda_stream))
print(dec.receipt_text())
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): dec(q, k, v)
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
