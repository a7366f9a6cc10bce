#!/bin/bash
# The Python package's GPU checks (python/tests/gpu_check.py) on 2eb36cc's wheel: autograd,
# CUDA graphs, ready first, the training step and the host overhead per call.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w100; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
mkdir -p /tmp/attnc; xz -dc $D/ptxas.xz > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas
mkdir -p /tmp/pyattnc
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export ATTNC_PTXAS=/tmp/attnc/ptxas
PYTHONPATH=/tmp/pyattnc:$PYTHONPATH timeout 140 python3 python/tests/gpu_check.py $W/gpu_check.json > $W/gpu_check.txt 2>&1
echo "gpu_check rc $? $(date -u)" >> $W/device.txt
grep -E "^(PASS|FAIL)|passed" $W/gpu_check.txt | cut -c1-300
cat $W/device.txt
