#!/bin/bash
# d64 with two consumer warpgroups (128-row tiles, ping-pong, 240 registers) against the
# default three (192-row tiles): the prefill suite default, c2, c2p0 (no ping-pong),
# default, c2, c2p0. For the causal cells at short lengths.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w52; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
i=0
for v in def c2 c2p0 def c2 c2p0; do
  i=$((i+1))
  case $v in def) T="";; c2) T="consumers=2,consumer_regs=240";; c2p0) T="consumers=2,consumer_regs=240,pingpong=0";; esac
  ATTNC_HOPPER_TUNE=$T timeout 90 $R attnc bench --suites prefill --json $W/fwd_${v}_$i.json > $W/fwd_${v}_$i.txt 2>&1
  echo "$v $i rc $? $(date -u)" >> $W/device.txt
done
cat $W/device.txt
