#!/bin/bash
# wip/bwd-instructions (attnc.xz, ccf9782) against main (attnc_old.xz, beff097), in two calls:
#   go.sh sel    the selftest with gradients of the branch (examples + GPU specs), ~5.5 min
#   go.sh bench  the backward suite old / new / new + p_f32_for_ds, twice, ~4.5 min
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w9_$1; mkdir -p $W; rm -f /tmp/attnc/attnc /tmp/attnc_old/attnc
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $W/gpu.txt
if [ "$1" = sel ]; then
  timeout 560 $R attnc selftest dsl-examples tests/gpu-specs --json $W/selftest.json > $W/selftest.txt 2>&1
  echo "selftest rc $?" >> $W/gpu.txt
else
  i=0
  for v in old new p32 old new p32; do
    i=$((i+1))
    case $v in
      old) $R old attnc bench --suites backward --json $W/bwd_old_$i.json > $W/bwd_old_$i.txt 2>&1;;
      new) $R attnc bench --suites backward --json $W/bwd_new_$i.json > $W/bwd_new_$i.txt 2>&1;;
      p32) ATTNC_HOPPER_BWD_TUNE=p_f32_for_ds=1 $R attnc bench --suites backward --json $W/bwd_p32_$i.json > $W/bwd_p32_$i.txt 2>&1;;
    esac
  done
fi
tar czf $OUT/w.tgz -C $W .
grep -h "^FAIL" $W/selftest.txt 2>/dev/null | head; tail -n 1 $W/selftest.txt 2>/dev/null
