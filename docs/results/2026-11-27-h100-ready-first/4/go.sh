#!/bin/bash
# Ready first, the compile thread handing the kernel over after its forward and then warming
# the backward: the ready-first check in its own process, the whole gpu_check.py, and the
# compile suite twice.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w87; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
$R true
mkdir -p /tmp/pyattnc
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export ATTNC_PTXAS=/tmp/attnc/ptxas PYTHONPATH=/tmp/pyattnc:$PYTHONPATH
(cd python/tests && timeout 120 python3 -c "import gpu_check as g; g.ready_first()") > $W/ready_first.txt 2>&1
echo "ready_first rc $? $(date -u)" >> $W/device.txt; cut -c1-1500 $W/ready_first.txt | tail -3
timeout 300 python3 python/tests/gpu_check.py $W/gpu_check.json > $W/gpu_check.txt 2>&1
echo "gpu_check rc $? $(date -u)" >> $W/device.txt
grep -E "^(PASS|FAIL)|passed" $W/gpu_check.txt | cut -c1-300
for i in 1 2; do
  timeout 90 $R attnc bench --suites compile --json $W/compile_$i.json > $W/compile_$i.txt 2>&1
  echo "compile $i rc $? $(date -u)" >> $W/device.txt; grep -E "^compile \(" $W/compile_$i.txt | cut -c1-400
done
cat $W/device.txt
