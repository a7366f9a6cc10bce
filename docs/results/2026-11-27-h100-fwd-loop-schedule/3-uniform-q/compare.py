"""uniform_q=1 over the mean of the two default runs (prefill suite), same binary, same command."""
import json


def load(path):
    return {(r["head_dim"][0], r["causal"], r["seqlen"]): r["tflops"] for r in json.load(open(path))["prefill"]}


base = [load("fwd_def_1.json"), load("fwd_def_3.json")]
uq = [load("fwd_uq_2.json"), load("fwd_uq_4.json")]
print("| d | causal | seqlen | default (2 runs) | uniform_q (2 runs) | uniform_q ÷ mean default |")
print("|---|---|---:|---|---|---|")
for k in base[0]:
    m = (base[0][k] + base[1][k]) / 2
    print(f"| {k[0]} | {k[1]} | {k[2]} | {base[0][k]:.0f} / {base[1][k]:.0f} | {uq[0][k]:.0f} / {uq[1][k]:.0f} | "
          f"{uq[0][k] / m:.3f} / {uq[1][k] / m:.3f} |")
