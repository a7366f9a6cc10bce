#!/bin/bash
# dS from the f32 P for bias score mods (ALiBi, T5; slope 1): gradients of the specs it
# changes, then the ALiBi variant's backward against p_f32_for_ds=0, three rounds.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w90; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 150 $R attnc selftest --json $W/sel.json dsl-examples/t5_bias.attn dsl-examples/alibi.attn benches/variants/alibi_16h.attn > $W/sel.txt 2>&1
echo "selftest rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel.txt; grep FAIL $W/sel.txt | head -3
grep -E "^PASS (t5_bias|alibi) " $W/sel.txt | awk '{print $1, $2, $3, $4, $9}' | head -24
V=benches/variants
for round in 1 2 3; do
  for cfg in def p_f32_for_ds=0; do
    T=$cfg; [ $cfg = def ] && T=""
    echo "== $round $cfg"
    ATTNC_HOPPER_BWD_TUNE=$T timeout 60 $R attnc bench $V/alibi_16h.attn --batch 4 --seqlen 8192 --json $W/b_${round}_$cfg.json 2>&1 | grep -v "^\[" | grep TFLOP
  done
done > $W/bench.txt 2>&1
grep -E "^==|backward" $W/bench.txt | sed -E 's/.*backward ([0-9.]+ ms).*/\1/' | paste - - 
cat $W/device.txt
