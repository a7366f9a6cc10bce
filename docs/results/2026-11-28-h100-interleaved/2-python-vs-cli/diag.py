"""attnc through the Python package vs the same kernels' CLI numbers: which part of the
call differs (stream, autograd, the launch). Receipts printed."""
import json, statistics, sys
sys.path.insert(0, "scripts/dev")
import torch
import attnc
import attnc.torch as at
from interleaved import bench_ms, spec_text

DT = torch.bfloat16
cells = [("fwd", 64, False, 8192), ("fwd", 128, False, 8192), ("fwd", 128, True, 16384),
         ("bwd", 128, False, 8192), ("bwd", 64, True, 16384), ("bwd", 128, False, 1024)]
out = []
side = torch.cuda.Stream()
for d, hd, causal, s in cells:
    b, h = 32768 // s, 2048 // hd
    fl = 4 * b * h * s * s * hd / (2 if causal else 1) * (2.5 if d == "bwd" else 1)
    attn = attnc.compile(spec_text(hd, h, causal))
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, hd, device="cuda", dtype=DT, requires_grad=(d == "bwd")) for _ in range(3))
    row = {"dir": d, "hdim": hd, "causal": causal, "seqlen": s}
    def tf(fn, stream=None):
        res = []
        for _ in range(3):
            if stream is None:
                res.append(fl / bench_ms(fn) / 1e9)
            else:
                with torch.cuda.stream(stream):
                    res.append(fl / bench_ms(fn) / 1e9)
        return [round(x, 1) for x in res]
    if d == "fwd":
        with torch.no_grad():
            row["call_default_stream"] = tf(lambda: attn(q, k, v))
            row["call_side_stream"] = tf(lambda: attn(q, k, v), side)
    else:
        o = attn(q, k, v)
        g = torch.randn_like(o)
        row["autograd_default_stream"] = tf(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
        with torch.no_grad():
            o2, lse = at.attention(attn, q.detach(), k.detach(), v.detach(), return_lse=True)
        kern = attn.kernel(0)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        direct = lambda: kern.backward(qd, kd, vd, o2, lse, g, dq, dk, dv, at._stream(qd), {"deterministic": False})
        row["direct_default_stream"] = tf(direct)
        direct_side = lambda: kern.backward(qd, kd, vd, o2, lse, g, dq, dk, dv, side.cuda_stream, {"deterministic": False})
        row["direct_side_stream"] = tf(direct_side, side)
    row["receipt"] = attn.receipt_text()
    out.append(row)
    print(json.dumps(row), flush=True)
    del q, k, v
    torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
