#!/bin/bash
# A share of P's exponentials on the FMA pipe in the backward (exp2_emulate_every = 8, 4): correctness, then
# the backward suite default / every 8th / every 4th, twice.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w7; mkdir -p $W; rm -f /tmp/attnc/attnc
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $W/gpu.txt
E=dsl-examples
ATTNC_HOPPER_BWD_TUNE=exp2_emulate_every=4 $R attnc selftest $E/mqa_falcon.attn $E/mha.attn $E/vit_fp16.attn --json $W/selftest_emul4.json > $W/selftest_emul4.txt 2>&1
echo "selftest rc $?" >> $W/gpu.txt
i=0
for t in "" exp2_emulate_every=8 exp2_emulate_every=4 "" exp2_emulate_every=8 exp2_emulate_every=4; do
  i=$((i+1)); n=${t:-default}; n=$(echo $n | tr ',=' '__')_$i
  ATTNC_HOPPER_BWD_TUNE=$t $R attnc bench --suites backward --json $W/bwd_$n.json > $W/bwd_$n.txt 2>&1
done
tar czf $OUT/w.tgz -C $W .
tail -n 1 $W/selftest_emul4.txt
