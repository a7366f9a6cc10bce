#!/bin/bash
# The document-mask forward: bench times (the flex_variants doc layout and the bench's own
# fill) beside the kernel's own duration under Nsight Compute, same layouts.
D=$(cd "$(dirname "$0")" && pwd)
export PATH=/usr/local/cuda/bin:$PATH
V=benches/variants; A=/tmp/aux
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
python3 $V/flex_variants.py write-aux $A > /dev/null 2>&1; ls $A
B="--batch 4 --seqlen 8192"
{
for fill in flexdoc benchfill; do
  X=""; [ $fill = flexdoc ] && X="--aux doc=$A/doc.bin"
  echo "== bench $fill"; bash $D/run.sh attnc bench $V/document_mask_16h.attn $B $X 2>&1 | grep -v "^\[" | tail -4
  echo "== ncu $fill"; bash $D/run.sh ncu --clock-control none -k regex:'document_mask_16h_hopper_fwd$' -c 3 --section SpeedOfLight attnc bench $V/document_mask_16h.attn $B $X --iters 1 2>&1 | grep -E "Duration|SM Frequency"
done
echo "== bench causal"; bash $D/run.sh attnc bench $V/causal_16h.attn $B 2>&1 | grep -v "^\[" | tail -3
} 2>&1 | tee $OUT/out.txt
date -u >> $OUT/device.txt
