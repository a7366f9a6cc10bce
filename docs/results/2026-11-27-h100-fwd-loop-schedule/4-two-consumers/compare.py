"""Two consumer warpgroups (c2: ping-pong; c2p0: without) over the mean of the two default
runs (prefill suite), same binary, same command; d64 rows only (d128 already has two)."""
import json


def load(path):
    return {(r["head_dim"][0], r["causal"], r["seqlen"]): r["tflops"] for r in json.load(open(path))["prefill"]}


base = [load("fwd_def_1.json"), load("fwd_def_4.json")]
c2 = [load("fwd_c2_2.json"), load("fwd_c2_5.json")]
c2p0 = [load("fwd_c2p0_3.json"), load("fwd_c2p0_6.json")]
print("| d | causal | seqlen | default (2 runs) | c2 ÷ mean default | c2p0 ÷ mean default |")
print("|---|---|---:|---|---|---|")
for k in base[0]:
    if k[0] != 64:
        continue
    m = (base[0][k] + base[1][k]) / 2
    print(f"| {k[0]} | {k[1]} | {k[2]} | {base[0][k]:.0f} / {base[1][k]:.0f} | "
          f"{c2[0][k] / m:.3f} / {c2[1][k] / m:.3f} | {c2p0[0][k] / m:.3f} / {c2p0[1][k] / m:.3f} |")
