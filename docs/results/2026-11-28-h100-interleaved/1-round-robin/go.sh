#!/bin/bash
# Staging 4 of 4 and the run, in one command on the H100 (2026-11-28):
# 1. gradient selftest of backward specs with a NaN-poisoned workspace (new binary, fcf8f93);
# 2. the backward suite, old (c4a1691: memset of dq_accum) vs new (fcf8f93: zeroed by the
#    preprocess), two rounds, order reversed in the second;
# 3. scripts/dev/interleaved.py: attnc (Python package of fcf8f93), FA4 and cuDNN,
#    round-robin per cell, forward and backward, d64/d128, causal and not, 1k-16k.
SRC=$(cd "$(dirname "$0")" && pwd)
D=/tmp/stage/st; cp $SRC/* $D/
W=/tmp/w201; mkdir -p $W/ab /tmp/site /tmp/pyattnc; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
R="$D/run.sh"
$R true; $R old true
STEP=${STEP:-all}
if [ "$STEP" = all ] || [ "$STEP" = sel ]; then
E=dsl-examples; G=tests/gpu-specs
timeout 170 $R attnc selftest --quick --json $W/sel.json $E/causal.attn $E/mha.attn $E/document_mask.attn $E/t5_bias.attn $E/sinks.attn $E/alibi_learned.attn $E/deepseek.attn $E/mqa_falcon.attn $G/gqa_d64.attn $G/head_dim_96.attn $G/varlen_gqa_d64.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt; tail -n 3 $W/sel.txt; grep FAIL $W/sel.txt | head -5
for r in 1 2; do
  if [ $r = 1 ]; then order="old new"; else order="new old"; fi
  for l in $order; do
    if [ $l = old ]; then X="$R old"; else X="$R"; fi
    timeout 100 $X attnc bench --suites backward --json $W/ab/backward_${l}_$r.json > $W/ab/backward_${l}_$r.txt 2>&1
    echo "$l round $r rc $? $(date -u)" >> $W/device.txt
  done
done
python3 scripts/dev/ab_compare.py $W/ab backward old > $W/ab/compare.md 2>&1; cat $W/ab/compare.md | head -50
fi
if [ "$STEP" = all ] || [ "$STEP" = inter ]; then
[ -d /tmp/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*-py3-none-any.whl $D/*manylinux*.whl 2>&1 | tail -n 2
ls /tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu* >/dev/null 2>&1 || \
  cat /tmp/stage/cu13.tar.xz.part-aa /tmp/stage/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc $D/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=/tmp/pyattnc:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
export ATTNC_PTXAS=/tmp/attnc/ptxas
timeout ${INTER_LIMIT:-400} python3 scripts/dev/interleaved.py $W/interleaved.json --rounds ${ROUNDS:-3} > $W/interleaved.txt 2>&1
echo "interleaved rc $? $(date -u)" >> $W/device.txt; tail -n 45 $W/interleaved.txt
fi
cat $W/device.txt
