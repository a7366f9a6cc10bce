#!/bin/bash
# dPᵀ issued with Sᵀ in its own wgmma group (runs during the softmax): correctness and speed against the default
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w5; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $W/gpu.txt
E=dsl-examples
ATTNC_HOPPER_BWD_TUNE=dp_with_s=1 $R attnc selftest $E/causal.attn $E/mha.attn $E/mqa_falcon.attn $E/varlen_causal.attn $E/vit_fp16.attn --json $W/selftest_dp_with_s.json > $W/selftest_dp_with_s.txt 2>&1
echo "selftest rc $?" >> $W/gpu.txt
i=0
for t in "" dp_with_s=1 "" dp_with_s=1; do
  i=$((i+1)); n=${t:-default}; n=$(echo $n | tr ',=' '__')_$i
  ATTNC_HOPPER_BWD_TUNE=$t $R attnc bench --suites backward --json $W/bwd_$n.json > $W/bwd_$n.txt 2>&1
done
tar czf $OUT/w.tgz -C $W .
tail -n 2 $W/selftest_dp_with_s.txt; grep -h "16384" $W/bwd_*.txt | head -40
