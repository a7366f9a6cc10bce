#!/bin/bash
# ncu of the hopper forward, d64 non-causal, b2 x 16k x 32 heads (the persistent forward's
# worst cell): the default grid against persistent=1 (the dynamic tile scheduler), same
# binary: duration, issue, memory, and every warp-stall reason.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w69; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
NCU=/usr/local/cuda/bin/ncu
for v in def pers; do
  T=""; [ $v = pers ] && T="persistent=1"
  ATTNC_HOPPER_TUNE=$T timeout 200 $R $NCU --set full --import-source no -k regex:hopper_fwd$ -s 2 -c 1 -o $W/ncu_$v \
    attnc bench $D/nc64.attn --batch 2 --seqlen 16384 --iters 3 > $W/ncu_$v.log 2>&1
  echo "$v rc $? $(date -u)" >> $W/device.txt
  $NCU --import $W/ncu_$v.ncu-rep --page details --csv > $W/details_$v.csv 2>/dev/null
  $NCU --import $W/ncu_$v.ncu-rep --page raw --csv > $W/raw_$v.csv 2>/dev/null
  rm -f $W/ncu_$v.ncu-rep
done
for v in def pers; do ATTNC_HOPPER_TUNE=$([ $v = pers ] && echo persistent=1) timeout 60 $R attnc bench $D/nc64.attn --batch 2 --seqlen 16384 > $W/bench_$v.txt 2>&1; done
cat $W/device.txt; grep -h -i 'tflop\|ms' $W/bench_*.txt | head -6
python3 - $W <<'PY'
import csv, sys
W = sys.argv[1]
want = ["Duration", "Executed Instructions", "Issue Slots Busy", "Achieved Occupancy", "Registers Per Thread",
        "Grid Size", "L2 Hit Rate", "DRAM Throughput", "Memory Throughput", "No Eligible", "Warp Cycles Per Issued Instruction",
        "Compute (SM) Throughput", "Waves Per SM", "L1/TEX Hit Rate", "Max Bandwidth", "SM Busy", "Executed Ipc Active"]
rows = {}
for v in ("def", "pers"):
    for r in csv.DictReader(open(f"{W}/details_{v}.csv")):
        n = r.get("Metric Name", "")
        if any(w in n for w in want):
            rows.setdefault(n, {})[v] = r.get("Metric Value", "") + " " + r.get("Metric Unit", "")
for n, d in rows.items():
    print(f"{n:45s} {d.get('def',''):>20s} {d.get('pers',''):>20s}")
raw = {}
for v in ("def", "pers"):
    rd = list(csv.reader(open(f"{W}/raw_{v}.csv")))
    if len(rd) < 3: continue
    hdr, vals = rd[0], rd[2]
    for h, x in zip(hdr, vals):
        if ("warp_latency_issue_stalled" in h or "warps_issue_stalled" in h) and h.endswith(".ratio") or "lts__t_sector_hit_rate" in h or "dram__bytes_read.sum" in h:
            raw.setdefault(h, {})[v] = x
for h, d in sorted(raw.items()):
    try:
        if max(float(d.get('def','0').replace(',','') or 0), float(d.get('pers','0').replace(',','') or 0)) < 0.05: continue
    except ValueError: pass
    print(f"{h:75s} {d.get('def',''):>14s} {d.get('pers',''):>14s}")
PY
