#!/bin/bash
mkdir -p /tmp/pyattnc; python3 -m pip install -q --upgrade --no-deps --no-index --target /tmp/pyattnc .device/r16/attnc-*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=/tmp/pyattnc
date -u > $OUT/device.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $OUT/device.txt
python3 -m attnc.compare dsl-examples/varlen_causal.attn --seqlen 1000,2049 --batch 2 --check-only --json $OUT/varlen.json 2>&1 | grep -v "^DEBUG\|Warning\|warn\|print statements" | tail -4
for n in document_mask sliding_window; do
  python3 -m attnc.compare dsl-examples/$n.attn --seqlen 1024,4096,8192 --batch 4 --json $OUT/timed_$n.json 2>&1 | grep -v "^DEBUG\|Warning\|warn\|print statements" | tail -5
done
