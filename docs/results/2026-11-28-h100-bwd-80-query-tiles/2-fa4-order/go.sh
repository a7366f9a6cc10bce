#!/bin/bash
# FA4's SM90 d128 iteration order on top of the 80-query transposed tiles: dQ issued before dK
# and staged while dK runs (dq_under_dk=1). Selftest of the combination (mha, causal), then the
# backward suite: default, dq_under_dk alone, 80-query tiles, both; two rounds, alternating.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w98; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples
T=ATTNC_HOPPER_BWD_TUNE
env $T=block_m=80,dq_split=3,dq_under_dk=1 timeout 100 $R attnc selftest --json $W/sel.json $E/mha.attn $E/causal.attn > $W/sel.txt 2>&1
echo "selftest t80u rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel.txt; grep FAIL $W/sel.txt | head -5
export PATH=/tmp/attnc:$PATH ATTNC_PTXAS=/tmp/attnc/ptxas
ROUNDS=2 timeout 420 bash $D/ab_tune.sh backward $W/ab 'def=' "u=$T=dq_under_dk=1" "t80=$T=block_m=80,dq_split=3" "t80u=$T=block_m=80,dq_split=3,dq_under_dk=1"
echo "ab rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt $W/ab/device.txt
python3 scripts/dev/ab_compare.py $W/ab backward def 2>&1 | grep "^| 128\|^| d"
