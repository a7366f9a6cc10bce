#!/bin/bash
# #13 d64: dQ split by columns at d64 too (each consumer warpgroup 32 of the 64 columns over
# all 128 keys, m64n32k16; one staging tile and one bulk reduce per pair, half the adds of
# the key split) — new = working tree on 589b3e4, old = 0a4435c (key split, per-thread reds).
# Selftest with gradients of the d64 examples and d96 (new), then the backward suite
# old / new / new with dq_under_dk / new / old.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
E=dsl-examples
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
timeout 200 $D/run.sh attnc selftest $E/mqa_falcon.attn $E/sinks.attn $E/vit_fp16.attn tests/gpu-specs/head_dim_96.attn \
  --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
for w in old new under new old; do
  [ $SECONDS -gt 520 ] && { echo "stopped before $w: $SECONDS s" >> $OUT/device.txt; break; }
  W=""; T=""; [ $w = old ] && W=old; [ $w = under ] && T=dq_under_dk=1
  echo "== $w" >> $OUT/backward.txt
  ATTNC_HOPPER_BWD_TUNE=$T $D/run.sh $W attnc bench --suites backward >> $OUT/backward.txt 2>&1
done
date -u >> $OUT/device.txt
