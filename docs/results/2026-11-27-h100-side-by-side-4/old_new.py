"""Backward old (beff097, the session's start) vs new (the side-by-side's binary), same command."""
import json


def load(path):
    return {(r["head_dim"][0], r["causal"], r["deterministic"], r["seqlen"]): r["tflops"]
            for r in json.load(open(path))["backward"]}


old = [load("bwd_old_1.json"), load("bwd_old_2.json")]
new = [load("attnc_bench.json"), load("bwd_new_2.json")]
print("| d | causal | det | seqlen | old (2 runs) | new (2 runs) | new ÷ mean old |")
print("|---|---|---|---:|---|---|---|")
for k in old[0]:
    base = (old[0][k] + old[1][k]) / 2
    print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {old[0][k]:.0f} / {old[1][k]:.0f} | "
          f"{new[0][k]:.0f} / {new[1][k]:.0f} | {new[0][k] / base:.3f} / {new[1][k] / base:.3f} |")
