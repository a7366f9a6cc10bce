#!/bin/bash
# #13 d64: dQ split by query rows at 128-query tiles (ATTNC_HOPPER_BWD_TUNE=dq_split=2: each
# warpgroup its 64 queries x all 64 columns, N = 64) vs the column split (default; PTX of
# 30bcd4b). Selftest with gradients of the d64 examples + varlen_gqa_d64 with the row
# split, then the backward suite default / rows / rows / default.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
E=dsl-examples
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
ATTNC_HOPPER_BWD_TUNE=dq_split=2 timeout 150 $D/run.sh attnc selftest $E/mqa_falcon.attn $E/sinks.attn $E/vit_fp16.attn \
  tests/gpu-specs/varlen_gqa_d64.attn --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
for t in none dq_split=2 dq_split=2 none; do
  [ $SECONDS -gt 400 ] && { echo "stopped before $t: $SECONDS s" >> $OUT/device.txt; break; }
  echo "== $t" >> $OUT/backward.txt
  ATTNC_HOPPER_BWD_TUNE=$t $D/run.sh attnc bench --suites backward >> $OUT/backward.txt 2>&1
done
date -u >> $OUT/device.txt
