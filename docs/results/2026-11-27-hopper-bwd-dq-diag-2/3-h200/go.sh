#!/bin/bash
# call 3: the cost of the dQ staging fence and of the dS^T stores
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w4; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $W/gpu.txt
for t in "" diag_dq_no_fence=1 diag_ds_no_store=1 diag_dq_no_stage=1; do
  n=${t:-default}; n=$(echo $n | tr ',=' '__')
  ATTNC_HOPPER_BWD_TUNE=$t $R attnc bench --suites backward --json $W/bwd_$n.json > $W/bwd_$n.txt 2>&1
done
tar czf $OUT/w.tgz -C $W .
grep -h "16384" $W/*.txt | head -40
