#!/bin/bash
# Backward row_keys (ATTNC_HOPPER_BWD_TUNE=row_keys=1: causal/window partial tiles from one
# query interval per key row, one bit range per mask word, built under the S^T/dP^T GEMMs)
# against the default, same binary: backward suite def, rk, def, rk; then the gradient
# selftest (f64 reference) of every spec whose backward PTX row_keys changes.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w54; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
i=0
for v in def rk def rk; do
  i=$((i+1))
  T=""; [ $v = rk ] && T="row_keys=1"
  ATTNC_HOPPER_BWD_TUNE=$T timeout 80 $R attnc bench --suites backward --json $W/bwd_${v}_$i.json > $W/bwd_${v}_$i.txt 2>&1
  echo "$v $i rc $? $(date -u)" >> $W/device.txt
done
E=dsl-examples; G=tests/gpu-specs
ATTNC_HOPPER_BWD_TUNE=row_keys=1 timeout 280 $R attnc selftest --family hopper --json $W/sel_rk.json \
  $E/causal.attn $E/causal_bottom_right.attn $E/sliding_window.attn $E/sinks.attn $E/mqa_falcon.attn \
  $E/varlen_causal.attn $E/alibi.attn $E/fa4_numerics.attn $E/grok_softcap.attn $E/t5_bias.attn \
  $G/head_dim_96.attn $G/varlen_gqa_d64.attn > $W/sel_rk.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 3 $W/sel_rk.txt
