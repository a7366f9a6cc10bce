#!/bin/bash
# The persistent forward as the default under a causal mask: the forward selftest of
# every example and GPU spec, the gradient selftest of the causal specs (their backward
# takes the forward's LSE), and the prefill suite once.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w65; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples; G=tests/gpu-specs
timeout 200 $R attnc selftest --no-grads --family hopper --json $W/sel_fwd.json $E/*.attn $G/*.attn > $W/sel_fwd.txt 2>&1
echo "sel_fwd rc $? $(date -u)" >> $W/device.txt
timeout 170 $R attnc selftest --family hopper --json $W/sel_grad.json $E/causal.attn $E/causal_bottom_right.attn \
  $E/mqa_falcon.attn $E/varlen_causal.attn $G/varlen_gqa_d64.attn > $W/sel_grad.txt 2>&1
echo "sel_grad rc $? $(date -u)" >> $W/device.txt
timeout 60 $R attnc bench --suites prefill --json $W/prefill_def_1.json > $W/prefill_def_1.txt 2>&1
echo "prefill rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 1 $W/sel_fwd.txt $W/sel_grad.txt; grep -c FAIL $W/sel_fwd.txt $W/sel_grad.txt
grep -E "^ *(64|128) " $W/prefill_def_1.txt | head -24
