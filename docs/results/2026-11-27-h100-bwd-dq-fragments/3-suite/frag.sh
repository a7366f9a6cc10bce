#!/bin/bash
# #13: dq_accum in the consumers' fragment order (bank-conflict-free dQ staging) — the
# selftest of every example with gradients (new), then the backward suite old/new/new/old.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
timeout 300 $D/run.sh attnc selftest dsl-examples tests/gpu-specs --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
for w in old new new old; do
  [ $SECONDS -gt 470 ] && { echo "stopped before $w: $SECONDS s" >> $OUT/device.txt; break; }
  W=""; [ $w = old ] && W=old
  echo "== $w" >> $OUT/backward.txt
  $D/run.sh $W attnc bench --suites backward >> $OUT/backward.txt 2>&1
done
date -u >> $OUT/device.txt
xz -T4 $OUT/selftest.json
