#!/bin/bash
# The Python package's GPU checks with outgrown pooled workspaces kept (no stream wait in a
# capture; graphs captured earlier keep their memory): the new growing-sizes graph check first
# in its own process, then the whole gpu_check.py.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w85; mkdir -p $W
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
$R true
mkdir -p /tmp/pyattnc
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export ATTNC_PTXAS=/tmp/attnc/ptxas PYTHONPATH=/tmp/pyattnc:$PYTHONPATH
(cd python/tests && timeout 120 python3 -c "import gpu_check as g; g.cuda_graphs_of_growing_sizes()") > $W/graphs.txt 2>&1
echo "graphs rc $? $(date -u)" >> $W/device.txt; cut -c1-1500 $W/graphs.txt | tail -3
timeout 300 python3 python/tests/gpu_check.py $W/gpu_check.json > $W/gpu_check.txt 2>&1
echo "gpu_check rc $? $(date -u)" >> $W/device.txt
grep -E "^(PASS|FAIL)|passed" $W/gpu_check.txt | cut -c1-400
cat $W/device.txt
