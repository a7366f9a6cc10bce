#!/bin/bash
# Persistent hopper forward with a dynamic tile scheduler (ATTNC_HOPPER_TUNE=persistent=1:
# the producer takes each next work tile from a global counter and hands it to the
# consumers through a shared-memory ring; the last CTA resets the counters). First the
# forward selftest with it (a hang times out here), then the prefill suite against the
# default grid, two rounds, and one round with a third ring slot.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w64; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
E=dsl-examples; G=tests/gpu-specs
ATTNC_HOPPER_TUNE=persistent=1 timeout 90 $R attnc selftest --no-grads --family hopper --json $W/sel.json \
  $E/mha.attn $E/causal.attn $E/vit_fp16.attn $E/mqa_falcon.attn $E/varlen_causal.attn $G/varlen_gqa_d64.attn \
  $E/sliding_window.attn $E/document_mask.attn $G/head_dim_192.attn $E/sinks.attn > $W/sel.txt 2>&1
echo "sel rc $?"; tail -n 1 $W/sel.txt; grep -c FAIL $W/sel.txt
ROUNDS=2 timeout 200 $R bash scripts/dev/ab_tune.sh prefill $W 'def=' 'pers=ATTNC_HOPPER_TUNE=persistent=1'
ROUNDS=1 timeout 60 $R bash scripts/dev/ab_tune.sh prefill $W 'pers3=ATTNC_HOPPER_TUNE=persistent=1,stages=3'
cat $W/device.txt
python3 scripts/dev/ab_compare.py $W prefill def
