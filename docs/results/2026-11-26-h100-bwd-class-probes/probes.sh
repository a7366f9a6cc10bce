#!/bin/bash
# Backward walks over a launch's block classes probe 4 query tiles per step (loads in
# flight together) instead of one: the document-mask backward before (attnc_old, 80ee537's
# hopper codegen) and after, interleaved, beside causal and FlexAttention in one call;
# then the selftest of the block-mask variants with the new binary.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; E=dsl-examples; A=/tmp/aux
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -rf /tmp/attnc /tmp/attnc_old
python3 $V/flex_variants.py write-aux $A > /dev/null
B="--batch 4 --seqlen 8192"
for round in 1 2; do
  for who in old new; do
    W=""; [ $who = old ] && W=old
    echo "== round $round $who document_mask_16h"
    bash $D/run.sh $W attnc bench $V/document_mask_16h.attn $B --aux doc=$A/doc.bin --json /tmp/${who}_doc_$round.json 2>&1 | grep -v "^\[" | tail -3
    echo "== round $round $who causal_16h"
    bash $D/run.sh $W attnc bench $V/causal_16h.attn $B --json /tmp/${who}_causal_$round.json 2>&1 | grep -v "^\[" | tail -2
  done
done > $OUT/bench.txt 2>&1
cat /tmp/*_doc_*.json /tmp/*_causal_*.json > $OUT/bench.jsonl 2>/dev/null
grep -E "^==|effective" $OUT/bench.txt
timeout 300 python3 $V/flex_variants.py time $A $OUT/flex.json > $OUT/flex.txt 2>&1; echo "flex rc=$?"
grep -v "^DEBUG\|Warning\|warn" $OUT/flex.txt | grep -i "causal_16h\|document_mask" | head -4
timeout 240 bash $D/run.sh attnc selftest --json $OUT/selftest.json $E/document_mask.attn $V/document_mask_16h.attn $V/scattered_mask.attn $V/block_sparse_table.attn $V/document_prefix.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "^FAIL" $OUT/selftest.txt | head; tail -2 $OUT/selftest.txt
xz -T4 $OUT/selftest.json
date -u | tee -a $OUT/device.txt
