#!/bin/bash
# #13 after the fragment-order dq_accum: the rest of the selftest with gradients (the
# examples the previous command's 300 s did not reach, the GPU specs, the aux-mask
# variants), then the variant backwards beside FlexAttention in the same command.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
V=benches/variants; E=dsl-examples; A=/tmp/aux
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
timeout 290 $D/run.sh attnc selftest $E/sinks.attn $E/sliding_window.attn $E/varlen_causal.attn $E/t5_bias.attn \
  $E/vit_fp16.attn tests/gpu-specs $V/document_prefix.attn $V/block_sparse_table.attn $V/scattered_mask.attn \
  > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
python3 $V/flex_variants.py write-aux $A > /dev/null
aux() { case $1 in document_mask_16h) echo "--aux doc=$A/doc.bin";; block_sparse_table) echo "--aux layout=$A/layout.bin";; esac; }
for v in causal_16h sliding_window_16h softcap_16h alibi_16h document_mask_16h block_sparse_table; do
  echo "== $v"; $D/run.sh attnc bench $V/$v.attn --batch 4 --seqlen 8192 $(aux $v) 2>&1 | grep -v "^\["
done > $OUT/bench.txt 2>&1
date -u >> $OUT/device.txt
timeout 230 python3 $V/flex_variants.py time $A $OUT/flex.json > $OUT/flex.txt 2>&1; echo "flex rc $?" >> $OUT/device.txt
date -u >> $OUT/device.txt
