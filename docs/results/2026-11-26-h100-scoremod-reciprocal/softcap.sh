#!/bin/bash
# Score-mod division by a constant as a multiply by its reciprocal (no div.rn.f32 per
# score): softcap forward and backward before (attnc_old, b9bb5ea's codegen) and after,
# interleaved, beside causal and FlexAttention in one call; then the selftest of the
# score-mod examples with the new binary.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; E=dsl-examples; A=/tmp/aux
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -rf /tmp/attnc /tmp/attnc_old
B="--batch 4 --seqlen 8192"
for round in 1 2; do
  for who in old new; do
    for v in causal_16h softcap_16h; do
      W=""; [ $who = old ] && W=old
      echo "== round $round $who $v"
      bash $D/run.sh $W attnc bench $V/$v.attn $B --json /tmp/${who}_${v}_$round.json 2>&1 | grep -v "^\[" | tail -3
    done
  done
done > $OUT/bench.txt 2>&1
cat /tmp/*_causal_16h_*.json /tmp/*_softcap_16h_*.json > $OUT/bench.jsonl 2>/dev/null
grep -E "^==|effective" $OUT/bench.txt
python3 $V/flex_variants.py write-aux $A > /dev/null
timeout 300 python3 $V/flex_variants.py time $A $OUT/flex.json > $OUT/flex.txt 2>&1; echo "flex rc=$?"
grep -v "^DEBUG\|Warning\|warn" $OUT/flex.txt | grep -i "causal\|softcap" | head -6
timeout 200 bash $D/run.sh attnc selftest --json $OUT/selftest.json $E/grok_softcap.attn $V/softcap_16h.attn $E/gemma2.attn $E/alibi.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "^FAIL" $OUT/selftest.txt | head; tail -2 $OUT/selftest.txt
xz -T4 $OUT/selftest.json
date -u | tee -a $OUT/device.txt
