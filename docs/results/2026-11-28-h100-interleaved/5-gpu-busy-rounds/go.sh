#!/bin/bash
# Staging 4 of 4 and the run (H100, 2026-11-28): scripts/dev/interleaved.py --rounds 3 --busy:
# attnc through the package (fcf8f93) by autograd, FA4
# and cuDNN, round-robin per cell, each round with each backend's GPU busy time (torch.profiler).
SRC=$(cd "$(dirname "$0")" && pwd)
D=/tmp/stage/st; cp $SRC/* $D/
W=/tmp/w205; mkdir -p $W /tmp/site; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
R="$D/run.sh"; $R true
[ -d /tmp/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*-py3-none-any.whl $D/*manylinux*.whl 2>&1 | tail -n 2
ls /tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu* >/dev/null 2>&1 || \
  cat /tmp/stage/cu13.tar.xz.part-aa /tmp/stage/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
xz -dc $D/_attnc.so.xz > python/attnc/_attnc.abi3.so
export PYTHONPATH=$PWD/python:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
export ATTNC_PTXAS=/tmp/attnc/ptxas
timeout 420 python3 scripts/dev/interleaved.py $W/interleaved.json --dirs ${DIRS:-bwd,fwd} --rounds 3 --busy > $W/interleaved.txt 2>&1
echo "interleaved rc $? $(date -u)" >> $W/device.txt; tail -n 44 $W/interleaved.txt

cat $W/device.txt
