#!/bin/bash
# The persistent causal forward's LPT section size (heads whose K+V fit N MiB stay
# together): 32 (default) against 16 and 8, the prefill suite, three rounds interleaved;
# first the forward selftest of the causal specs with 8.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w72; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples
ATTNC_HOPPER_TUNE=lpt_section_mib=8 timeout 90 $R attnc selftest --no-grads --family hopper --json $W/sel_s8.json $E/causal.attn $E/varlen_causal.attn $E/mqa_falcon.attn > $W/sel_s8.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
export ATTNC=attnc
ROUNDS=3 timeout 420 $R bash scripts/dev/ab_tune.sh prefill $W/ab 'def=' 's16=ATTNC_HOPPER_TUNE=lpt_section_mib=16' 's8=ATTNC_HOPPER_TUNE=lpt_section_mib=8'
echo "ab rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 1 $W/sel_*.txt; grep -c FAIL $W/sel_*.txt
python3 scripts/dev/ab_compare.py $W/ab prefill def 2>&1 | grep -E 'True|causal|---'
