# FA4's SM90 backward, causal, b4 x 8k, hidden 2048 (heads = 2048 / d): a few iterations for ncu.
#   python3 fa4prof.py D
import sys

import torch
from flash_attn.cute import flash_attn_func

torch.manual_seed(0)
d = int(sys.argv[1])
b, s, h = 4, 8192, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = flash_attn_func(q, k, v, causal=True)
o = out[0] if isinstance(out, tuple) else out
g = torch.randn_like(o)
for _ in range(3):
    torch.autograd.grad(o, (q, k, v), g, retain_graph=True)
torch.cuda.synchronize()
print("done", o.shape)
