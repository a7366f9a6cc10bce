#!/bin/bash
# Staging 3 of 3 (the peers' small wheels) and ncu of FA4's SM90 forward and attnc's hopper
# forward at the same d64 shapes: b2 x 16k x 32 heads non-causal, b16 x 2k x 32 heads causal.
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/site /tmp/attnc
[ -d /tmp/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*.whl 2>&1 | tail -n 2
# pip's --upgrade replaced the library extracted by staging 2: extract it again.
ls /tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu* >/dev/null 2>&1 || \
  cat /tmp/stage/cu13.tar.xz.part-aa $D/../pb/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
OUTD=/tmp/wf47; mkdir -p $OUTD
trap 'rm -f $OUTD/*.ncu-rep; tar cJf $OUT/prof.txz -C $OUTD .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUTD/device.txt
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
NCU=/usr/local/cuda/bin/ncu
xz -dc $D/attnc.xz > /tmp/attnc/attnc; xz -dc $D/ptxas.xz > /tmp/attnc/ptxas; chmod +x /tmp/attnc/attnc /tmp/attnc/ptxas
export ATTNC_PTXAS=/tmp/attnc/ptxas
rm -f $OUTD/*
for cfg in "nc 2 16384 0" "ca 16 2048 1"; do
  set -- $cfg
  timeout 150 $NCU --set full --import-source no -k 'regex:(?i)fwd|forward' -s 1 -c 1 -o $OUTD/fa4_$1 python3 $D/fa4fwd.py $2 $3 64 $4 > $OUTD/ncu_fa4_$1.log 2>&1
  C=""; [ $4 = 1 ] && C="--param causal=1"
  sed "s/heads 32/heads 32/" $D/t64h32.attn > /tmp/t_$1.attn
  [ $4 = 1 ] && sed -i 's/heads 32/heads 32\n  mask causal/' /tmp/t_$1.attn
  timeout 120 $NCU --set full --import-source no -k 'regex:hopper_fwd$' -s 2 -c 1 -o $OUTD/attnc_$1 /tmp/attnc/attnc bench /tmp/t_$1.attn --batch $2 --seqlen $3 --iters 3 > $OUTD/ncu_attnc_$1.log 2>&1
  for w in fa4 attnc; do
    $NCU --import $OUTD/${w}_$1.ncu-rep --page details --csv > $OUTD/details_${w}_$1.csv 2>&1
    $NCU --import $OUTD/${w}_$1.ncu-rep --page source --csv --print-source sass > $OUTD/sass_${w}_$1.csv 2>&1
  done
  date -u >> $OUTD/device.txt
done
ls -la $OUTD; tail -n 2 $OUTD/ncu_fa4_*.log
