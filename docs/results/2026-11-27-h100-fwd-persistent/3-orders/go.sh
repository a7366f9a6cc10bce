#!/bin/bash
# Persistent hopper forward, round 2: the snake over rounds (default with persistent=1),
# without it, and with a third ring slot, against the default grid; same binary. First a
# forward selftest with persistent=1 (snake), then the prefill suite, two rounds.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w63; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
E=dsl-examples; G=tests/gpu-specs
ATTNC_HOPPER_TUNE=persistent=1 timeout 100 $R attnc selftest --no-grads --family hopper --json $W/sel.json \
  $E/mha.attn $E/causal.attn $E/mqa_falcon.attn $E/varlen_causal.attn $G/varlen_gqa_d64.attn $E/document_mask.attn > $W/sel.txt 2>&1
echo "sel rc $?"; tail -n 1 $W/sel.txt
ROUNDS=2 timeout 300 $R bash scripts/dev/ab_tune.sh prefill $W 'def=' 'snake=ATTNC_HOPPER_TUNE=persistent=1' \
  'stride=ATTNC_HOPPER_TUNE=persistent=1,snake=0' 'snake3=ATTNC_HOPPER_TUNE=persistent=1,stages=3'
cat $W/device.txt
python3 scripts/dev/ab_compare.py $W prefill def
