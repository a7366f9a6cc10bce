#!/bin/bash
# 30bcd4b: the block-mask harness fix (Kernel::block_mask without the LSE) and the new
# d64 GPU spec — selftest with gradients of varlen_document_d64 (varlen, GQA, lse, a mask
# over aux tensors; spills at its default, runs the step-down), tests/gpu-specs (all),
# and the d128 aux-mask example document_mask.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
timeout 400 $D/run.sh attnc selftest $D/varlen_document_d64.attn tests/gpu-specs dsl-examples/document_mask.attn \
  --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?" >> $OUT/device.txt; date -u >> $OUT/device.txt
