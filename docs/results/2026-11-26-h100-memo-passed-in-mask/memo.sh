#!/bin/bash
# A passed-in block mask through the launch memo: the aux-mask variants' selftest (the
# forward with the mask passed in bit-equal to per-call classification, backward reuse),
# then the document-mask bench (flex_variants layout) and causal, this binary.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; A=/tmp/aux
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -f /tmp/attnc/attnc
python3 $V/flex_variants.py write-aux $A > /dev/null 2>&1
B="--batch 4 --seqlen 8192"
bash $D/run.sh attnc selftest --json $OUT/selftest.json $V dsl-examples/document_mask.attn dsl-examples/prefix_lm.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "^FAIL" $OUT/selftest.txt | head; tail -2 $OUT/selftest.txt
{
for i in 1 2; do
bash $D/run.sh attnc bench $V/document_mask_16h.attn $B --aux doc=$A/doc.bin 2>&1 | grep -v "^\[" | tail -2
done
bash $D/run.sh attnc bench $V/document_prefix.attn $B --aux doc=$A/doc.bin --aux start=$A/start.bin --param prefix=128 2>&1 | grep -v "^\[" | tail -2
bash $D/run.sh attnc bench $V/causal_16h.attn $B 2>&1 | grep -v "^\[" | tail -2
} 2>&1 | tee $OUT/bench.txt
xz -T4 $OUT/selftest.json
date -u >> $OUT/device.txt
