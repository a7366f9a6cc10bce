#!/bin/bash
# The forward without a mask branch in its loop: tf3 = tail_first (key tiles walked from
# the last, so the key tail is the peeled first step and the loop has no mask branch),
# uniform_consumer, finite_max; uf = the last two alone; stf3 = tf3 with split_mask (a
# masked and an unmasked copy of each step where the mask is not the key tail alone).
# The prefill suite in rounds def, tf3, uf, stf3 (twice), the compile suite, then the
# selftest of tf3 (with gradients) and stf3 (forward).
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w49; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
TF3="tail_first=1,uniform_consumer=1,finite_max=1"
tune() { case $1 in def) echo "";; tf3) echo $TF3;; uf) echo "uniform_consumer=1,finite_max=1";; stf3) echo "split_mask=1,$TF3";; esac; }
i=0
for v in def tf3 uf stf3 def tf3 uf stf3; do
  i=$((i+1))
  ATTNC_HOPPER_TUNE=$(tune $v) timeout 90 $R attnc bench --suites prefill --json $W/fwd_${v}_$i.json > $W/fwd_${v}_$i.txt 2>&1
  echo "$v $i rc $? $(date -u)" >> $W/device.txt
done
for v in def tf3 stf3; do
  ATTNC_HOPPER_TUNE=$(tune $v) timeout 60 $R attnc bench --suites compile --json $W/compile_$v.json > $W/compile_$v.txt 2>&1
done
E=dsl-examples; G=tests/gpu-specs
ATTNC_HOPPER_TUNE=$TF3 timeout 170 $R attnc selftest --family hopper --json $W/sel_tf3.json \
  $E/mha.attn $E/vit_fp16.attn $G/gqa_d64.attn $G/varlen_gqa_d64.attn $E/sinks.attn $G/head_dim_96.attn \
  $G/paged_page1_d64.attn $G/head_dim_192.attn $G/varlen_softcap_d64.attn > $W/sel_tf3.txt 2>&1
echo "sel_tf3 rc $? $(date -u)" >> $W/device.txt
ATTNC_HOPPER_TUNE=split_mask=1,$TF3 timeout 120 $R attnc selftest --no-grads --family hopper --json $W/sel_stf3.json \
  $E/causal.attn $E/sliding_window.attn $E/document_mask.attn $E/varlen_causal.attn $E/mqa_falcon.attn \
  $E/alibi.attn $E/gqa_decode_paged.attn $E/prefix_lm.attn > $W/sel_stf3.txt 2>&1
echo "sel_stf3 rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 2 $W/sel_tf3.txt $W/sel_stf3.txt
