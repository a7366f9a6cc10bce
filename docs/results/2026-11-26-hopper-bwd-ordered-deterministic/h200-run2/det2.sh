#!/bin/bash
# The ordered deterministic backward with key tiles walked from the last: gradient
# selftest of five variants, then the protocol's backward suite.
D=$(cd "$(dirname "$0")" && pwd)
rm -f /tmp/attnc/attnc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
timeout 200 bash $D/run.sh attnc selftest dsl-examples/{mha,causal,varlen_causal,document_mask,sliding_window,chunked_local}.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep -c "=o" $OUT/selftest.txt; grep "^FAIL" $OUT/selftest.txt | head; tail -1 $OUT/selftest.txt
timeout 220 bash $D/run.sh attnc bench --suites backward --json $OUT/suite.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -v "^\[" $OUT/bench.txt | tail -22
date -u | tee -a $OUT/device.txt
