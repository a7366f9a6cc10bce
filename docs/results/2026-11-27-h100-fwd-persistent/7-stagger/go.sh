#!/bin/bash
# Is the persistent forward's d64 non-causal loss the CTAs walking the same K/V tiles in
# step? Default grid, persistent=1, and persistent=1 with the producer of CTA c sleeping
# (c % 16) x N ns before its first tile (N = 200, 1000), at b2 x 16k and b8 x 4k,
# three rounds interleaved.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w74; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
ATTNC_HOPPER_TUNE=persistent=1,stagger_ns=1000 timeout 60 $R attnc selftest --no-grads --family hopper --json $W/sel.json $D/nc64.attn dsl-examples/mha.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
for r in 1 2 3; do
  for arm in "def=" "pers=persistent=1" "st200=persistent=1,stagger_ns=200" "st1000=persistent=1,stagger_ns=1000"; do
    l=${arm%%=*}; t=${arm#*=}
    for s in "2 16384" "8 4096"; do set -- $s
      ATTNC_HOPPER_TUNE=$t timeout 60 $R attnc bench $D/nc64.attn --batch $1 --seqlen $2 > $W/b_${l}_$2_$r.txt 2>&1
    done
  done
  echo "round $r $(date -u)" >> $W/device.txt
done
cat $W/device.txt; tail -n 1 $W/sel.txt
for s in 16384 4096; do for l in def pers st200 st1000; do echo -n "$s $l: "; for r in 1 2 3; do grep -o '[0-9.]* effective TFLOP/s' $W/b_${l}_${s}_$r.txt | head -1 | cut -d' ' -f1 | tr '\n' ' '; done; echo; done; done
