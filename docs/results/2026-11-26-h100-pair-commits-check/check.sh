#!/bin/bash
# After the blackwell CTA-pair commits (shared runtime backward plan, Grid::KeyTiles.pair):
# the hopper backward and the runtime path still pass the selftest with gradients.
D=$(cd "$(dirname "$0")" && pwd)
E=dsl-examples
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -f /tmp/attnc/attnc
bash $D/run.sh attnc selftest --json $OUT/selftest.json $E/causal.attn $E/sliding_window.attn $E/mha.attn $E/document_mask.attn $E/varlen_causal.attn $E/sinks.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "^FAIL" $OUT/selftest.txt | head; tail -3 $OUT/selftest.txt
xz -T4 $OUT/selftest.json
date -u >> $OUT/device.txt
