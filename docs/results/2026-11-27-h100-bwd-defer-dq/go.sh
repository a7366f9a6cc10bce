#!/bin/bash
# dQ's GEMM issued ahead of the next tile's S^T and added under it (defer_dq; dP^T after P, since both
# do not fit the registers): correctness, then the backward suite alternating with the default.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w6; mkdir -p $W; rm -f /tmp/attnc/attnc
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $W/gpu.txt
E=dsl-examples; T=defer_dq=1,dq_under_dk=0,dp_with_s=0
ATTNC_HOPPER_BWD_TUNE=$T $R attnc selftest $E/causal.attn $E/mha.attn $E/mqa_falcon.attn $E/varlen_causal.attn $E/document_mask.attn $E/sinks.attn --json $W/selftest_defer.json > $W/selftest_defer.txt 2>&1
echo "selftest rc $?" >> $W/gpu.txt
i=0
for t in "" $T "" $T; do
  i=$((i+1)); n=${t:-default}; [ -n "$t" ] && n=defer; n=${n}_$i
  ATTNC_HOPPER_BWD_TUNE=$t $R attnc bench --suites backward --json $W/bwd_$n.json > $W/bwd_$n.txt 2>&1
done
tar czf $OUT/w.tgz -C $W .
grep -E "^FAIL" $W/selftest_defer.txt | head; tail -n 1 $W/selftest_defer.txt; grep -h "16384" $W/bwd_*.txt | grep -v "^ " | head -40
