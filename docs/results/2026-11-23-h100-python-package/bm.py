import json, sys, torch, attnc
doc = attnc.load("dsl-examples/document_mask.attn")
out = {}
for s in (1024, 4096, 8192):
    g = torch.Generator().manual_seed(s)
    q = torch.randn(4, s, 32, 128, generator=g).cuda().bfloat16()
    k = torch.randn(4, s, 8, 128, generator=g).cuda().bfloat16()
    v = torch.randn(4, s, 8, 128, generator=g).cuda().bfloat16()
    ids = torch.sort(torch.randint(0, 4, (4, s), generator=g, dtype=torch.int32), dim=1).values.cuda()
    bm = doc.block_mask(q, k, v, aux={"doc": ids})
    o1 = doc(q, k, v, aux={"doc": ids}); r1 = doc.receipt()["block_mask"]
    o2 = doc(q, k, v, aux={"doc": ids}, block_mask=bm); r2 = doc.receipt()["block_mask"]
    def t(fn, n=20):
        for _ in range(3): fn()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(n):
            a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
        return sorted(ts)[n // 2]
    row = {"equal": bool(torch.equal(o1, o2)), "per_call": r1, "passed": r2,
           "ms_per_call_mask": t(lambda: doc(q, k, v, aux={"doc": ids})),
           "ms_block_mask_passed": t(lambda: doc(q, k, v, aux={"doc": ids}, block_mask=bm))}
    # The backward through autograd with the passed mask.
    qg = q.detach().requires_grad_(True)
    o = doc(qg, k, v, aux={"doc": ids}, block_mask=bm); o.float().sum().backward()
    row["backward_with_mask_ok"] = bool(torch.isfinite(qg.grad).all())
    out[s] = row
    print(s, json.dumps(row), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
