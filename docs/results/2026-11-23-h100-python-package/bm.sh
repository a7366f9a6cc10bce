#!/bin/bash
mkdir -p /tmp/pyattnc; python3 -m pip install -q --upgrade --no-deps --no-index --target /tmp/pyattnc .device/r16/attnc-*.whl 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=/tmp/pyattnc
date -u > $OUT/device.txt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $OUT/device.txt
python3 .device/r16/bm.py $OUT/block_mask.json 2>&1 | grep -v "^DEBUG" | tail -8
python3 -m attnc.compare dsl-examples/document_mask.attn --seqlen 1024,4096,8192 --batch 4 --json $OUT/timed_document_mask_bm.json 2>&1 | grep -v "^DEBUG\|Warning\|warn\|print statements\|_compile=True" | tail -5
