"""ATTNC_ROW_KEYS=1 (causal/window masks as per-row key intervals) over the mean of the two
default runs (prefill suite), same binary, same command."""
import json


def load(path):
    return {(r["head_dim"][0], r["causal"], r["seqlen"]): (r["tflops"], r["ok"]) for r in json.load(open(path))["prefill"]}


base = [load("fwd_def_1.json"), load("fwd_def_3.json")]
rk = [load("fwd_rk_2.json"), load("fwd_rk_4.json")]
print("| d | causal | seqlen | default (2 runs) | row keys (2 runs) | row keys ÷ mean default | checks |")
print("|---|---|---:|---|---|---|---|")
for k in base[0]:
    m = (base[0][k][0] + base[1][k][0]) / 2
    ok = all(x[k][1] for x in base + rk)
    print(f"| {k[0]} | {k[1]} | {k[2]} | {base[0][k][0]:.0f} / {base[1][k][0]:.0f} | {rk[0][k][0]:.0f} / {rk[1][k][0]:.0f} | "
          f"{rk[0][k][0] / m:.3f} / {rk[1][k][0] / m:.3f} | {'ok' if ok else 'FAILED'} |")
