#!/bin/bash
# ncu of the hopper forward, d64 non-causal, b8 x 4k x 32 heads: the default grid and the
# persistent one (ATTNC_HOPPER_TUNE=persistent=1), same binary: duration, issue, stalls.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w62; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
NCU=/usr/local/cuda/bin/ncu
for v in def pers; do
  T=""; [ $v = pers ] && T="persistent=1"
  ATTNC_HOPPER_TUNE=$T timeout 200 $R $NCU --set full --import-source no -k regex:hopper_fwd$ -s 2 -c 1 -o $W/ncu_$v \
    attnc bench $D/nc64.attn --batch 8 --seqlen 4096 --iters 3 > $W/ncu_$v.log 2>&1
  echo "$v rc $?"
  $NCU --import $W/ncu_$v.ncu-rep --page details --csv > $W/details_$v.csv 2>/dev/null
  rm -f $W/ncu_$v.ncu-rep
done
python3 - $W <<'PY'
import csv, sys
W = sys.argv[1]
want = ["Duration", "Executed Instructions", "Issue Slots Busy", "Achieved Occupancy", "Registers Per Thread",
        "Grid Size", "L2 Hit Rate", "DRAM Throughput", "Memory Throughput", "No Eligible", "Warp Cycles Per Issued Instruction",
        "Compute (SM) Throughput", "Block Limit Registers", "Waves Per SM", "L1/TEX Hit Rate", "Max Bandwidth"]
rows = {}
for v in ("def", "pers"):
    for r in csv.DictReader(open(f"{W}/details_{v}.csv")):
        n = r.get("Metric Name", "")
        if any(w in n for w in want):
            rows.setdefault(n, {})[v] = r.get("Metric Value", "") + " " + r.get("Metric Unit", "")
for n, d in rows.items():
    print(f"{n:45s} {d.get('def',''):>20s} {d.get('pers',''):>20s}")
PY
