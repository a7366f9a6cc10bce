#!/bin/bash
# uniform_q (only Q's shared-memory base from the warp-uniform consumer index) against
# the default (uniform_consumer on for maskless specs), same binary: prefill suite
# default, uq, default, uq.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w51; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
i=0
for v in def uq def uq; do
  i=$((i+1))
  T=""; [ $v = uq ] && T="uniform_q=1"
  ATTNC_HOPPER_TUNE=$T timeout 90 $R attnc bench --suites prefill --json $W/fwd_${v}_$i.json > $W/fwd_${v}_$i.txt 2>&1
  echo "$v $i rc $? $(date -u)" >> $W/device.txt
done
cat $W/device.txt
