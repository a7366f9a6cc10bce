#!/bin/bash
# A/B: aux masks on 128-key hopper tiles with ordered per-key aux loads (env-gated build).
V=benches/variants; A=/tmp/aux
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt; date -u >> $OUT/device.txt
python3 $V/flex_variants.py write-aux $A > /dev/null
B="--batch 4 --seqlen 8192"
run() { # tag, env...
  tag=$1; shift
  env "$@" attnc bench $V/document_mask_16h.attn $B --aux doc=$A/doc.bin --json $OUT/${tag}_doc.json | tail -1 | sed "s/^/$tag: /" | cut -c1-400
  env "$@" attnc bench $V/document_prefix.attn $B --aux doc=$A/doc.bin --aux start=$A/start.bin --param prefix=128 --json $OUT/${tag}_prefix.json | tail -1 | sed "s/^/$tag: /" | cut -c1-400
  env "$@" attnc bench $V/block_sparse_table.attn $B --aux layout=$A/layout.bin --json $OUT/${tag}_table.json | tail -1 | sed "s/^/$tag: /" | cut -c1-400
}
run base X=1
run ord128 ATTNC_ORDERED_KEY_AUX=1 ATTNC_HOPPER_TUNE=block_n=128
run ord64 ATTNC_ORDERED_KEY_AUX=1
run base2 X=1
ATTNC_ORDERED_KEY_AUX=1 ATTNC_HOPPER_TUNE=block_n=128 attnc selftest --json $OUT/selftest_ord128.json dsl-examples/document_mask.attn \
  dsl-examples/t5_bias.attn $V/document_mask_16h.attn $V/document_prefix.attn $V/block_sparse_table.attn $V/scattered_mask.attn 2>&1 | tail -2
