#!/bin/bash
# Idle consumers (ATTNC_HOPPER_TUNE=idle_consumers: a consumer warpgroup whose 64 rows all
# lie past the sequence's end skips Q, the key walk and its GEMMs; the empty barriers count
# the working consumers) on (default) against off, same binary: prefill suite def, off,
# three rounds; the decode suite once each; then the forward selftest (f64 reference, odd
# sizes) of every example and GPU spec with the default.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w55; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
for i in 1 2 3; do
  for v in def off; do
    T=""; [ $v = off ] && T="idle_consumers=0"
    ATTNC_HOPPER_TUNE=$T timeout 60 $R attnc bench --suites prefill --json $W/prefill_${v}_$i.json > $W/prefill_${v}_$i.txt 2>&1
    echo "prefill $v $i rc $? $(date -u)" >> $W/device.txt
  done
done
for v in def off; do
  T=""; [ $v = off ] && T="idle_consumers=0"
  ATTNC_HOPPER_TUNE=$T timeout 60 $R attnc bench --suites decode --json $W/decode_${v}_1.json > $W/decode_${v}_1.txt 2>&1
  echo "decode $v rc $? $(date -u)" >> $W/device.txt
done
timeout 250 $R attnc selftest --no-grads --family hopper --json $W/sel.json dsl-examples/*.attn tests/gpu-specs/*.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 2 $W/sel.txt; grep -c FAIL $W/sel.txt
