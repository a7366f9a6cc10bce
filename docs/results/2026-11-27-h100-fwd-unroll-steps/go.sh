#!/bin/bash
# The forward's steady-state loop unrolled by two (ATTNC_HOPPER_TUNE=unroll_steps=1: P
# alternates between the two copies' registers instead of being moved into the P.V
# operand at every back edge) against the default, same binary: prefill suite, three
# rounds; then the forward selftest of maskless specs with it.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w60; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
ROUNDS=3 timeout 300 $R bash scripts/dev/ab_tune.sh prefill $W 'def=' 'unroll=ATTNC_HOPPER_TUNE=unroll_steps=1'
E=dsl-examples; G=tests/gpu-specs
ATTNC_HOPPER_TUNE=unroll_steps=1 timeout 150 $R attnc selftest --no-grads --family hopper --json $W/sel.json $E/mha.attn $E/vit_fp16.attn \
  $G/gqa_d64.attn $G/head_dim_192.attn $G/varlen_softcap_d64.attn $E/causal.attn $E/document_mask.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 2 $W/sel.txt; grep -c FAIL $W/sel.txt
python3 scripts/dev/ab_compare.py $W prefill def
