#!/bin/bash
# block_n 176 / 192 (FA3's and FA4's d128 non-causal key tile) against the default 128, at
# the kernels' own GPU time, in one process (scripts/dev/ab_busy.py, b1e84b4's package and
# binary), after the forward selftest of the examples with the override.
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/w206; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
R="$D/run.sh"; $R true
for t in 176 192; do
  ATTNC_HOPPER_TUNE=block_n=$t timeout 90 $R attnc selftest --quick --no-grads --family hopper --json $W/sel_$t.json dsl-examples/mha.attn dsl-examples/causal.attn dsl-examples/mqa_falcon.attn dsl-examples/vit_fp16.attn dsl-examples/sliding_window.attn tests/gpu-specs/varlen_plain_d64.attn > $W/sel_$t.txt 2>&1
  echo "sel block_n=$t rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel_$t.txt
done
xz -dc $D/_attnc.so.xz > python/attnc/_attnc.abi3.so
export ATTNC_PTXAS=/tmp/attnc/ptxas PYTHONPATH=$PWD/python:$PWD/scripts/dev
timeout 300 python3 scripts/dev/ab_busy.py $W/ab.json 'def=' 'n176=block_n=176' 'n192=block_n=192' --causal 0,1 > $W/ab.txt 2>&1
echo "ab rc $? $(date -u)" >> $W/device.txt; tail -n 14 $W/ab.txt
cat $W/device.txt
