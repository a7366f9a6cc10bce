#!/bin/bash
# pin_pv_wait on by default without a mask or score mod: the forward selftest of every
# example and GPU spec, then prefill and decode, the new default against pin_pv_wait=0,
# three rounds interleaved.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w75; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
export ATTNC=attnc
ROUNDS=3 timeout 200 $R bash scripts/dev/ab_tune.sh prefill $W/ab 'def=' 'nopin=ATTNC_HOPPER_TUNE=pin_pv_wait=0'
echo "ab prefill rc $? $(date -u)" >> $W/device.txt
ROUNDS=3 timeout 120 $R bash scripts/dev/ab_tune.sh decode $W/ab 'def=' 'nopin=ATTNC_HOPPER_TUNE=pin_pv_wait=0'
echo "ab decode rc $? $(date -u)" >> $W/device.txt
python3 scripts/dev/ab_compare.py $W/ab prefill def 2>&1 | tail -22
python3 scripts/dev/ab_decode.py $W/ab def 2>&1 | tail -22
timeout 240 $R attnc selftest --no-grads --family hopper --json $W/sel.json dsl-examples tests/gpu-specs > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
tail -n 2 $W/sel.txt; grep -c "^\[.*PASS" $W/sel.txt; grep "FAIL" $W/sel.txt | head -5
cat $W/device.txt
