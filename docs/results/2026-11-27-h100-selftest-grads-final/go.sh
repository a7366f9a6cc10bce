#!/bin/bash
# The whole selftest with gradients (every example and GPU spec) on the session's last
# binary: pooled workspaces now grow twofold and are never freed mid-run.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w89; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 570 $R attnc selftest --json $W/sel.json dsl-examples tests/gpu-specs > $W/sel.txt 2>&1
echo "selftest rc $? $(date -u)" >> $W/device.txt
tail -n 1 $W/sel.txt; grep -c "PASS" $W/sel.txt; grep "FAIL" $W/sel.txt | head -5
gzip -9 -n $W/sel.json; xz -9 $W/sel.txt
cat $W/device.txt
