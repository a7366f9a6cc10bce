#!/bin/bash
# Block masks in the backward (#11): selftest of every aux-mask spec, then the variant
# bench (forward and backward, mask passed in vs per call) beside FlexAttention.
V=benches/variants; A=/tmp/aux
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt; date -u >> $OUT/device.txt
python3 $V/flex_variants.py write-aux $A > /dev/null
attnc selftest --json $OUT/selftest_aux.json dsl-examples/document_mask.attn dsl-examples/alibi_learned.attn \
  dsl-examples/t5_bias.attn $V/document_mask_16h.attn $V/document_prefix.attn $V/block_sparse_table.attn \
  $V/scattered_mask.attn > $OUT/selftest_aux.txt 2>&1
tail -3 $OUT/selftest_aux.txt
B="--batch 4 --seqlen 8192"
attnc bench $V/document_mask_16h.attn $B --aux doc=$A/doc.bin --json $OUT/document_mask_16h.json | tail -1
attnc bench $V/document_prefix.attn $B --aux doc=$A/doc.bin --aux start=$A/start.bin --param prefix=128 --json $OUT/document_prefix.json | tail -1
attnc bench $V/block_sparse_table.attn $B --aux layout=$A/layout.bin --json $OUT/block_sparse_table.json | tail -1
attnc bench $V/scattered_mask.attn $B --aux tag=$A/tag.bin --json $OUT/scattered_mask.json | tail -1
attnc bench $V/sliding_window_16h.attn $B --json $OUT/sliding_window_16h.json | tail -1
attnc bench $V/causal_16h.attn $B --json $OUT/causal_16h.json | tail -1
python3 $V/flex_variants.py time $A $OUT/flex.json 2>&1 | grep -v "^DEBUG\|Warning\|warn" | tail -8
