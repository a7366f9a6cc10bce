#!/bin/bash
# attnc warm on a fresh cache: cold, then again (every module from disk), then a quick selftest served by that cache.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt; nproc | tee -a $OUT/device.txt
export ATTNC_CACHE_DIR=/tmp/warmcache; rm -rf $ATTNC_CACHE_DIR
for run in cold again; do
  /usr/bin/time -f "$run: %e s wall, %U s user" bash $D/run.sh attnc warm --jobs 8 dsl-examples tests/gpu-specs > $OUT/warm_$run.txt 2>&1
  echo "warm $run rc=$?"; tail -2 $OUT/warm_$run.txt
done
du -sh $ATTNC_CACHE_DIR | tee -a $OUT/device.txt
bash $D/run.sh attnc selftest --quick --no-grads --json $OUT/selftest_quick.json dsl-examples > $OUT/selftest_quick.txt 2>&1
echo "selftest rc=$?"; tail -1 $OUT/selftest_quick.txt
python3 -c "
import json; d=json.load(open('$OUT/selftest_quick.json'))
cases=d['cases'] if isinstance(d,dict) and 'cases' in d else d
from collections import Counter
print('kernel sources in the quick selftest:', Counter(c['receipt']['kernel_source'] for c in cases if c.get('receipt')))
" | tee -a $OUT/device.txt
date -u | tee -a $OUT/device.txt
