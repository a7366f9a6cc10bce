#!/bin/bash
# The gather producer's four warps on one copy of the code (gather_shared=1; 7048 -> 4936
# SASS instructions in the page-1 decode twin), alone and with the row loop rolled
# (gather_rolled=1; 4496). Selftest of the paged specs (default code, s, sr), then the
# decode suite: default vs s vs sr, two rounds alternating.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w104; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
G=docs/results/2026-11-28-h100-gather-window
T=ATTNC_HOPPER_TUNE
SPECS="$G/decode_p1.attn $G/decode_p3.attn tests/gpu-specs/paged_page1_d64.attn dsl-examples/gqa_decode_paged.attn"
for t in def s sr; do
  case $t in def) e="";; s) e="gather_shared=1";; sr) e="gather_shared=1,gather_rolled=1";; esac
  env $T=$e timeout 100 $R attnc selftest --json $W/sel_$t.json $SPECS > $W/sel_$t.txt 2>&1
  echo "selftest $t rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel_$t.txt
  if grep -q FAIL $W/sel_$t.txt || ! grep -q "0 failed" $W/sel_$t.txt; then echo "selftest $t failed: no A/B" >> $W/device.txt; cat $W/device.txt; exit 1; fi
done
export PATH=/tmp/attnc:$PATH ATTNC_PTXAS=/tmp/attnc/ptxas
ROUNDS=2 timeout 400 bash $D/ab_tune.sh decode $W/ab 'def=' "s=$T=gather_shared=1" "sr=$T=gather_shared=1,gather_rolled=1"
echo "ab rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt $W/ab/device.txt
for f in $W/ab/decode_*.txt; do echo "== $f"; grep -E "^\s+(1|8|64)\s+(4096|32768)\s+(-|1)\s" $f; done
