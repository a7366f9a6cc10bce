#!/bin/bash
# Split steps (a masked and an unmasked copy of the step): plain attention with split_mask=1
# (the pin is its default); causal/softcap/ALiBi with pin+split. Then MUFU packed-form
# throughput and the selftest of the new plain varlen spec.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w79; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 60 $R python3 scripts/dev/mufu_probe.py $W/mufu.json > $W/mufu.txt 2>&1
echo "mufu rc $? $(date -u)" >> $W/device.txt; cat $W/mufu.txt | tail -12
timeout 120 $R attnc selftest --json $W/sel.json tests/gpu-specs/varlen_plain_d64.attn dsl-examples/mha.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt; tail -n 2 $W/sel.txt; grep FAIL $W/sel.txt | head -5
export ATTNC=attnc
ROUNDS=4 timeout 240 $R bash scripts/dev/ab_tune.sh prefill $W/ab 'def=' 'sm=ATTNC_HOPPER_TUNE=split_mask=1' 'psm=ATTNC_HOPPER_TUNE=pin_pv_wait=1,split_mask=1'
echo "ab prefill rc $? $(date -u)" >> $W/device.txt
python3 scripts/dev/ab_compare.py $W/ab prefill def 2>&1 | tail -26
V=benches/variants
for round in 1 2 3; do
  for cfg in def split_mask=1 pin_pv_wait=1,split_mask=1; do
    T=$cfg; [ $cfg = def ] && T=""
    for v in causal_16h softcap_16h alibi_16h; do
      echo "== $round $cfg $v"
      ATTNC_HOPPER_TUNE=$T timeout 60 $R attnc bench $V/$v.attn --batch 4 --seqlen 8192 --json $W/b_${round}_${cfg}_$v.json 2>&1 | grep -v "^\[" | tail -2
    done
  done
done > $W/bench.txt 2>&1
echo "bench done $(date -u)" >> $W/device.txt
grep -E "^==|effective" $W/bench.txt | paste - - | awk '{print $2, $3, $4, $6, $11, $19}'
cat $W/device.txt
