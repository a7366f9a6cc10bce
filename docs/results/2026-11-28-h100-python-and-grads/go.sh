#!/bin/bash
# The Python package's GPU checks on 257fd5d's wheel (the CUDA-graph helper of f071657 not
# run on a GPU before; autograd through the new backward row kernels), then the gradient
# selftest of the examples and GPU specs the row-kernel receipt did not cover.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w95; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
$R true
mkdir -p /tmp/pyattnc
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export ATTNC_PTXAS=/tmp/attnc/ptxas
PYTHONPATH=/tmp/pyattnc:$PYTHONPATH timeout 150 python3 python/tests/gpu_check.py $W/gpu_check.json > $W/gpu_check.txt 2>&1
echo "gpu_check rc $? $(date -u)" >> $W/device.txt
grep -E "^(PASS|FAIL)|passed" $W/gpu_check.txt | cut -c1-300
E=dsl-examples; G=tests/gpu-specs
timeout 200 $R attnc selftest --json $W/sel.json $E/alibi.attn $E/causal_bottom_right.attn $E/chunked_local.attn $E/deepseek.attn $E/fa4_numerics.attn $E/gemma2.attn $E/grok_softcap.attn $E/prefix_lm.attn $E/sliding_window.attn $G/varlen_plain_d64.attn $G/varlen_softcap_d64.attn $G/split_sinks.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel.txt; grep FAIL $W/sel.txt | head -5
gzip -9 -n $W/sel.json
cat $W/device.txt
