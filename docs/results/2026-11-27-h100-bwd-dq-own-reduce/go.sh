#!/bin/bash
# dq_own_reduce (each warpgroup adds its own part of the staged dQ tile after its own
# barrier) against the default, same binary: the backward suite default, own, default,
# own, then own+dq_under_dk (d128: FA4's order) twice; then the selftest of the tuned
# kernels (gradients against the f64 reference) on d64 and d128 variants.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w46; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
i=0
for v in def own def own ownk ownk; do
  i=$((i+1))
  case $v in
    def) T="";;
    own) T="dq_own_reduce=1";;
    ownk) T="dq_own_reduce=1,dq_under_dk=1";;
  esac
  ATTNC_HOPPER_BWD_TUNE=$T $R attnc bench --suites backward --json $W/bwd_${v}_$i.json > $W/bwd_${v}_$i.txt 2>&1
  echo "$v $i rc $? $(date -u)" >> $W/device.txt
done
E=dsl-examples; G=tests/gpu-specs
ATTNC_HOPPER_BWD_TUNE=dq_own_reduce=1 timeout 150 $R attnc selftest --family hopper --json $W/sel_own.json \
  $E/mqa_falcon.attn $E/vit_fp16.attn $G/gqa_d64.attn $G/varlen_gqa_d64.attn $E/mha.attn $E/causal.attn \
  $E/document_mask.attn $E/varlen_causal.attn > $W/sel_own.txt 2>&1
echo "sel_own rc $? $(date -u)" >> $W/device.txt
ATTNC_HOPPER_BWD_TUNE=dq_own_reduce=1,dq_under_dk=1 timeout 45 $R attnc selftest --family hopper --json $W/sel_ownk.json \
  $E/mha.attn $E/sliding_window.attn > $W/sel_ownk.txt 2>&1
echo "sel_ownk rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -5 $W/sel_own.txt $W/sel_ownk.txt
