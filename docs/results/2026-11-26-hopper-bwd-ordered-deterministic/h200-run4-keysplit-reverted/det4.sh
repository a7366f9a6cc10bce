#!/bin/bash
# The ordered deterministic backward with the dQ writer, now also at d64/96 (key split):
# gradient selftest (bits compared on each variant's first and last shape), then the
# protocol's backward suite.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
rm -f /tmp/attnc/attnc
timeout 300 bash $D/run.sh attnc selftest --json /tmp/selftest.json dsl-examples/{mha,causal,causal_bottom_right,varlen_causal,document_mask,sliding_window,grok_softcap,sinks,alibi,chunked_local,prefix_lm,mqa_falcon,vit_fp16}.attn tests/gpu-specs/head_dim_96.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep -c "=o" $OUT/selftest.txt; grep "^FAIL" $OUT/selftest.txt | head; tail -1 $OUT/selftest.txt
xz -T4 -c /tmp/selftest.json > $OUT/selftest.json.xz
timeout 220 bash $D/run.sh attnc bench --suites backward --json $OUT/suite.json > $OUT/bench.txt 2>&1
echo "bench rc=$?"; grep -v "^\[" $OUT/bench.txt | tail -30
date -u | tee -a $OUT/device.txt
