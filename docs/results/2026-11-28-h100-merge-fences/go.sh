#!/bin/bash
# The fused split-KV combine's fences: merge_fences=1 (the release side by the counting
# thread's atom.acq_rel.gpu only) and 2 (both sides). Selftest of split specs with each,
# then the decode suite: default vs f1 vs f2, two rounds alternating.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w105; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
G=docs/results/2026-11-28-h100-gather-window
T=ATTNC_HOPPER_TUNE
SPECS="$G/decode_p1.attn $G/decode_p3.attn dsl-examples/gqa_decode_paged.attn tests/gpu-specs/split_sinks.attn"
for t in 1 2; do
  env $T=merge_fences=$t timeout 100 $R attnc selftest --json $W/sel_f$t.json $SPECS > $W/sel_f$t.txt 2>&1
  echo "selftest f$t rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel_f$t.txt
  if grep -q FAIL $W/sel_f$t.txt || ! grep -q "0 failed" $W/sel_f$t.txt; then echo "selftest f$t failed: no A/B" >> $W/device.txt; cat $W/device.txt; exit 1; fi
done
export PATH=/tmp/attnc:$PATH ATTNC_PTXAS=/tmp/attnc/ptxas
ROUNDS=2 timeout 400 bash $D/ab_tune.sh decode $W/ab 'def=' "f1=$T=merge_fences=1" "f2=$T=merge_fences=2"
echo "ab rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt $W/ab/device.txt
for f in $W/ab/decode_*.txt; do echo "== $f"; grep -E "^\s+(1|8)\s+(4096|32768)\s+(-|1)\s" $f; done
