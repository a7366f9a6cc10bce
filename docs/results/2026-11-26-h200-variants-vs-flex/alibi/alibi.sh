#!/bin/bash
# The ALiBi variant: its selftest (forward and gradients), then the variant bench beside
# FlexAttention (bf16, d128, 16 heads, batch 4, seqlen 8192) with causal as the control.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; A=/tmp/aux
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
rm -f /tmp/attnc/attnc
timeout 120 bash $D/run.sh attnc selftest $V/alibi_16h.attn > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"; tail -1 $OUT/selftest.txt
python3 $V/flex_variants.py write-aux $A > /dev/null
B="--batch 4 --seqlen 8192"
{
bash $D/run.sh attnc bench $V/alibi_16h.attn $B --json /tmp/v_alibi.json | tail -2
bash $D/run.sh attnc bench $V/causal_16h.attn $B --json /tmp/v_causal.json | tail -2
} > $OUT/attnc.txt 2>&1
cat /tmp/v_alibi.json /tmp/v_causal.json > $OUT/attnc_variants.jsonl 2>/dev/null
timeout 300 python3 $V/flex_variants.py time $A $OUT/flex.json > $OUT/flex.txt 2>&1; echo "flex rc=$?"
grep -v "^DEBUG\|Warning\|warn" $OUT/flex.txt | grep "alibi\|causal"; grep -v "^\[" $OUT/attnc.txt | grep "effective"
date -u | tee -a $OUT/device.txt
