#!/bin/bash
# ncu of FA4's SM90 backward kernels and attnc's backward main kernel at the same d64 shape
# (b4 x 8k x 32 heads, non-causal), after the three staging calls (anchC0..2).
D=$(cd "$(dirname "$0")" && pwd)
OUTD=/tmp/wfp; mkdir -p $OUTD /tmp/attnc
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUTD/device.txt
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
NCU=/usr/local/cuda/bin/ncu
timeout 300 $NCU --set full --import-source no -k 'regex:(?i)bwd|backward' -c 4 -o $OUTD/fa4_bwd python3 $D/fa4prof.py > $OUTD/ncu_fa4.log 2>&1
$NCU --import $OUTD/fa4_bwd.ncu-rep --page details --csv > $OUTD/fa4_details.csv 2>&1
$NCU --import $OUTD/fa4_bwd.ncu-rep --page source --csv --print-source sass > $OUTD/fa4_sass.csv 2>&1
xz -dc $D/attnc.xz > /tmp/attnc/attnc; xz -dc $D/ptxas.xz > /tmp/attnc/ptxas; chmod +x /tmp/attnc/attnc /tmp/attnc/ptxas
ATTNC_PTXAS=/tmp/attnc/ptxas timeout 200 $NCU --set full --import-source no -k 'regex:hopper_bwd$' -s 2 -c 1 -o $OUTD/attnc_bwd /tmp/attnc/attnc bench $D/t64h32.attn --batch 4 --seqlen 8192 --iters 3 > $OUTD/ncu_attnc.log 2>&1
$NCU --import $OUTD/attnc_bwd.ncu-rep --page details --csv > $OUTD/attnc_details.csv 2>&1
$NCU --import $OUTD/attnc_bwd.ncu-rep --page source --csv --print-source sass > $OUTD/attnc_sass.csv 2>&1
date -u >> $OUTD/device.txt
rm -f $OUTD/*.ncu-rep
tar cJf $OUT/prof.txz -C $OUTD .
ls -la $OUTD; tail -3 $OUTD/ncu_fa4.log
