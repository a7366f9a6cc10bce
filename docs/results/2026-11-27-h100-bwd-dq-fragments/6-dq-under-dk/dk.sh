#!/bin/bash
# #13: dQ goes out (staging stores + bulk reduce, or reds) while the dK GEMM is in flight
# (dQ issued before dK, wait_group 1) — "old" = 093eacf (wait for every GEMM, then dQ).
# Selftest with gradients (d128, d64 and d96 examples; new), then the backward suite
# old/new/new/old.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
E=dsl-examples
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
timeout 240 $D/run.sh attnc selftest $E/mha.attn $E/causal.attn $E/document_mask.attn $E/sinks.attn \
  $E/varlen_causal.attn $E/mqa_falcon.attn tests/gpu-specs/head_dim_96.attn > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
for w in old new new old; do
  [ $SECONDS -gt 480 ] && { echo "stopped before $w: $SECONDS s" >> $OUT/device.txt; break; }
  W=""; [ $w = old ] && W=old
  echo "== $w" >> $OUT/backward.txt
  $D/run.sh $W attnc bench --suites backward >> $OUT/backward.txt 2>&1
done
date -u >> $OUT/device.txt
