#!/bin/bash
# Gather window (page-1 / odd-page paged KV): each lane's pages of a window of the ring's
# tiles read together (64-key tiles: the decode twin). Selftest of the paged specs with the
# new binary, then the decode suite, old (st90 kernels) vs new, alternating, three rounds.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w91; mkdir -p $W; rm -f /tmp/attnc/attnc /tmp/attnc_old/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 200 $R attnc selftest --json $W/sel.json $D/specs/decode_p1.attn $D/specs/decode_p3.attn tests/gpu-specs/paged_page1_d64.attn dsl-examples/gqa_decode_paged.attn > $W/sel.txt 2>&1
echo "selftest rc $? $(date -u)" >> $W/device.txt; tail -n 2 $W/sel.txt; grep FAIL $W/sel.txt | head -3
for round in 1 2 3; do
  order="old new"; [ $round = 2 ] && order="new old"
  for b in $order; do
    X=""; [ $b = old ] && X=old
    timeout 90 $R $X attnc bench --suites decode --json $W/decode_${b}_$round.json > $W/decode_${b}_$round.txt 2>&1
    echo "$b round $round rc $? $(date -u)" >> $W/device.txt
  done
done
cat $W/device.txt
python3 - $W <<'PY'
import json, glob, os, sys, collections
W = sys.argv[1]
runs = collections.defaultdict(list)
for p in sorted(glob.glob(os.path.join(W, "decode_*_*.json"))):
    label = os.path.basename(p).split("_")[1]
    runs[label].append({(d["batch"], d["seqlen_k"], d["page_size"]): d for d in json.load(open(p))["decode"]})
print("batch seqlen_k page | " + " | ".join(f"{l} gpu_us/time_us" for l in runs))
for key in runs["old"][0]:
    cells = []
    for l, rs in runs.items():
        vals = [r[key] for r in rs if key in r and r[key].get("gpu_time")]
        cells.append(" ".join(f"{1e3*v['gpu_time']['median_ms']:.1f}/{1e3*v['time']['median_ms']:.1f}{'' if v['ok'] else '!'}" for v in vals))
    print(*key, "|", " | ".join(cells))
PY
