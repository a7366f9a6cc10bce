#!/bin/bash
# The whole gradient selftest (--quick) with the backward launch memo's replay check
# (deterministic cases: a repeated untimed call replayed, its outputs and workspace poisoned
# first, bit-identical to the deterministic run).
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/wsel302; rm -rf $W; mkdir -p $W; trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 400 $D/run.sh attnc selftest --quick --json $W/selftest.json dsl-examples tests/gpu-specs > $W/selftest.txt 2>&1
echo "selftest rc $? $(date -u)" >> $W/device.txt; tail -n 3 $W/selftest.txt; grep -c "^\[.*FAIL" $W/selftest.txt; grep "FAIL" $W/selftest.txt | head
cat $W/device.txt
