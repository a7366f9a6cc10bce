#!/bin/bash
# The causal backward's CTAs in LPT order (ATTNC_HOPPER_BWD_TUNE=lpt_sections_mib=16): the
# gradient selftest of causal specs with it, then the backward suite, default against it,
# two rounds interleaved.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w77; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples; G=tests/gpu-specs
ATTNC_HOPPER_BWD_TUNE=lpt_sections_mib=16 timeout 150 $R attnc selftest --family hopper --json $W/sel_lpt.json \
  $E/causal.attn $E/mqa_falcon.attn $E/varlen_causal.attn $G/gqa_d64.attn > $W/sel_lpt.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
export ATTNC=attnc
ROUNDS=2 timeout 330 $R bash scripts/dev/ab_tune.sh backward $W/ab 'def=' 'lpt16=ATTNC_HOPPER_BWD_TUNE=lpt_sections_mib=16'
echo "ab rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 1 $W/sel_lpt.txt; grep -c FAIL $W/sel_lpt.txt
python3 scripts/dev/ab_compare.py $W/ab backward def 2>&1 | tail -24
