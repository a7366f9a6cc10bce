#!/bin/bash
# Call 3 of 3: the second half of the CUTLASS-DSL library, then the package's GPU checks and
# the host-overhead table (FA4 in the same process), this commit and the previous one
# interleaved, three processes each, on one pinned core.
D=$(cd "$(dirname "$0")" && pwd)
cd $D && WHEELS=$D source install.sh; cd - > /dev/null
export ATTNC_PTXAS=/tmp/attnc/ptxas
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
PYTHONPATH=/tmp/pyattnc:$PYTHONPATH python3 python/tests/gpu_check.py $OUT/gpu_check.json > $OUT/gpu_check.txt 2>&1; echo "gpu_check rc=$?"
grep -E "^(PASS|FAIL)|passed" $OUT/gpu_check.txt | cut -c1-250
mkdir -p $OUT/overhead
for round in 1 2 3; do
  for pkg in new old; do
    dir=/tmp/pyattnc; [ $pkg = old ] && dir=/tmp/pyattnc_old
    PYTHONPATH=$dir:$PYTHONPATH taskset -c 5 python3 python/tests/overhead.py $OUT/overhead/${pkg}_$round.json > $OUT/overhead/${pkg}_$round.txt 2>&1
    echo "== $pkg $round"; grep -v -i warn $OUT/overhead/${pkg}_$round.txt | head -12
  done
done
date -u >> $OUT/device.txt
tar czf $OUT/overhead.tgz -C $OUT overhead && rm -rf $OUT/overhead
