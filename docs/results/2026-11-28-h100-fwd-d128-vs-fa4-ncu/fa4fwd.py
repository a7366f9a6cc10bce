# FA4's SM90 forward, bf16: python3 fa4fwd.py BATCH SEQLEN HEAD_DIM CAUSAL(0/1) HEADS.
import sys
import torch
from flash_attn.cute import flash_attn_func

b, s, d, causal, h = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
torch.manual_seed(0)
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    out = flash_attn_func(q, k, v, causal=causal)
torch.cuda.synchronize()
print("done", (out[0] if isinstance(out, tuple) else out).shape)
