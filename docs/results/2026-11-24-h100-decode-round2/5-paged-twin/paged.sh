#!/bin/bash
# Paged decode twin: selftest of the paged specs (auto), then the decode suite.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
bash $D/run.sh attnc selftest --json $OUT/selftest_paged.json dsl-examples/gqa_decode_paged.attn tests/gpu-specs > $OUT/selftest_paged.txt 2>&1
echo "selftest rc=$?"; grep "^FAIL" $OUT/selftest_paged.txt | head; tail -1 $OUT/selftest_paged.txt
bash $D/run.sh attnc bench --suites ceilings,decode --json $OUT/decode.json > $OUT/decode.txt 2>$OUT/decode.err
echo "bench rc=$?"; sed -n '/^decode (/,$p' $OUT/decode.txt
date -u | tee -a $OUT/device.txt
