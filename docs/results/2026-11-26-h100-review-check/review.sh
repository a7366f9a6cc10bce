#!/bin/bash
# After the review commits (launch pointer table, lists flag read at load, expr refactor):
# selftest of the aux-mask and score-mod variants, the decode bench suite (the launch memo's
# replays), and ALiBi's bench.
D=$(cd "$(dirname "$0")" && pwd)
V=benches/variants; E=dsl-examples
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) | tee $OUT/device.txt
rm -f /tmp/attnc/attnc
bash $D/run.sh attnc selftest --json $OUT/selftest.json $V/document_mask_16h.attn $V/alibi_16h.attn $E/document_mask.attn $E/alibi.attn $E/t5_bias.attn $E/gqa_decode_paged.attn > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; grep "^FAIL" $OUT/selftest.txt | head; tail -2 $OUT/selftest.txt
bash $D/run.sh attnc bench --suites decode --json $OUT/decode.json > $OUT/decode.txt 2>&1; echo "decode rc=$?"; grep -A7 "^batch seqlen_k" $OUT/decode.txt | head -7
bash $D/run.sh attnc bench $V/alibi_16h.attn --batch 4 --seqlen 8192 2>&1 | grep -v "^\[" | grep effective | tee $OUT/alibi.txt
xz -T4 $OUT/selftest.json
date -u >> $OUT/device.txt
