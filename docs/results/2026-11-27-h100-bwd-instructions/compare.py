"""Ratio table of this receipt: each build's TFLOP/s over the mean of the two `old` runs."""
import json



def load(path):
    return {(tuple(r["head_dim"]), r["causal"], r["deterministic"], r["seqlen"]): r["tflops"]
            for r in json.load(open(path))["backward"]}


old = [load("bwd_old_1.json"), load("bwd_old_4.json")]
new = [load("bwd_new_2.json"), load("bwd_new_5.json")]
p32 = [load("bwd_p32_3.json"), load("bwd_p32_6.json")]
print("| d | causal | det | seqlen | old TFLOP/s (2 runs) | new ÷ old | new + p_f32_for_ds ÷ old |")
print("|---|---|---|---:|---|---|---|")
for k in old[0]:
    base = (old[0][k] + old[1][k]) / 2
    print(f"| {k[0][0]} | {k[1]} | {k[2]} | {k[3]} | {old[0][k]:.0f} / {old[1][k]:.0f} | "
          f"{new[0][k] / base:.3f} / {new[1][k] / base:.3f} | {p32[0][k] / base:.3f} / {p32[1][k] / base:.3f} |")
