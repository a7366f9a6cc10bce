#!/bin/bash
# Paged KV by TMA on hopper (#14): the paged selftest (new binary), then the decode
# suite old/new/old/new in one command.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u; } > $OUT/device.txt
$D/run.sh attnc selftest --family hopper dsl-examples/gqa_decode_paged.attn tests/gpu-specs/paged_page128_d256.attn \
  tests/gpu-specs/paged_page1_d64.attn --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
for r in 1 2; do
  $D/run.sh old attnc bench --suites ceilings,decode > $OUT/decode_old_$r.txt 2>&1
  $D/run.sh attnc bench --suites ceilings,decode > $OUT/decode_new_$r.txt 2>&1
done
date -u >> $OUT/device.txt
