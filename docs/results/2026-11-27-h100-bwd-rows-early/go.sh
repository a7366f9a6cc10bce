#!/bin/bash
# rows_early (lse and D read while the GEMMs they wait for are in flight) against the
# default, same binary: the backward suite in the order default, rows_early=1, twice.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w43; mkdir -p $W; rm -f /tmp/attnc/attnc
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
i=0
for v in def early def early; do
  i=$((i+1))
  case $v in
    def) $R attnc bench --suites backward --json $W/bwd_def_$i.json > $W/bwd_def_$i.txt 2>&1;;
    early) ATTNC_HOPPER_BWD_TUNE=rows_early=1 $R attnc bench --suites backward --json $W/bwd_early_$i.json > $W/bwd_early_$i.txt 2>&1;;
  esac
  date -u >> $W/device.txt
done
tar czf $OUT/w.tgz -C $W .
grep -h "d=128" $W/bwd_early_2.txt | head -3
