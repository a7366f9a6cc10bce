#!/bin/bash
# Selftest of the head: every example, GPU spec and bench variant, gradients included.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
rm -f /tmp/attnc/attnc
timeout 570 bash $D/run.sh attnc selftest --json $OUT/selftest.json dsl-examples tests/gpu-specs benches/variants > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "^FAIL" $OUT/selftest.txt | head -20; tail -1 $OUT/selftest.txt
xz -T4 $OUT/selftest.json
date -u | tee -a $OUT/device.txt
