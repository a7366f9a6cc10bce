#!/bin/bash
# Aux masks: partial tiles' bits written by the classifier and loaded by the hopper forward (new)
# against evaluated per element under S (old, b4c4a11), interleaved, beside
# FlexAttention in one call; then the block-mask selftest of the aux-mask variants.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; E=dsl-examples; A=/tmp/aux
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -rf /tmp/attnc /tmp/attnc_old
python3 $V/flex_variants.py write-aux $A > /dev/null
B="--batch 4 --seqlen 8192"
aux() { case $1 in document_mask_16h) echo "--aux doc=$A/doc.bin";; document_prefix) echo "--aux doc=$A/doc.bin --aux start=$A/start.bin --param prefix=128";; block_sparse_table) echo "--aux layout=$A/layout.bin";; scattered_mask) echo "--aux tag=$A/tag.bin";; esac; }
for round in 1 2; do
  for who in old new; do
    L="document_mask_16h"; [ $round = 1 ] && [ $who = new ] && L="document_mask_16h document_prefix block_sparse_table scattered_mask"
    for v in $L; do
      W=""; [ $who = old ] && W=old
      echo "== round $round $who $v"
      bash $D/run.sh $W attnc bench $V/$v.attn $B $(aux $v) --json /tmp/${who}_${v}_$round.json 2>&1 | grep -v "^\[" | tail -4
    done
  done
done > $OUT/bench.txt 2>&1
cat /tmp/old_*.json /tmp/new_*.json > $OUT/bench.jsonl 2>/dev/null
grep -E "^==|ms" $OUT/bench.txt | head -60
timeout 240 python3 $V/flex_variants.py time $A $OUT/flex.json > $OUT/flex.txt 2>&1; echo "flex rc=$?"
grep -v "^DEBUG\|Warning\|warn" $OUT/flex.txt | tail -12
timeout 200 bash $D/run.sh attnc selftest --family hopper --json $OUT/selftest.json $E/document_mask.attn $V/document_mask_16h.attn $V/document_prefix.attn $V/block_sparse_table.attn $V/scattered_mask.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "FAIL" $OUT/selftest.txt | head; tail -3 $OUT/selftest.txt
xz -T4 $OUT/selftest.json
timeout 100 bash $D/run.sh attnc selftest --family portable --quick dsl-examples/document_mask.attn > $OUT/selftest_portable.txt 2>&1
echo "portable selftest rc=$?"; tail -2 $OUT/selftest_portable.txt
date -u | tee -a $OUT/device.txt
