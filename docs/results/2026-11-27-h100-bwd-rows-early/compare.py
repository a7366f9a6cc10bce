"""rows_early=1 over the mean of the two default runs, same binary, same command."""
import json


def load(path):
    return {(r["head_dim"][0], r["causal"], r["deterministic"], r["seqlen"]): r["tflops"]
            for r in json.load(open(path))["backward"]}


base = [load("bwd_def_1.json"), load("bwd_def_3.json")]
early = [load("bwd_early_2.json"), load("bwd_early_4.json")]
print("| d | causal | det | seqlen | default (2 runs) | rows_early (2 runs) | rows_early ÷ mean default |")
print("|---|---|---|---:|---|---|---|")
for k in base[0]:
    m = (base[0][k] + base[1][k]) / 2
    print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {base[0][k]:.0f} / {base[1][k]:.0f} | "
          f"{early[0][k]:.0f} / {early[1][k]:.0f} | {early[0][k] / m:.3f} / {early[1][k] / m:.3f} |")
