#!/bin/bash
# Decode twin ring depth: the decode suite with ATTNC_HOPPER_TUNE= (def, 2 stages),
# stages=3 and stages=4, two rounds each, same binary (the kernels of c251b38).
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/w58d; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
ROUNDS=2 timeout 400 $D/run.sh bash scripts/dev/ab_tune.sh decode $W 'def=' 'st3=ATTNC_HOPPER_TUNE=stages=3' 'st4=ATTNC_HOPPER_TUNE=stages=4'
cat $W/device.txt
python3 - $W <<'PY'
import json, glob, os, sys, collections
W = sys.argv[1]
runs = collections.defaultdict(list)
for p in sorted(glob.glob(os.path.join(W, "decode_*_*.json"))):
    label = os.path.basename(p)[len("decode_"):].rsplit("_", 1)[0]
    runs[label].append({(d["batch"], d["seqlen_k"], d["page_size"]): d for d in json.load(open(p))["decode"]})
print("batch seqlen_k page | " + " | ".join(f"{l} gpu_us / time_us" for l in runs))
for key in runs["def"][0]:
    cells = []
    for l, rs in runs.items():
        vals = [r[key] for r in rs if key in r and r[key].get("gpu_time")]
        cells.append(" ".join(f"{1e3*v['gpu_time']['median_ms']:.1f}/{1e3*v['time']['median_ms']:.1f}{'' if v['ok'] else '!'}" for v in vals))
    print(*key, "|", " | ".join(cells))
PY
