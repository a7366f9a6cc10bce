#!/bin/bash
# Softcap's cost over causal (b4 8k, 16 heads, d128): the forward under ping-pong and the
# FMA-pipe exp2 emulation, alone and together; then ncu of both forwards (pipe use).
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w73; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
V=benches/variants
for round in 1 2; do
  for cfg in def pingpong=1 emulate_pct=25 pingpong=1,emulate_pct=25 pingpong=1,emulate_pct=50; do
    T=$cfg; [ $cfg = def ] && T=""
    for v in causal_16h softcap_16h; do
      echo "== $round $cfg $v"
      ATTNC_HOPPER_TUNE=$T timeout 60 $R attnc bench $V/$v.attn --batch 4 --seqlen 8192 --json $W/b_${round}_${cfg}_$v.json 2>&1 | grep -v "^\[" | tail -2
    done
  done
done > $W/bench.txt 2>&1
echo "bench done $(date -u)" >> $W/device.txt
grep -E "^==|effective" $W/bench.txt | paste - - | awk '{print $2, $3, $4, $6, $11, $19}'
NCU=/usr/local/cuda/bin/ncu
for v in causal_16h softcap_16h; do
  timeout 150 $R $NCU --set full --import-source no -k regex:fwd -s 2 -c 1 -o $W/ncu_$v \
    attnc bench $V/$v.attn --batch 1 --seqlen 8192 --iters 3 > $W/ncu_$v.log 2>&1
  echo "ncu $v rc $? $(date -u)" >> $W/device.txt
  $NCU --import $W/ncu_$v.ncu-rep --page details --csv > $W/details_$v.csv 2>/dev/null
  $NCU --import $W/ncu_$v.ncu-rep --page raw --csv > $W/raw_$v.csv 2>/dev/null
  rm -f $W/ncu_$v.ncu-rep; gzip -9 $W/*.csv
done
cat $W/device.txt
