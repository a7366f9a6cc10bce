#!/bin/bash
# split_s=1 (branch wip/bwd-split-s): S^T as two N-half GEMMs in two wgmma groups, the
# first half's exponentials under the second half's GEMM. Selftest (d128 examples), then
# the backward suite: default vs s, two rounds alternating.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w101; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples
T=ATTNC_HOPPER_BWD_TUNE
env $T=split_s=1 timeout 120 $R attnc selftest --json $W/sel.json $E/mha.attn $E/causal.attn $E/varlen_causal.attn $E/grok_softcap.attn > $W/sel.txt 2>&1
echo "selftest s rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel.txt; grep FAIL $W/sel.txt | head -5
if grep -q FAIL $W/sel.txt || ! grep -q "0 failed" $W/sel.txt; then echo "selftest failed: no A/B" >> $W/device.txt; cat $W/device.txt; exit 1; fi
export PATH=/tmp/attnc:$PATH ATTNC_PTXAS=/tmp/attnc/ptxas
ROUNDS=2 timeout 300 bash $D/ab_tune.sh backward $W/ab 'def=' "s=$T=split_s=1"
echo "ab rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt $W/ab/device.txt
python3 scripts/dev/ab_compare.py $W/ab backward def 2>&1 | grep "^| 128\|^| 64\|^| d"
