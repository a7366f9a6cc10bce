#!/bin/bash
# CUDA-graph capture with the relaxed-capture allocation (the persistent grid's tile
# counters sized on the capture stream), then ready first, each in a fresh process; then
# the whole gpu_check.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w82; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
$R true
mkdir -p /tmp/pyattnc
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export ATTNC_PTXAS=/tmp/attnc/ptxas PYTHONPATH=/tmp/pyattnc:$PYTHONPATH
for part in cuda_graph ready_first; do
  (cd python/tests && timeout 120 python3 -c "import gpu_check as g; g.$part()") > $W/$part.txt 2>&1
  echo "$part rc $? $(date -u)" >> $W/device.txt; cut -c1-1500 $W/$part.txt | tail -5
done
timeout 300 python3 python/tests/gpu_check.py $W/gpu_check.json > $W/gpu_check.txt 2>&1
echo "gpu_check rc $? $(date -u)" >> $W/device.txt
grep -E "^(PASS|FAIL)|passed" $W/gpu_check.txt | cut -c1-600
cat $W/device.txt
