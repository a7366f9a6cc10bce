#!/bin/bash
# The whole selftest (gradients included) of the examples and the GPU coverage specs: the decode twin and the fused combine.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
timeout 560 bash $D/run.sh attnc selftest --json $OUT/selftest.json dsl-examples tests/gpu-specs > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "^FAIL" $OUT/selftest.txt | head -20; tail -1 $OUT/selftest.txt
xz -k -T4 $OUT/selftest.json && rm $OUT/selftest.json
date -u | tee -a $OUT/device.txt
