#!/bin/bash
# Causal and window masks as per-row key intervals (ATTNC_ROW_KEYS=1: the partial tile's
# mask bits from two bounds per row, one bmsk per word, tested with R2P) against the
# per-element mask: prefill suite default, rk, default, rk; then the forward selftest of
# the causal and window specs with rk.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w53; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
i=0
for v in def rk def rk; do
  i=$((i+1))
  RK=0; [ $v = rk ] && RK=1
  ATTNC_ROW_KEYS=$RK timeout 60 $R attnc bench --suites prefill --json $W/fwd_${v}_$i.json > $W/fwd_${v}_$i.txt 2>&1
  echo "$v $i rc $? $(date -u)" >> $W/device.txt
done
E=dsl-examples; G=tests/gpu-specs
ATTNC_ROW_KEYS=1 timeout 110 $R attnc selftest --no-grads --family hopper --json $W/sel_rk.json \
  $E/causal.attn $E/causal_bottom_right.attn $E/sliding_window.attn $E/sinks.attn $E/mqa_falcon.attn \
  $E/varlen_causal.attn $G/head_dim_96.attn $E/gqa_decode_paged.attn $G/paged_page128_d256.attn \
  $G/varlen_gqa_d64.attn $E/gemma2.attn > $W/sel_rk.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 2 $W/sel_rk.txt
