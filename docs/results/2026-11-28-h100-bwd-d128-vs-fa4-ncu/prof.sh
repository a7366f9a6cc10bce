#!/bin/bash
# ncu (--set full) of FA4's SM90 backward kernels and attnc's backward main kernel at the same
# d128 shape (b4 x 8k x 16 heads, non-causal), after the staging calls .device/pa, .device/pb.
D=$(cd "$(dirname "$0")" && pwd)
OUTD=/tmp/wfp; mkdir -p $OUTD /tmp/attnc /tmp/site
trap 'rm -f $OUTD/*.ncu-rep; tar cJf $OUT/prof.txz -C $OUTD .' EXIT
[ -d /tmp/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*.whl 2>&1 | tail -n 2
ls /tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu* >/dev/null 2>&1 || \
  cat /tmp/stage/cu13.tar.xz.part-aa /tmp/stage/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUTD/device.txt
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
NCU=/usr/local/cuda/bin/ncu
timeout 240 $NCU --set full --import-source no -k 'regex:(?i)bwd|backward' -c 4 -o $OUTD/fa4_bwd python3 $D/fa4prof.py > $OUTD/ncu_fa4.log 2>&1
echo "ncu fa4 rc $? $(date -u)" >> $OUTD/device.txt
$NCU --import $OUTD/fa4_bwd.ncu-rep --page details --csv > $OUTD/fa4_details.csv 2>&1
$NCU --import $OUTD/fa4_bwd.ncu-rep --page source --csv --print-source sass > $OUTD/fa4_sass.csv 2>&1
xz -dc $D/attnc.xz > /tmp/attnc/attnc; xz -dc $D/ptxas.xz > /tmp/attnc/ptxas; chmod +x /tmp/attnc/attnc /tmp/attnc/ptxas
ATTNC_PTXAS=/tmp/attnc/ptxas timeout 200 $NCU --set full --import-source no -k 'regex:hopper_bwd$' -s 2 -c 1 -o $OUTD/attnc_bwd /tmp/attnc/attnc bench $D/t128h16.attn --batch 4 --seqlen 8192 --iters 3 > $OUTD/ncu_attnc.log 2>&1
echo "ncu attnc rc $? $(date -u)" >> $OUTD/device.txt
$NCU --import $OUTD/attnc_bwd.ncu-rep --page details --csv > $OUTD/attnc_details.csv 2>&1
$NCU --import $OUTD/attnc_bwd.ncu-rep --page source --csv --print-source sass > $OUTD/attnc_sass.csv 2>&1
ls -la $OUTD; tail -3 $OUTD/ncu_fa4.log; cat $OUTD/device.txt
