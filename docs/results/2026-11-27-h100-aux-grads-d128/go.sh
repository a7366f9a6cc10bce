#!/bin/bash
# Learnable aux gradients at d128 on hopper with P parked in shared memory: the selftest of the two
# learnable examples, then alibi_learned's variant bench with the backward on hopper and on portable.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w8; mkdir -p $W; rm -f /tmp/attnc/attnc
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $W/gpu.txt
E=dsl-examples
$R attnc selftest $E/alibi_learned.attn $E/t5_bias.attn --json $W/selftest.json > $W/selftest.txt 2>&1
echo "selftest rc $?" >> $W/gpu.txt
$R attnc bench $E/alibi_learned.attn --batch 4 --seqlen 8192 --json $W/bench_hopper.json > $W/bench_hopper.txt 2>&1
ATTNC_HOPPER_BWD_TUNE=aux_grads=0 $R attnc bench $E/alibi_learned.attn --batch 4 --seqlen 8192 --json $W/bench_portable.json > $W/bench_portable.txt 2>&1
tar czf $OUT/w.tgz -C $W .
grep "^FAIL" $W/selftest.txt | head; tail -n 1 $W/selftest.txt; grep -h "backward" $W/bench_*.txt | head
