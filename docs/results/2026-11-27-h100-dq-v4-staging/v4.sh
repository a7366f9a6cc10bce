#!/bin/bash
# #13: dQ staging as one st.shared.v4 per fragment chunk (new = wip/dq-v4-staging 4f539ac)
# vs 16 v2 stores (old = main 0a4435c). Selftest with gradients of every head_dim-128
# example (new), then the backward suite old/new/new/old.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
L=""; for f in dsl-examples/*.attn; do grep -q "head_dim 128$" $f && L="$L $f"; done
timeout 320 $D/run.sh attnc selftest $L --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
for w in old new new old; do
  [ $SECONDS -gt 500 ] && { echo "stopped before $w: $SECONDS s" >> $OUT/device.txt; break; }
  W=""; [ $w = old ] && W=old
  echo "== $w" >> $OUT/backward.txt
  $D/run.sh $W attnc bench --suites backward >> $OUT/backward.txt 2>&1
done
date -u >> $OUT/device.txt
