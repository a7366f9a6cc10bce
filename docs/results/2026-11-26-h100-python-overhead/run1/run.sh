#!/bin/bash
# One call: the attnc wheels (this commit, the previous one), gpu_check.py, then
# overhead.py alternating new/old, three processes each, pinned to one core (no FA4 here).
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/pyattnc /tmp/pyattnc_old /tmp/attnc
xz -dc "$D/ptxas.xz" > /tmp/attnc/ptxas; chmod +x /tmp/attnc/ptxas
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc "$D"/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/pyattnc_old "$D"/old/attnc-*.whl 2>&1 | grep -v WARNING | tail -2
export ATTNC_PTXAS=/tmp/attnc/ptxas
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; lscpu | grep "Model name") | tee $OUT/device.txt
PYTHONPATH=/tmp/pyattnc:$PYTHONPATH python3 python/tests/gpu_check.py $OUT/gpu_check.json > $OUT/gpu_check.txt 2>&1; echo "gpu_check rc=$?"
grep -E "^(PASS|FAIL)|passed" $OUT/gpu_check.txt | cut -c1-160
mkdir -p $OUT/overhead
for round in 1 2 3; do
  for pkg in new old; do
    dir=/tmp/pyattnc; [ $pkg = old ] && dir=/tmp/pyattnc_old
    PYTHONPATH=$dir:$PYTHONPATH taskset -c 5 python3 python/tests/overhead.py $OUT/overhead/${pkg}_$round.json > $OUT/overhead/${pkg}_$round.txt 2>&1
    echo "== $pkg $round"; grep -E "attnc call \(eager|sdpa|torch.neg" $OUT/overhead/${pkg}_$round.txt
  done
done
date -u >> $OUT/device.txt
tar czf $OUT/overhead.tgz -C $OUT overhead && rm -rf $OUT/overhead
