#!/bin/bash
# Paged KV by TMA, block-table window read ahead: paged selftest (new), decode suite
# new / alt (the first TMA build, no read-ahead) / old, twice.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
$D/run.sh attnc selftest --family hopper dsl-examples/gqa_decode_paged.attn tests/gpu-specs/paged_page128_d256.attn \
  tests/gpu-specs/paged_page1_d64.attn > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt
for r in 1 2; do
  $D/run.sh attnc bench --suites decode > $OUT/decode_new_$r.txt 2>&1
  $D/run.sh alt attnc bench --suites decode > $OUT/decode_alt_$r.txt 2>&1
  $D/run.sh old attnc bench --suites decode > $OUT/decode_old_$r.txt 2>&1
done
date -u >> $OUT/device.txt
