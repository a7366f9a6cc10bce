#!/bin/bash
# #11 follow-up: key-invariant aux scans. "old" = 11bf7b8 (main); "new" = the same with
# the classifier scanning aux reads whose index does not use the key once per row tile
# (a warp's lanes sharing it) for every tile and column classification. No Flex here (see
# 2026-11-27-h100-classifier-queue for it).
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; E=dsl-examples; A=/tmp/aux
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -rf /tmp/attnc /tmp/attnc_old
python3 $V/flex_variants.py write-aux $A > /dev/null
aux() { case $1 in document_mask_16h) echo "--aux doc=$A/doc.bin";; document_prefix) echo "--aux doc=$A/doc.bin --aux start=$A/start.bin --param prefix=128";; block_sparse_table) echo "--aux layout=$A/layout.bin";; scattered_mask) echo "--aux tag=$A/tag.bin";; esac; }
for round in 1 2; do
  for who in old new; do
    L="document_mask_16h document_prefix"; [ $round = 1 ] && L="document_mask_16h document_prefix block_sparse_table scattered_mask"
    for v in $L; do
      W=""; [ $who = old ] && W=old
      echo "== round $round $who $v"
      bash $D/run.sh $W attnc bench $V/$v.attn --batch 4 --seqlen 8192 $(aux $v) --json /tmp/${who}_${v}_$round.json 2>&1 | grep -v "^\["
    done
  done
done > $OUT/bench.txt 2>&1
cat /tmp/old_*.json /tmp/new_*.json > $OUT/bench.jsonl 2>/dev/null
grep -o "^==.*\|built per call [0-9.]* ms, classification alone [0-9.]* ms\|GPU time [0-9.]* ms, [0-9.]*% of the forward\|classified in [0-9.]* ms); [0-9.]* ms\|backward [0-9.]* ms" $OUT/bench.txt | head -80
timeout 200 bash $D/run.sh attnc selftest --family hopper --json $OUT/selftest.json $E/document_mask.attn $V/document_mask_16h.attn $V/document_prefix.attn $V/block_sparse_table.attn $V/scattered_mask.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "FAIL" $OUT/selftest.txt | head; tail -3 $OUT/selftest.txt
xz -T4 $OUT/selftest.json
date -u | tee -a $OUT/device.txt
