#!/bin/bash
# FA4's SM90 dQ path at d128: each consumer warpgroup stages its own half of the dQ tile and
# hands it to a writer warp through a 160-thread named barrier (dq_writer=1), no second
# 256-thread barrier, no bulk reduce in the consumers; alone and with dQ issued before dK
# (dq_under_dk=1, FA4's order). Selftest of dq_writer=1, then the backward suite: default,
# w, wu; two rounds, alternating.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w99; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples
T=ATTNC_HOPPER_BWD_TUNE
env $T=dq_writer=1 timeout 100 $R attnc selftest --json $W/sel.json $E/mha.attn $E/causal.attn $E/varlen_causal.attn $E/grok_softcap.attn > $W/sel.txt 2>&1
if grep -q FAIL $W/sel.txt || ! grep -q "0 failed" $W/sel.txt; then echo "selftest failed: no A/B" >> $W/device.txt; cat $W/device.txt; exit 1; fi
echo "selftest w rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel.txt; grep FAIL $W/sel.txt | head -5
export PATH=/tmp/attnc:$PATH ATTNC_PTXAS=/tmp/attnc/ptxas
ROUNDS=2 timeout 300 bash $D/ab_tune.sh backward $W/ab 'def=' "w=$T=dq_writer=1" "wu=$T=dq_writer=1,dq_under_dk=1"
echo "ab rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt $W/ab/device.txt
python3 scripts/dev/ab_compare.py $W/ab backward def 2>&1 | grep "^| 128\|^| d"
