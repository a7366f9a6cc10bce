#!/bin/bash
# With the P.V wait pinned (maskless default), do ping-pong and a third ring slot still pay?
# Prefill suite: default, pingpong=0 (d64's default is on), pingpong=1 (d128's is off),
# stages=3; two rounds interleaved.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w76; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
export ATTNC=attnc
ROUNDS=2 timeout 400 $R bash scripts/dev/ab_tune.sh prefill $W/ab 'def=' 'pp0=ATTNC_HOPPER_TUNE=pingpong=0' 'pp1=ATTNC_HOPPER_TUNE=pingpong=1' 'st3=ATTNC_HOPPER_TUNE=stages=3'
echo "ab prefill rc $? $(date -u)" >> $W/device.txt
python3 scripts/dev/ab_compare.py $W/ab prefill def 2>&1 | tail -22
cat $W/device.txt
