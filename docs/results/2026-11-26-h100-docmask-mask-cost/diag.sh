#!/bin/bash
# Diagnostic (wrong results on purpose): what the document mask's per-element work costs
# in the hopper forward. diag_mask=0 as built; 1 the partial tile's mask without its aux
# compare (bounds only); 2 the bits all ones (the apply step only); 3 steady-state steps
# unmasked.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; A=/tmp/aux
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -rf /tmp/attnc
python3 $V/flex_variants.py write-aux $A > /dev/null
for round in 1 2; do
  for t in 0 1 2 3; do
    echo "== round $round diag_mask=$t"
    ATTNC_HOPPER_TUNE=diag_mask=$t bash $D/run.sh attnc bench $V/document_mask_16h.attn --batch 4 --seqlen 8192 --aux doc=$A/doc.bin --iters 40 2>&1 | grep -v "^\[" | grep "effective" | cut -c1-120
  done
done | tee $OUT/diag.txt
date -u | tee -a $OUT/device.txt
