# FA4's SM90 backward at d128, b4 x 8k x 16 heads, non-causal: a few iterations for ncu.
import torch
from flash_attn.cute import flash_attn_func

torch.manual_seed(0)
b, s, h, d = 4, 8192, 16, 128
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = flash_attn_func(q, k, v, causal=False)
o = out[0] if isinstance(out, tuple) else out
g = torch.randn_like(o)
for _ in range(3):
    torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
torch.cuda.synchronize()
print("done", o.shape)
