#!/bin/bash
# call 2: d64/d128 backward: is the dQ reduce's cost the staging wait, the staging stores or the reduce traffic?
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w3; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $W/gpu.txt
for t in "" diag_dq_no_wait=1 diag_dq_no_stage=1 diag_dq_no_stage=1,diag_dq_no_wait=1 diag_no_dq_red=1; do
  n=${t:-default}; n=$(echo $n | tr ',=' '__')
  ATTNC_HOPPER_BWD_TUNE=$t $R attnc bench --suites backward --json $W/bwd_$n.json > $W/bwd_$n.txt 2>&1
done
tar czf $OUT/w.tgz -C $W .
grep -h "16384" $W/*.txt | head -40
