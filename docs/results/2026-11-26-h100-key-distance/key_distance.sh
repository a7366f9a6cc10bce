#!/bin/bash
# Key distances converted per row (float(a - k) as float(a - base) + imm): selftest of the score-mod variants, then the
# variant bench (b4, 8k, 16 heads, d128) for ALiBi and causal with the build
# before and this one, alternating.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; E=dsl-examples
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -f /tmp/attnc/attnc /tmp/attnc/attnc_prev
bash $D/run.sh attnc selftest --json $OUT/selftest.json $E/alibi.attn $E/alibi_learned.attn $E/t5_bias.attn $E/gemma2.attn $E/grok_softcap.attn $E/fa4_numerics.attn $E/sinks.attn $V/alibi_16h.attn $V/softcap_16h.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "^FAIL" $OUT/selftest.txt | head; tail -1 $OUT/selftest.txt
B="--batch 4 --seqlen 8192"
{
for r in 1 2; do for bin in attnc_prev attnc; do for v in alibi_16h causal_16h; do
  echo "== $bin $v"; bash $D/run.sh $bin bench $V/$v.attn $B 2>&1 | grep -v "^\[" | grep "effective TFLOP" | head -1
done; done; done
} 2>&1 | tee $OUT/bench.txt
xz -T4 $OUT/selftest.json
date -u >> $OUT/device.txt
