#!/bin/bash
# ncu profile of the hopper backward main kernel at d128 and d64 (one launch each)
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/wp; mkdir -p $W
NCU=/usr/local/cuda/bin/ncu
for d in 128 64; do
  $R $NCU --set full --import-source no -k regex:hopper_bwd\$ -s 2 -c 1 -o $W/bwd_d$d attnc bench $D/t$d.attn --batch 2 --seqlen 8192 --iters 3 > $W/ncu_d$d.log 2>&1
  $NCU --import $W/bwd_d$d.ncu-rep --page details --csv > $W/details_d$d.csv 2>&1
  $NCU --import $W/bwd_d$d.ncu-rep --page source --csv --print-source sass > $W/sass_d$d.csv 2>&1
done
ls -la $W; tail -5 $W/ncu_d128.log
tar cJf $OUT/prof.txz -C $W .
