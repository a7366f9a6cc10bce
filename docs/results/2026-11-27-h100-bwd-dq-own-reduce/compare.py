"""dq_own_reduce=1 (and with dq_under_dk=1) over the mean of the two default runs, same
binary, same command."""
import json


def load(path):
    return {(r["head_dim"][0], r["causal"], r["deterministic"], r["seqlen"]): r["tflops"]
            for r in json.load(open(path))["backward"]}


base = [load("bwd_def_1.json"), load("bwd_def_3.json")]
own = [load("bwd_own_2.json"), load("bwd_own_4.json")]
ownk = [load("bwd_ownk_5.json"), load("bwd_ownk_6.json")]
print("| d | causal | det | seqlen | default (2 runs) | own ÷ mean default | own + dq_under_dk ÷ mean default |")
print("|---|---|---|---:|---|---|---|")
for k in base[0]:
    m = (base[0][k] + base[1][k]) / 2
    print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {base[0][k]:.0f} / {base[1][k]:.0f} | "
          f"{own[0][k] / m:.3f} / {own[1][k] / m:.3f} | {ownk[0][k] / m:.3f} / {ownk[1][k] / m:.3f} |")
