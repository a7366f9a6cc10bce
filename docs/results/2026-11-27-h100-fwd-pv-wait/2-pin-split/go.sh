#!/bin/bash
# The P.V wait pinned below the softmax (pin_pv_wait) and S in two halves with the first
# half's score mod under the second (split_s): forward selftest with both, the variant
# bench (causal, softcap, ALiBi, non-causal control) under each, and the prefill suite
# default vs pin_pv_wait, interleaved.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w74; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
ATTNC_HOPPER_TUNE=pin_pv_wait=1,split_s=1 timeout 150 $R attnc selftest --no-grads --family hopper --json $W/sel.json dsl-examples tests/gpu-specs > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
tail -n 2 $W/sel.txt; grep -c "^FAIL" $W/sel.txt
V=benches/variants
for round in 1 2; do
  for cfg in def pin_pv_wait=1 split_s=1 pin_pv_wait=1,split_s=1; do
    T=$cfg; [ $cfg = def ] && T=""
    for v in causal_16h softcap_16h alibi_16h; do
      echo "== $round $cfg $v"
      ATTNC_HOPPER_TUNE=$T timeout 60 $R attnc bench $V/$v.attn --batch 4 --seqlen 8192 --json $W/b_${round}_${cfg}_$v.json 2>&1 | grep -v "^\[" | tail -2
    done
  done
done > $W/bench.txt 2>&1
echo "variants done $(date -u)" >> $W/device.txt
grep -E "^==|effective" $W/bench.txt | paste - - | awk '{print $2, $3, $4, $11, $19}'
export ATTNC=attnc
ROUNDS=3 timeout 250 $R bash scripts/dev/ab_tune.sh prefill $W/ab 'def=' 'pin=ATTNC_HOPPER_TUNE=pin_pv_wait=1'
echo "ab rc $? $(date -u)" >> $W/device.txt
python3 scripts/dev/ab_compare.py $W/ab prefill def 2>&1 | tail -25
cat $W/device.txt
