#!/bin/bash
# Query-tile runs per CTA (Config::tiles_per_cta via ATTNC_HOPPER_TUNE): 1 (today's
# grid), 2, 4, interleaved: the document mask and causal variant benches, the protocol's
# prefill suite; then a forward selftest with runs of 2.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; E=dsl-examples; A=/tmp/aux
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -rf /tmp/attnc
python3 $V/flex_variants.py write-aux $A > /dev/null
B="--batch 4 --seqlen 8192"
for round in 1 2; do
  for t in 1 2 4; do
    export ATTNC_HOPPER_TUNE=tiles_per_cta=$t
    echo "== round $round tiles_per_cta=$t"
    bash $D/run.sh attnc bench $V/document_mask_16h.attn $B --aux doc=$A/doc.bin --json /tmp/dm_${t}_$round.json 2>&1 | grep -v "^\[" | tail -2
    bash $D/run.sh attnc bench $V/causal_16h.attn $B --json /tmp/ca_${t}_$round.json 2>&1 | grep -v "^\[" | tail -2
  done
done > $OUT/variants.txt 2>&1
grep -E "^==|ms," $OUT/variants.txt | cut -c1-150
for t in 1 2 4; do
  export ATTNC_HOPPER_TUNE=tiles_per_cta=$t
  echo "== prefill tiles_per_cta=$t"
  timeout 100 bash $D/run.sh attnc bench --quick --suites prefill --json $OUT/prefill_$t.json 2>&1 | grep -v "^\[" | grep -i "d64\|d128\|TFLOP\|causal" | head -30
done > $OUT/prefill.txt 2>&1
tail -40 $OUT/prefill.txt
export ATTNC_HOPPER_TUNE=tiles_per_cta=2
timeout 150 bash $D/run.sh attnc selftest --family hopper --no-grads --json $OUT/selftest.json $E/causal.attn $E/mha.attn $E/document_mask.attn $E/varlen_causal.attn $E/mqa_falcon.attn $E/sliding_window.attn $E/sinks.attn $E/vit_fp16.attn $E/deepseek.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "FAIL" $OUT/selftest.txt | head; tail -2 $OUT/selftest.txt
date -u | tee -a $OUT/device.txt
