#!/bin/bash
# split_mask (a masked and an unmasked copy of each forward step, so no branch sits
# between the S and O waits) against the default, same binary: the prefill suite default,
# split, default, split; the compile suite both ways; the forward selftest with split_mask=1.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w48; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
i=0
for v in def split def split; do
  i=$((i+1))
  T=""; [ $v = split ] && T="split_mask=1"
  ATTNC_HOPPER_TUNE=$T timeout 120 $R attnc bench --suites prefill --json $W/fwd_${v}_$i.json > $W/fwd_${v}_$i.txt 2>&1
  echo "$v $i rc $? $(date -u)" >> $W/device.txt
done
for v in def split; do
  T=""; [ $v = split ] && T="split_mask=1"
  ATTNC_HOPPER_TUNE=$T timeout 60 $R attnc bench --suites compile --json $W/compile_$v.json > $W/compile_$v.txt 2>&1
  echo "compile $v rc $? $(date -u)" >> $W/device.txt
done
E=dsl-examples; G=tests/gpu-specs
ATTNC_HOPPER_TUNE=split_mask=1 timeout 150 $R attnc selftest --no-grads --family hopper --json $W/sel_split.json \
  $E/mha.attn $E/causal.attn $E/vit_fp16.attn $E/mqa_falcon.attn $E/sliding_window.attn $E/alibi.attn \
  $E/document_mask.attn $E/varlen_causal.attn $E/sinks.attn $G/gqa_d64.attn $G/head_dim_96.attn > $W/sel_split.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 3 $W/sel_split.txt
