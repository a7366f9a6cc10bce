#!/bin/bash
# Plain attention persistent by default (with the pinned P.V wait): the selftest with
# gradients of the plain examples and GPU specs, then prefill default vs persistent=0,
# three rounds interleaved.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w78; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 200 $R attnc selftest --json $W/sel.json dsl-examples/mha.attn dsl-examples/vit_fp16.attn tests/gpu-specs/gqa_d64.attn tests/gpu-specs/varlen_gqa_d64.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
tail -n 1 $W/sel.txt; grep "FAIL" $W/sel.txt | head -5; grep -c "ran hopper\|hopper" $W/sel.txt
export ATTNC=attnc
ROUNDS=3 timeout 250 $R bash scripts/dev/ab_tune.sh prefill $W/ab 'def=' 'tiled=ATTNC_HOPPER_TUNE=persistent=0'
echo "ab prefill rc $? $(date -u)" >> $W/device.txt
python3 scripts/dev/ab_compare.py $W/ab prefill def 2>&1 | tail -22
cat $W/device.txt
