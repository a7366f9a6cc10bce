#!/bin/bash
# Own walk end (ATTNC_HOPPER_TUNE=own_walk_end: under a causal/window mask each consumer
# of d64's 192-row tiles ends its walk after its own rows' last key tile and only drains
# the CTA's remaining slots) on (default) against off, same binary: prefill suite def,
# off, three rounds; then the forward selftest of every example and GPU spec.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w56; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
for i in 1 2 3; do
  for v in def off; do
    T=""; [ $v = off ] && T="own_walk_end=0"
    ATTNC_HOPPER_TUNE=$T timeout 60 $R attnc bench --suites prefill --json $W/prefill_${v}_$i.json > $W/prefill_${v}_$i.txt 2>&1
    echo "prefill $v $i rc $? $(date -u)" >> $W/device.txt
  done
done
timeout 250 $R attnc selftest --no-grads --family hopper --json $W/sel.json dsl-examples/*.attn tests/gpu-specs/*.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 2 $W/sel.txt; grep -c FAIL $W/sel.txt
