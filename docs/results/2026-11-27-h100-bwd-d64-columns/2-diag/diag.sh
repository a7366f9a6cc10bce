#!/bin/bash
# #13 d64 after the column split (2dd0817, dq_under_dk on at d64): the selftest with
# gradients of the d64 examples on the committed default, then the backward suite by
# default and with diagnostic / tune variants: no dQ adds, no dQ, dP^T issued with S^T,
# three Q/dO stages.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
E=dsl-examples
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
timeout 150 $D/run.sh attnc selftest $E/mqa_falcon.attn $E/sinks.attn $E/vit_fp16.attn --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
for t in none diag_no_dq_red=1 diag_no_dq=1 dp_with_s=1 stages=3 diag_no_softmax=1 none; do
  [ $SECONDS -gt 540 ] && { echo "stopped before $t: $SECONDS s" >> $OUT/device.txt; break; }
  echo "== $t" >> $OUT/backward.txt
  ATTNC_HOPPER_BWD_TUNE=$t $D/run.sh attnc bench --suites backward >> $OUT/backward.txt 2>&1
done
date -u >> $OUT/device.txt
