#!/bin/bash
# ncu --set full of attnc's backward main kernel at d64 (b4 x 8k x 32 heads) and d128
# (b4 x 8k x 16 heads), non-causal: the shapes of ../2026-11-27-h100-bwd-d64-vs-fa4-ncu/.
D=$(cd "$(dirname "$0")" && pwd)
OUTD=/tmp/wp42; mkdir -p $OUTD /tmp/attnc
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUTD/device.txt
NCU=/usr/local/cuda/bin/ncu
xz -dc $D/attnc.xz > /tmp/attnc/attnc; xz -dc $D/ptxas.xz > /tmp/attnc/ptxas; chmod +x /tmp/attnc/attnc /tmp/attnc/ptxas
for s in t64h32 t128h16; do
  ATTNC_PTXAS=/tmp/attnc/ptxas timeout 200 $NCU --set full --import-source no -k 'regex:hopper_bwd$' -s 2 -c 1 -o $OUTD/$s /tmp/attnc/attnc bench $D/$s.attn --batch 4 --seqlen 8192 --iters 3 > $OUTD/ncu_$s.log 2>&1
  $NCU --import $OUTD/$s.ncu-rep --page details --csv > $OUTD/details_$s.csv 2>&1
  $NCU --import $OUTD/$s.ncu-rep --page source --csv --print-source sass > $OUTD/sass_$s.csv 2>&1
  date -u >> $OUTD/device.txt
done
rm -f $OUTD/*.ncu-rep
tar cJf $OUT/prof.txz -C $OUTD .
ls -la $OUTD; tail -2 $OUTD/ncu_t64h32.log
