#!/bin/bash
# #13 d64: 128 queries per backward tile (ATTNC_HOPPER_BWD_TUNE=block_m=128; the default
# stays 64 in this binary, its PTX that of 2dd0817). Selftest with gradients of the d64
# examples at block_m 128, then the backward suite: default / 128 / 128 without
# dq_under_dk / default.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
E=dsl-examples
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
ATTNC_HOPPER_BWD_TUNE=block_m=128 timeout 150 $D/run.sh attnc selftest $E/mqa_falcon.attn $E/sinks.attn $E/vit_fp16.attn \
  --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
for t in none block_m=128 block_m=128,dq_under_dk=0 none; do
  [ $SECONDS -gt 520 ] && { echo "stopped before $t: $SECONDS s" >> $OUT/device.txt; break; }
  echo "== $t" >> $OUT/backward.txt
  ATTNC_HOPPER_BWD_TUNE=$t $D/run.sh attnc bench --suites backward >> $OUT/backward.txt 2>&1
done
date -u >> $OUT/device.txt
