#!/bin/bash
# The variant bench beside FlexAttention (bf16, d128, 16 heads, batch 4, seqlen 8192):
# attnc bench FILE per variant (forward and backward), then flex_variants.py time.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; A=/tmp/aux
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
rm -f /tmp/attnc/attnc
python3 $V/flex_variants.py write-aux $A > /dev/null
B="--batch 4 --seqlen 8192"
{
bash $D/run.sh attnc bench $V/document_mask_16h.attn $B --aux doc=$A/doc.bin --json /tmp/v_doc.json | tail -2
bash $D/run.sh attnc bench $V/document_prefix.attn $B --aux doc=$A/doc.bin --aux start=$A/start.bin --param prefix=128 --json /tmp/v_docp.json | tail -2
bash $D/run.sh attnc bench $V/block_sparse_table.attn $B --aux layout=$A/layout.bin --json /tmp/v_table.json | tail -2
bash $D/run.sh attnc bench $V/sliding_window_16h.attn $B --json /tmp/v_sw.json | tail -2
bash $D/run.sh attnc bench $V/causal_16h.attn $B --json /tmp/v_causal.json | tail -2
bash $D/run.sh attnc bench $V/softcap_16h.attn $B --json /tmp/v_softcap.json | tail -2
} > $OUT/attnc.txt 2>&1
cat /tmp/v_doc.json /tmp/v_docp.json /tmp/v_table.json /tmp/v_sw.json /tmp/v_causal.json /tmp/v_softcap.json > $OUT/attnc_variants.jsonl 2>/dev/null
timeout 300 python3 $V/flex_variants.py time $A $OUT/flex.json > $OUT/flex.txt 2>&1; echo "flex rc=$?"
grep -v "^DEBUG\|Warning\|warn" $OUT/flex.txt | tail -8; cat $OUT/attnc.txt | grep -v "^\[" | tail -14
date -u | tee -a $OUT/device.txt
