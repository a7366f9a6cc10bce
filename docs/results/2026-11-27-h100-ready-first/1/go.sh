#!/bin/bash
# Ready first (Runtime::kernel_ready_first): the compile suite twice (cold, ready-first
# interim and final); the Python package's GPU checks (every Kernel method now reads a
# swappable kernel; the new ready-first check); the selftest with gradients of the causal
# d64 specs (split steps now their default).
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w81; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
for i in 1 2; do
  timeout 90 $R attnc bench --suites compile --json $W/compile_$i.json > $W/compile_$i.txt 2>&1
  echo "compile $i rc $? $(date -u)" >> $W/device.txt; grep -E "^compile|ready" $W/compile_$i.txt | cut -c1-400
done
$R true
mkdir -p /tmp/pyattnc
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export ATTNC_PTXAS=/tmp/attnc/ptxas
PYTHONPATH=/tmp/pyattnc:$PYTHONPATH timeout 300 python3 python/tests/gpu_check.py $W/gpu_check.json > $W/gpu_check.txt 2>&1
echo "gpu_check rc $? $(date -u)" >> $W/device.txt
grep -E "^(PASS|FAIL)|passed" $W/gpu_check.txt | cut -c1-300
timeout 200 $R attnc selftest --json $W/sel.json dsl-examples/mqa_falcon.attn dsl-examples/sinks.attn dsl-examples/t5_bias.attn tests/gpu-specs/varlen_gqa_d64.attn dsl-examples/causal.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel.txt; grep FAIL $W/sel.txt | head -5
gzip -9 -n $W/sel.json
cat $W/device.txt
