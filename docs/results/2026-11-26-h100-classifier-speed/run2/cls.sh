#!/bin/bash
# The block classifier with partial tiles' bits: ffd5f45 ("old": 8 words per warp step,
# aux scans 4 loads at a time) against 32 words per step and 16 loads at a time ("new"),
# interleaved; then the selftest of the aux-mask variants with the new binary.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; A=/tmp/aux
export PATH=/usr/local/cuda/bin:$PATH
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -rf /tmp/attnc /tmp/attnc_old
python3 $V/flex_variants.py write-aux $A > /dev/null
aux() { case $1 in document_mask_16h) echo "--aux doc=$A/doc.bin";; document_prefix) echo "--aux doc=$A/doc.bin --aux start=$A/start.bin --param prefix=128";; esac; }
for round in 1 2; do
  for who in old new; do
    for v in document_mask_16h document_prefix; do
      W=""; [ $who = old ] && W=old
      echo "== round $round $who $v"
      bash $D/run.sh $W attnc bench $V/$v.attn --batch 4 --seqlen 8192 $(aux $v) 2>&1 | grep -v "^\[" | tail -2 | grep -o "^[a-z0-9_]* \[hopper\].*ms, density\|built per call [0-9.]* ms, classification alone [0-9.]* ms\|classified in [0-9.]* ms); [0-9.]* ms"
    done
  done
done | tee $OUT/bench.txt
E=dsl-examples
timeout 200 bash $D/run.sh attnc selftest --family hopper --json $OUT/selftest.json $E/document_mask.attn $V/document_mask_16h.attn $V/document_prefix.attn $V/block_sparse_table.attn $V/scattered_mask.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "FAIL" $OUT/selftest.txt | head; tail -3 $OUT/selftest.txt
xz -T4 $OUT/selftest.json
date -u | tee -a $OUT/device.txt
