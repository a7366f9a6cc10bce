#!/bin/bash
# The gather's row loop kept a loop (gather_rolled=1: .pragma "nounroll", 132 -> 20 LDGSTS
# in the page-1 decode twin, 7048 -> 5376 SASS instructions). Selftest of the paged specs
# with it, then the decode suite: default vs r, two rounds alternating.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w103; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
G=docs/results/2026-11-28-h100-gather-window
T=ATTNC_HOPPER_TUNE
env $T=gather_rolled=1 timeout 150 $R attnc selftest --json $W/sel.json $G/decode_p1.attn $G/decode_p3.attn tests/gpu-specs/paged_page1_d64.attn dsl-examples/gqa_decode_paged.attn > $W/sel.txt 2>&1
echo "selftest r rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel.txt; grep FAIL $W/sel.txt | head -5
if grep -q FAIL $W/sel.txt || ! grep -q "0 failed" $W/sel.txt; then echo "selftest failed: no A/B" >> $W/device.txt; cat $W/device.txt; exit 1; fi
export PATH=/tmp/attnc:$PATH ATTNC_PTXAS=/tmp/attnc/ptxas
ROUNDS=2 timeout 330 bash $D/ab_tune.sh decode $W/ab 'def=' "r=$T=gather_rolled=1"
echo "ab rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt $W/ab/device.txt
for f in $W/ab/decode_*.txt; do echo "== $f"; grep -E "^\s+(1|8|64)\s+(4096|32768)\s+1\s" $f; done
