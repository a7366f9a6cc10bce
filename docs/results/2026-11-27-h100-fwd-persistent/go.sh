#!/bin/bash
# Persistent hopper forward (ATTNC_HOPPER_TUNE=persistent=1: grid min(tiles, SMs), each
# CTA walks work tiles, LPT order under a causal mask, the ring carried across tiles)
# against the default, same binary: first a forward selftest with it (hangs and wrong
# results show here first), then the prefill suite, three rounds each.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w61; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples; G=tests/gpu-specs
ATTNC_HOPPER_TUNE=persistent=1 timeout 150 $R attnc selftest --no-grads --family hopper --json $W/sel.json \
  $E/mha.attn $E/causal.attn $E/vit_fp16.attn $E/mqa_falcon.attn $E/varlen_causal.attn $G/varlen_gqa_d64.attn \
  $E/sliding_window.attn $E/document_mask.attn $G/head_dim_192.attn $E/sinks.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
tail -n 3 $W/sel.txt; grep -c FAIL $W/sel.txt
for i in 1 2 3; do
  for v in def pers; do
    T=""; [ $v = pers ] && T="persistent=1"
    ATTNC_HOPPER_TUNE=$T timeout 60 $R attnc bench --suites prefill --json $W/prefill_${v}_$i.json > $W/prefill_${v}_$i.txt 2>&1
    echo "prefill $v $i rc $? $(date -u)" >> $W/device.txt
  done
done
cat $W/device.txt
python3 scripts/dev/ab_compare.py $W prefill def
grep -m1 -o "grid \[[0-9, ]*\]" $W/prefill_pers_1.txt
