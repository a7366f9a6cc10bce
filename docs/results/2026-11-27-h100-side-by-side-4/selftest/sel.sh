#!/bin/bash
# The whole selftest with gradients on the new binary (attnc.xz, 5796738), ~6.5 min.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w40; mkdir -p $W; rm -f /tmp/attnc/attnc
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 560 $R attnc selftest dsl-examples tests/gpu-specs --json $W/selftest.json > $W/selftest.txt 2>&1
echo "selftest rc $?" >> $W/device.txt; date -u >> $W/device.txt
xz -9 $W/selftest.json
tar czf $OUT/w.tgz -C $W .
grep -h "^FAIL" $W/selftest.txt | head; tail -n 2 $W/selftest.txt
