#!/bin/bash
# Clocks and power while the non-causal forward runs at 8k and 16k (d64, d128; 32k tokens,
# the protocol's shapes; `split auto` only so the variant bench runs no backward): does
# the 16k cell run at lower SM clocks than the 8k one?
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w75; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader; date -u; } > $W/device.txt
for d in 64 128; do $R attnc bench $D/nc$d.attn --batch 4 --seqlen 8192 --iters 5 > /dev/null 2>&1; done  # compile
for r in 1 2; do
  for cell in "128 4 8192" "128 2 16384" "64 4 8192" "64 2 16384"; do set -- $cell
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > $W/smi_d$1_$3_$r.csv &
    P=$!; sleep 0.3
    $R attnc bench $D/nc$1.attn --batch $2 --seqlen $3 --iters 150 > $W/b_d$1_$3_$r.txt 2>&1
    kill $P; sleep 2
  done
done
cat $W/device.txt
python3 - $W <<'PY'
import sys, glob, statistics as st, re
W = sys.argv[1]
for f in sorted(glob.glob(f"{W}/b_*.txt")):
    tag = f.split("/b_")[1][:-4]
    txt = open(f).read()
    m = re.search(r"([0-9.]+) effective TFLOP/s", txt)
    rows = [l.split(", ") for l in open(f"{W}/smi_{tag}.csv") if l.count(",") >= 4]
    clk = [float(r[1].split()[0]) for r in rows if r[1].split()[0].replace('.','').isdigit()]
    pw = [float(r[2].split()[0]) for r in rows if r[2].split()[0].replace('.','').isdigit()]
    thr = {}
    for r in rows: thr[r[4].strip()] = thr.get(r[4].strip(), 0) + 1
    busy = [c for c, p in zip(clk, pw) if p > 200]
    print(f"{tag:14s} {m.group(1) if m else '?':>7s} TFLOP/s  SM clock median {st.median(busy) if busy else float('nan'):.0f} MHz (min {min(busy) if busy else 0:.0f})  power median {st.median([p for p in pw if p > 200] or [0]):.0f} W  samples {len(busy)}  throttle {thr}")
PY
