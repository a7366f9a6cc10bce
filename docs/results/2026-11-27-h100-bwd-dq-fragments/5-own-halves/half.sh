#!/bin/bash
# #13: each consumer warpgroup adds its own half of the dQ tile (no cross-warpgroup
# barrier after the staging stores) — "old" = 093eacf (one issuer after a 256-thread
# barrier). Selftest with gradients of the d128 examples (new), then the backward suite
# old/new/new/old.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
E=dsl-examples
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
timeout 240 $D/run.sh attnc selftest $E/mha.attn $E/causal.attn $E/document_mask.attn $E/sinks.attn \
  $E/varlen_causal.attn $E/sliding_window.attn $E/grok_softcap.attn > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
for w in old new new old; do
  [ $SECONDS -gt 480 ] && { echo "stopped before $w: $SECONDS s" >> $OUT/device.txt; break; }
  W=""; [ $w = old ] && W=old
  echo "== $w" >> $OUT/backward.txt
  $D/run.sh $W attnc bench --suites backward >> $OUT/backward.txt 2>&1
done
date -u >> $OUT/device.txt
