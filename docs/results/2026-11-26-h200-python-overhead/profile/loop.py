import time, torch, attnc
dec = attnc.compile("attention decode {\n dtype bf16\n head_dim 128\n heads 32 kv 8\n}\n", "decode.attn")
q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 256, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
dec(q, k, v); torch.cuda.synchronize()
t_end = time.time() + 20
n = 0
while time.time() < t_end:
    torch.cuda.synchronize()
    for _ in range(100): dec(q, k, v)
    n += 100
torch.cuda.synchronize(); print("calls", n)
