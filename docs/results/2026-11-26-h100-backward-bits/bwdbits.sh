#!/bin/bash
# The hopper backward reading partial tiles' bits (BlockLayout::DenseWithBits, key-major)
# ("new") against evaluating the mask per element (e06d29b, "old"): the gradient selftest
# of the aux-mask variants first, then the variant benches interleaved.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; E=dsl-examples; A=/tmp/aux
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -rf /tmp/attnc /tmp/attnc_old
python3 $V/flex_variants.py write-aux $A > /dev/null
timeout 200 bash $D/run.sh attnc selftest --family hopper --json $OUT/selftest.json $E/document_mask.attn $V/document_mask_16h.attn $V/document_prefix.attn $V/block_sparse_table.attn $V/scattered_mask.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "FAIL" $OUT/selftest.txt | head; tail -3 $OUT/selftest.txt
xz -T4 $OUT/selftest.json
aux() { case $1 in document_mask_16h) echo "--aux doc=$A/doc.bin";; document_prefix) echo "--aux doc=$A/doc.bin --aux start=$A/start.bin --param prefix=128";; block_sparse_table) echo "--aux layout=$A/layout.bin";; esac; }
for round in 1 2; do
  for who in old new; do
    L="document_mask_16h"; [ $round = 1 ] && L="document_mask_16h document_prefix block_sparse_table"
    for v in $L; do
      W=""; [ $who = old ] && W=old
      echo "== round $round $who $v"
      bash $D/run.sh $W attnc bench $V/$v.attn --batch 4 --seqlen 8192 $(aux $v) 2>&1 | grep -v "^\[" | tail -2 | head -1
    done
  done
done | tee $OUT/bench.txt | grep -o "^==.*\|backward [0-9.]* ms\|classified per call [0-9.]* ms"
date -u | tee -a $OUT/device.txt
