#!/bin/bash
# The selftest with gradients of the given files/folders on this binary: sel.sh PATHS...
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/wsel; mkdir -p $W; rm -f /tmp/attnc/attnc
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 570 $D/run.sh attnc selftest "$@" --json $W/selftest.json > $W/selftest.txt 2>&1
echo "selftest rc=$?" >> $W/device.txt; date -u >> $W/device.txt
tar czf $OUT/sel.tgz -C $W .
grep "^FAIL" $W/selftest.txt | head; tail -2 $W/selftest.txt
