#!/bin/bash
# #13 d64: where a d64 backward tile's time goes — the backward suite (main 589b3e4 = 0a4435c's
# kernels) by default and with diagnostic builds (wrong gradients on purpose): no dQ reds,
# no dQ at all, no softmax/dS math, and both no softmax and no dQ.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
for t in none diag_no_dq_red=1 diag_no_dq=1 diag_no_softmax=1 diag_no_softmax=1,diag_no_dq=1 none; do
  echo "== $t" >> $OUT/backward.txt
  ATTNC_HOPPER_BWD_TUNE=$t $D/run.sh attnc bench --suites backward >> $OUT/backward.txt 2>&1
done
date -u >> $OUT/device.txt
