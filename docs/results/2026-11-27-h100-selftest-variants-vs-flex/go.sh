#!/bin/bash
# 1. The forward selftest of every example and GPU spec (split steps for causal d64 now the
#    default; persistent plain attention; relaxed-capture allocation).
# 2. The variant bench beside FlexAttention (bf16, d128, 16 heads, batch 4, seqlen 8192):
#    attnc forward + backward per variant, then flex_variants.py time (forward, backward).
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w83; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 240 $R attnc selftest --no-grads --json $W/sel.json dsl-examples tests/gpu-specs > $W/sel.txt 2>&1
echo "selftest rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel.txt; grep FAIL $W/sel.txt | head -5
gzip -9 -n $W/sel.json; xz -9 $W/sel.txt
V=benches/variants; A=/tmp/aux
python3 $V/flex_variants.py write-aux $A > /dev/null
B="--batch 4 --seqlen 8192"
{
$R attnc bench $V/document_mask_16h.attn $B --aux doc=$A/doc.bin --json $W/v_doc.json | tail -2
$R attnc bench $V/alibi_16h.attn $B --json $W/v_alibi.json | tail -2
$R attnc bench $V/causal_16h.attn $B --json $W/v_causal.json | tail -2
$R attnc bench $V/softcap_16h.attn $B --json $W/v_softcap.json | tail -2
$R attnc bench $V/sliding_window_16h.attn $B --json $W/v_sw.json | tail -2
} > $W/attnc_variants.txt 2>&1
echo "attnc variants $(date -u)" >> $W/device.txt
timeout 300 python3 $V/flex_variants.py time $A $W/flex.json > $W/flex.txt 2>&1
echo "flex rc $? $(date -u)" >> $W/device.txt
grep -v "^DEBUG\|Warning\|warn" $W/flex.txt | tail -12; grep -v "^\[" $W/attnc_variants.txt | grep "effective"
cat $W/device.txt
