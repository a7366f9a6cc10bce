#!/bin/bash
# The variant bench beside FlexAttention in one command (bf16, d128, 16 heads, batch 4,
# seqlen 8192): attnc bench per variant (forward with the block mask passed in where the
# mask reads aux tensors, and backward), then flex_variants.py time.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; A=/tmp/aux
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -f /tmp/attnc/attnc
python3 $V/flex_variants.py write-aux $A > /dev/null
B="--batch 4 --seqlen 8192"
{
bash $D/run.sh attnc bench $V/document_mask_16h.attn $B --aux doc=$A/doc.bin --json /tmp/v_doc.json | tail -2
bash $D/run.sh attnc bench $V/alibi_16h.attn $B --json /tmp/v_alibi.json | tail -2
bash $D/run.sh attnc bench $V/causal_16h.attn $B --json /tmp/v_causal.json | tail -2
bash $D/run.sh attnc bench $V/softcap_16h.attn $B --json /tmp/v_softcap.json | tail -2
bash $D/run.sh attnc bench $V/sliding_window_16h.attn $B --json /tmp/v_sw.json | tail -2
} > $OUT/attnc.txt 2>&1
cat /tmp/v_doc.json /tmp/v_alibi.json /tmp/v_causal.json /tmp/v_softcap.json /tmp/v_sw.json > $OUT/attnc_variants.jsonl 2>/dev/null
timeout 400 python3 $V/flex_variants.py time $A $OUT/flex.json > $OUT/flex.txt 2>&1; echo "flex rc=$?"
grep -v "^DEBUG\|Warning\|warn" $OUT/flex.txt | tail -12; grep -v "^\[" $OUT/attnc.txt | grep "effective"
date -u | tee -a $OUT/device.txt
