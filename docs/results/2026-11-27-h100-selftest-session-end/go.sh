#!/bin/bash
# The session's last binary: the forward selftest of every example and GPU spec on the
# hopper family (the merge's first step, LPT sections of 8 MiB).
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w78; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 250 $R attnc selftest --no-grads --family hopper --json $W/sel_fwd.json dsl-examples/*.attn tests/gpu-specs/*.attn > $W/sel_fwd.txt 2>&1
echo "sel_fwd rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 1 $W/sel_fwd.txt; grep -c FAIL $W/sel_fwd.txt; grep FAIL $W/sel_fwd.txt | head
