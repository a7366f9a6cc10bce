"""GPU checks of the Python package (run on a CUDA machine; writes JSON to argv[1]).

1. Forward and backward of several variants against PyTorch references in f32 (random
   inputs, odd sizes, seqlen_q != seqlen_k where the variant allows it), outputs poisoned.
2. A training step of a small transformer block: attnc vs scaled_dot_product_attention
   (causal, d128): loss and every parameter gradient.
3. torch.compile(fullgraph=True) of that step.
4. CUDA-graph capture of a forward (after one warm-up call) and its replay; two graphs
   on one capture stream, the second growing the pooled workspace.
5. Ready first: an interim portable kernel while the dispatcher's compiles, then the swap.
6. Host overhead per call with a cached kernel (1-token decode, GPU work negligible),
   next to FlashAttention-4's Python call when it is importable, in the same process.
"""

import json
import pathlib
import sys

import torch
import torch.nn.functional as F

import attnc

ROOT = pathlib.Path(__file__).resolve().parents[2]
EX = ROOT / "dsl-examples"
dev = torch.device("cuda")
results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "checks": []}


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def record(name, ok, **kw):
    results["checks"].append({"name": name, "ok": bool(ok), **kw})
    print(("PASS " if ok else "FAIL ") + name + " " + json.dumps(kw), flush=True)


def ref_attention(q, k, v, mask=None, bias=None, scale=None):
    """f32 reference on [b, s, h, d] tensors (GQA by repeat)."""
    q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    if bias is not None:
        s = s + bias
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return (torch.softmax(s, -1) @ v).transpose(1, 2)


def grads_of(fn, inputs, d_out):
    out = fn(*inputs)
    gs = torch.autograd.grad(out, inputs, d_out)
    return out, gs


def check_variant(name, attn_call, ref_call, inputs, tol_o=2e-2, tol_g=3e-2):
    inputs_a = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    inputs_r = [t.detach().clone().float().requires_grad_(t.requires_grad) for t in inputs]
    o = attn_call(*inputs_a)
    d_out = torch.randn_like(o)
    diff = [i for i, t in enumerate(inputs) if t.requires_grad]
    ga = torch.autograd.grad(o, [inputs_a[i] for i in diff], d_out)
    r = ref_call(*inputs_r)
    gr = torch.autograd.grad(r, [inputs_r[i] for i in diff], d_out.float())
    errs = {"o": rel(o, r)}
    for j, i in enumerate(diff):
        errs[f"d{i}"] = rel(ga[j], gr[j])
    ok = errs["o"] < tol_o and all(e < tol_g for k, e in errs.items() if k != "o")
    ok = ok and all(torch.isfinite(g).all().item() for g in ga)
    record(name, ok, rel_l2=errs)


def variants():
    torch.manual_seed(0)
    bf = dict(device=dev, dtype=torch.bfloat16)
    # causal, seqlen_q != seqlen_k, odd sizes (bottom-right is the spec's own alignment)
    causal = attnc.load(EX / "causal.attn")
    h, d = causal.spec["q_heads"], causal.spec["head_dim_qk"]
    q = torch.randn(2, 333, h, d, **bf, requires_grad=True)
    k = torch.randn(2, 333, h, d, **bf, requires_grad=True)
    v = torch.randn(2, 333, h, d, **bf, requires_grad=True)
    m = torch.ones(333, 333, dtype=torch.bool, device=dev).tril()
    check_variant("causal b2 s333", lambda q, k, v: causal(q, k, v), lambda q, k, v: ref_attention(q, k, v, m),
                  [q, k, v])
    record("causal receipt", causal.receipt() is not None, receipt=causal.receipt_text())
    # Views as inputs: heads-major tensors transposed (dense, permuted: O is allocated in
    # Q's layout) and slices of one packed QKV tensor (not dense: O is contiguous).
    xq, xk, xv = (torch.randn(2, h, 201, d, **bf, requires_grad=True) for _ in range(3))
    m201 = torch.ones(201, 201, dtype=torch.bool, device=dev).tril()
    check_variant("causal, inputs transposed from [b, h, s, d]",
                  lambda q, k, v: causal(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
                  lambda q, k, v: ref_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), m201),
                  [xq, xk, xv])
    qkv = torch.randn(2, 201, 3, h, d, **bf, requires_grad=True)
    check_variant("causal, inputs sliced from packed QKV",
                  lambda x: causal(x[:, :, 0], x[:, :, 1], x[:, :, 2]),
                  lambda x: ref_attention(x[:, :, 0], x[:, :, 1], x[:, :, 2], m201), [qkv])

    # document mask (GQA 32/8, aux tensor)
    doc = attnc.load(EX / "document_mask.attn")
    s = 777
    ids = torch.sort(torch.randint(0, 5, (2, s), device=dev), dim=1).values.to(torch.int32)
    q = torch.randn(2, s, 32, 128, **bf, requires_grad=True)
    k = torch.randn(2, s, 8, 128, **bf, requires_grad=True)
    v = torch.randn(2, s, 8, 128, **bf, requires_grad=True)
    mask = (ids[:, None, :, None] == ids[:, None, None, :]) & torch.ones(s, s, dtype=torch.bool, device=dev).tril()
    check_variant("document_mask b2 s777 gqa", lambda q, k, v: doc(q, k, v, aux={"doc": ids}),
                  lambda q, k, v: ref_attention(q, k, v, mask), [q, k, v])

    # learnable ALiBi slopes: d(slopes) through attnc's aux gradient
    ali = attnc.load(EX / "alibi_learned.attn")
    sq = 301
    q = torch.randn(1, sq, 16, 128, **bf, requires_grad=True)
    k = torch.randn(1, sq, 16, 128, **bf, requires_grad=True)
    v = torch.randn(1, sq, 16, 128, **bf, requires_grad=True)
    slopes = (torch.rand(16, device=dev) * 0.1).requires_grad_(True)
    pos = torch.arange(sq, device=dev)
    dist = (pos[:, None] - pos[None, :]).float()
    cm = torch.ones(sq, sq, dtype=torch.bool, device=dev).tril()
    check_variant("alibi_learned (slopes grad)", lambda q, k, v, sl: ali(q, k, v, aux={"slopes": sl}),
                  lambda q, k, v, sl: ref_attention(q, k, v, cm, bias=-sl[None, :, None, None] * dist),
                  [q, k, v, slopes])

    # varlen with CPU cu_seqlens (no host sync), an empty sequence included
    vl = attnc.load(EX / "varlen_causal.attn")
    lens_q, lens_k = [100, 0, 37], [120, 5, 37]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), 28, 128, **bf, requires_grad=True)
    k = torch.randn(sum(lens_k), 4, 128, **bf, requires_grad=True)
    v = torch.randn(sum(lens_k), 4, 128, **bf, requires_grad=True)

    def vl_ref(q, k, v):
        outs = []
        for i in range(3):
            a, b = int(cu_q[i]), int(cu_q[i + 1])
            c, e = int(cu_k[i]), int(cu_k[i + 1])
            if b == a:
                continue
            mk = torch.ones(b - a, e - c, dtype=torch.bool, device=dev).tril()  # bare `causal`: top-left
            outs.append(ref_attention(q[None, a:b], k[None, c:e], v[None, c:e], mk)[0])
        return torch.cat(outs)

    check_variant("varlen_causal (cpu cu_seqlens, empty sequence)",
                  lambda q, k, v: vl(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k), vl_ref, [q, k, v])


class Block(torch.nn.Module):
    def __init__(self, dim, heads, attn):
        super().__init__()
        self.heads, self.attn = heads, attn
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
        self.n1, self.n2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)

    def forward(self, x):
        b, s, dim = x.shape
        qkv = self.qkv(self.n1(x)).view(b, s, 3, self.heads, dim // self.heads)
        q, k, v = qkv.unbind(2)
        if self.attn is None:
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True).transpose(1, 2)
        else:
            o = self.attn(q, k, v)
        x = x + self.proj(o.reshape(b, s, dim))
        return x + self.mlp(self.n2(x))


def training_step():
    causal = attnc.load(EX / "causal.attn")
    h, d = causal.spec["q_heads"], causal.spec["head_dim_qk"]
    dim = h * d
    torch.manual_seed(1)
    ref = Block(dim, h, None).to(dev, torch.bfloat16)
    ours = Block(dim, h, causal).to(dev, torch.bfloat16)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 1024, dim, device=dev, dtype=torch.bfloat16)
    target = torch.randn_like(x)

    def step(model):
        model.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x).float(), target.float())
        loss.backward()
        return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    l_ref, g_ref = step(ref)
    l_ours, g_ours = step(ours)
    worst = max(rel(g_ours[n], g_ref[n]) for n in g_ref)
    record("training step vs SDPA (loss, grads)", abs(l_ours - l_ref) / abs(l_ref) < 1e-2 and worst < 5e-2,
           loss_ref=l_ref, loss_attnc=l_ours, worst_grad_rel_l2=worst, receipt=causal.receipt_text())

    compiled = torch.compile(ours, fullgraph=True)
    try:
        ours.zero_grad(set_to_none=True)
        loss = F.mse_loss(compiled(x).float(), target.float())
        loss.backward()
        worst_c = max(rel(p.grad, g_ref[n]) for n, p in ours.named_parameters())
        record("torch.compile(fullgraph=True) step", abs(loss.item() - l_ref) / abs(l_ref) < 1e-2 and worst_c < 5e-2,
               loss=loss.item(), worst_grad_rel_l2=worst_c)
    except Exception as e:  # noqa: BLE001 (the check reports any failure)
        record("torch.compile(fullgraph=True) step", False, error=f"{type(e).__name__}: {e}"[:2000])


def repeated_calls():
    """The same call again (same buffers: a launch-memo hit where the runtime has one),
    with new buffers, with new contents in the old buffers, and with another split count:
    each result equals a fresh reference, so nothing stale is replayed."""
    causal = attnc.load(EX / "causal.attn")
    h, d = causal.spec["q_heads"], causal.spec["head_dim_qk"]
    m = torch.ones(129, 129, dtype=torch.bool, device=dev).tril()
    q = torch.randn(2, 129, h, d, device=dev, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    errs = []
    for step in range(4):
        if step == 2:
            q.copy_(torch.randn_like(q))  # new contents, same addresses
        if step == 3:
            q, k, v = q.clone(), k.clone() * 0.5, v.clone()  # new addresses
        o = causal(q, k, v)
        errs.append(rel(o, ref_attention(q, k, v, m)))
    dec = attnc.compile("attention d {\n dtype bf16\n head_dim 128\n heads 32 kv 8\n split auto\n}\n", "d.attn")
    q1 = torch.randn(1, 1, 32, 128, device=dev, dtype=torch.bfloat16)
    k1 = torch.randn(1, 4096, 8, 128, device=dev, dtype=torch.bfloat16)
    v1 = torch.randn_like(k1)
    for splits in (None, 4, 4, None):
        o = dec(q1, k1, v1, splits=splits)
        errs.append(rel(o, ref_attention(q1, k1, v1)))
    record("repeated calls (same and new buffers, new contents, splits)", max(errs) < 2e-2, rel_l2=errs)


def captured(call):
    """``call()`` run once on a side stream (warm-up: compile, load), then captured with
    ``torch.cuda.graph`` on PyTorch's capture stream: ``(graph, captured output)``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = call()
    return g, o


def cuda_graph():
    causal = attnc.load(EX / "causal.attn")
    h, d = causal.spec["q_heads"], causal.spec["head_dim_qk"]
    q = torch.randn(2, 512, h, d, device=dev, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    try:
        g, o = captured(lambda: causal(q, k, v))
        q.copy_(torch.randn_like(q))
        g.replay()
        torch.cuda.synchronize()
        want = causal(q, k, v)
        record("CUDA graph capture + replay", rel(o, want) < 1e-6, rel_l2=rel(o, want))
    except Exception as e:  # noqa: BLE001
        record("CUDA graph capture + replay", False, error=f"{type(e).__name__}: {e}"[:2000])


def cuda_graphs_of_growing_sizes():
    """Two graphs captured one after the other on PyTorch's shared capture stream, the
    second needing a larger split-KV workspace than the first: the capture grows the
    stream's pooled workspace (no wait on the stream inside a capture), and the first graph
    still replays correctly (the outgrown workspace is kept, not freed)."""
    dec = attnc.compile("attention gd {\n dtype bf16\n head_dim 128\n heads 32 kv 8\n split auto\n}\n", "gd.attn")
    graphs = []
    try:
        for keys, splits in ((1024, 4), (32768, 128)):
            q = torch.randn(1, 1, 32, 128, device=dev, dtype=torch.bfloat16)
            k = torch.randn(1, keys, 8, 128, device=dev, dtype=torch.bfloat16)
            v = torch.randn_like(k)
            g, o = captured(lambda: dec(q, k, v, splits=splits))
            graphs.append((g, q, k, v, o))
        errs = []
        for g, q, k, v, o in graphs:
            q.copy_(torch.randn_like(q))
            g.replay()
            torch.cuda.synchronize()
            errs.append(rel(o, ref_attention(q, k, v)))
        record("CUDA graphs of growing workspace sizes on one capture stream", max(errs) < 2e-2, rel_l2=errs)
    except Exception as e:  # noqa: BLE001
        record("CUDA graphs of growing workspace sizes on one capture stream", False,
               error=f"{type(e).__name__}: {e}"[:2000])


def ready_first():
    """`ready_first=True` on a variant no cache holds: the first call runs the portable
    kernel (its receipt says so) while the dispatcher's compiles on a thread; after
    `wait_ready()` calls run the dispatcher's. Forward and gradients of both against the
    reference (the backward of the first call may already run on the new kernel)."""
    import os
    import time

    # The cache key leaves the name out: a scale of this process's own keeps it uncached.
    name = f"ready_first_{os.getpid()}"
    scale = 128**-0.5 + (time.time_ns() % 10**6) * 1e-12
    src = f"attention {name} {{\n dtype bf16\n head_dim 128\n heads 16 kv 4\n mask causal\n scale {scale!r}\n}}\n"
    q = torch.randn(2, 1000, 16, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 1000, 4, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 1000, 4, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
    m = torch.ones(1000, 1000, dtype=torch.bool, device=dev).tril()
    d_out = torch.randn(2, 1000, 16, 128, device=dev, dtype=torch.bfloat16)
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    r = ref_attention(qr, kr, vr, m, scale=scale)
    gr = torch.autograd.grad(r, (qr, kr, vr), d_out.float())
    t0 = time.perf_counter()
    attn = attnc.compile(src, f"{name}.attn", ready_first=True)
    kern = attn.kernel(torch.cuda.current_device())
    first_kernel_s = time.perf_counter() - t0
    runs = []
    for step in ("first", "after wait_ready"):
        if step != "first":
            kern.wait_ready()
        o = attn(q, k, v)
        receipt = kern.receipt_text() or ""
        ga = torch.autograd.grad(o, (q, k, v), d_out)
        backward = kern.receipt_text() or ""
        runs.append({
            "step": step,
            "forward": receipt.split(" on ")[0][-60:],
            # After the switch: the backward module the compile thread warmed ("from memory").
            "backward": backward.split(" on ")[0][-40:] + " from " + backward.rsplit(" from ", 1)[-1][:20],
            "interim": "ready first" in receipt,
            "rel_l2": [rel(o, r)] + [rel(a, b) for a, b in zip(ga, gr)],
        })
    final_s = time.perf_counter() - t0
    ok = runs[0]["interim"] and not runs[1]["interim"] and kern.family != "portable" and not kern.is_interim
    ok = ok and all(max(run["rel_l2"]) < 3e-2 for run in runs)
    record("ready first: portable while the dispatcher's kernel compiles, then it", ok, runs=runs,
           first_kernel_s=first_kernel_s, through_second_call_s=final_s, family=kern.family)


def host_us(fn):
    """Host microseconds per call of ``fn`` (its GPU work negligible): the median over
    rounds of 100 calls, each started on an idle GPU (see overhead.py)."""
    from overhead import host_us as rounds

    return rounds(fn)


def overhead():
    dec = attnc.compile("attention decode {\n dtype bf16\n head_dim 128\n heads 32 kv 8\n}\n", "decode.attn")
    q = torch.randn(1, 1, 32, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 256, 8, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = {"attnc": host_us(lambda: dec(q, k, v))}
    try:
        from flash_attn.cute import flash_attn_func

        out["fa4"] = host_us(lambda: flash_attn_func(q, k, v))
    except Exception as e:  # noqa: BLE001
        out["fa4_error"] = f"{type(e).__name__}: {e}"[:300]
    out["sdpa"] = host_us(lambda: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True))
    record("host overhead per call (us)", out["attnc"] <= 15.0, **out)


if __name__ == "__main__":
    for part in (variants, training_step, repeated_calls, cuda_graph, cuda_graphs_of_growing_sizes, ready_first,
                 overhead):
        try:
            part()
        except Exception as e:  # noqa: BLE001
            record(part.__name__, False, error=f"{type(e).__name__}: {e}"[:2000])
    results["cache"] = attnc.cache_info()
    n_ok = sum(c["ok"] for c in results["checks"])
    print(f"{n_ok} passed, {len(results['checks']) - n_ok} failed")
    if len(sys.argv) > 1:
        pathlib.Path(sys.argv[1]).write_text(json.dumps(results, indent=1, default=str))
