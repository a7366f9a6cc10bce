#!/bin/bash
# The selftest of the two GQA d64 GPU specs on the binary with the new step-down ladder
# (gqa_d64: the default spills, "dS from the bf16 P"; varlen_gqa_d64's shard twin: "no
# ordered deterministic mode" alone).
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w42; mkdir -p $W; rm -f /tmp/attnc/attnc
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 300 $R attnc selftest tests/gpu-specs/gqa_d64.attn tests/gpu-specs/varlen_gqa_d64.attn --json $W/selftest.json > $W/selftest.txt 2>&1
echo "selftest rc $?" >> $W/device.txt; date -u >> $W/device.txt
tar czf $OUT/w.tgz -C $W .
tail -n 3 $W/selftest.txt
