#!/bin/bash
# Staging 3 of 3 (the peers' small wheels) and ncu of FA4's SM90 forward and attnc's hopper
# forward at the same d128 shapes: b4 x 8k x 16 heads non-causal, b8 x 4k x 16 heads causal
# (the cells where FA4's kernel leads attnc's by 7% and 8-15% at GPU busy time,
# ../2026-11-28-h100-interleaved/).
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/site /tmp/attnc
[ -d /tmp/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*.whl 2>&1 | tail -n 2
ls /tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu* >/dev/null 2>&1 || \
  cat /tmp/stage/cu13.tar.xz.part-aa /tmp/stage/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
OUTD=/tmp/wf207; mkdir -p $OUTD
trap 'rm -f $OUTD/*.ncu-rep; tar cJf $OUT/prof.txz -C $OUTD .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUTD/device.txt
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
NCU=/usr/local/cuda/bin/ncu
xz -dc $D/attnc.xz > /tmp/attnc/attnc; xz -dc $D/ptxas.xz > /tmp/attnc/ptxas; chmod +x /tmp/attnc/attnc /tmp/attnc/ptxas
export ATTNC_PTXAS=/tmp/attnc/ptxas
for cfg in "nc 4 8192 0" "ca 8 4096 1"; do
  set -- $cfg
  timeout 110 $NCU --set full --import-source no -k 'regex:(?i)fwd|forward' -s 1 -c 1 -o $OUTD/fa4_$1 python3 $D/fa4fwd.py $2 $3 128 $4 16 > $OUTD/ncu_fa4_$1.log 2>&1
  timeout 80 $NCU --set full --import-source no -k 'regex:hopper_fwd$' -s 2 -c 1 -o $OUTD/attnc_$1 /tmp/attnc/attnc bench $D/t128h16_$1.attn --batch $2 --seqlen $3 --iters 3 > $OUTD/ncu_attnc_$1.log 2>&1
  for w in fa4 attnc; do
    $NCU --import $OUTD/${w}_$1.ncu-rep --page details --csv > $OUTD/details_${w}_$1.csv 2>&1
    $NCU --import $OUTD/${w}_$1.ncu-rep --page source --csv --print-source sass > $OUTD/sass_${w}_$1.csv 2>&1
  done
  date -u >> $OUTD/device.txt
done
cat $OUTD/device.txt; tail -n 3 $OUTD/ncu_*.log
