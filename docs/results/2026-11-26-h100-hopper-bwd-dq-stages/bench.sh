#!/bin/bash
# The hopper backward with one vs two dQ staging slots (ATTNC_HOPPER_BWD_TUNE=dq_stages=2),
# same binary, same call: the protocol's backward suite and two 8k variants; then the
# gradient selftest of eight variants with two slots.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
for t in "" dq_stages=2 "" dq_stages=2; do
  tag=${t:-default}; tag=${tag/=/}
  echo "=== ATTNC_HOPPER_BWD_TUNE=$t"
  ATTNC_HOPPER_BWD_TUNE=$t timeout 150 bash $D/run.sh attnc bench --suites backward --json /tmp/suite_$tag.json 2>&1 | grep -v "^\[" | tail -25
  for a in "dsl-examples/mha.attn --batch 2" "benches/variants/causal_16h.attn --batch 4"; do
    ATTNC_HOPPER_BWD_TUNE=$t timeout 60 bash $D/run.sh attnc bench $a --seqlen 8192 --iters 15 2>&1 | grep -i -E "backward|bwd|forward|fwd" | head -6
  done
done > $OUT/bench.txt 2>&1
cp /tmp/suite_default.json $OUT/suite_default.json; cp /tmp/suite_dq_stages2.json $OUT/suite_dq_stages2.json
ATTNC_HOPPER_BWD_TUNE=dq_stages=2 timeout 200 bash $D/run.sh attnc selftest dsl-examples/{mha,causal,mqa_falcon,varlen_causal,document_mask,sliding_window,grok_softcap,sinks}.attn > $OUT/selftest_dq2.txt 2>&1
echo "selftest rc=$?"; tail -2 $OUT/selftest_dq2.txt
date -u | tee -a $OUT/device.txt
