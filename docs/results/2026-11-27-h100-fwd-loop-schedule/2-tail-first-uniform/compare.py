"""Each tune over the mean of the two default runs (prefill suite), same binary, same command;
the tile each ran (from its receipt) where it is not the default's."""
import json


def load(path):
    out = {}
    for r in json.load(open(path))["prefill"]:
        tiles = r["receipt"].split(" tiles")[0].split("; ")[-1]
        out[(r["head_dim"][0], r["causal"], r["seqlen"])] = (r["tflops"], tiles)
    return out


runs = {v: [load(f"fwd_{v}_{i}.json"), load(f"fwd_{v}_{i + 4}.json")]
        for v, i in [("def", 1), ("tf3", 2), ("uf", 3), ("stf3", 4)]}
print("| d | causal | seqlen | default (2 runs) | tf3 ÷ default | uf ÷ default | stf3 ÷ default |")
print("|---|---|---:|---|---|---|---|")
for k in runs["def"][0]:
    d = runs["def"]
    m = (d[0][k][0] + d[1][k][0]) / 2
    cells = []
    for v in ["tf3", "uf", "stf3"]:
        a, b = runs[v][0][k], runs[v][1][k]
        note = "" if a[1] == d[0][k][1] else f" ({a[1]})"
        cells.append(f"{a[0] / m:.3f} / {b[0] / m:.3f}{note}")
    print(f"| {k[0]} | {k[1]} | {k[2]} | {d[0][k][0]:.0f} / {d[1][k][0]:.0f} | " + " | ".join(cells) + " |")
