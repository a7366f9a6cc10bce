#!/bin/bash
# The split-KV merge with its loads in flight (lane per split LSE, 8 splits' partial rows
# per step) against the previous binary (old), and early_tile_fetch A/B on the prefill suite.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w66; mkdir -p $W; rm -f /tmp/attnc/attnc /tmp/attnc_old/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples; G=tests/gpu-specs
timeout 150 $R attnc selftest --no-grads --family hopper --json $W/sel_split.json $E/gqa_decode_paged.attn $E/sinks.attn $G/paged_page1_d64.attn $D/dec.attn > $W/sel_split.txt 2>&1
echo "sel_split rc $? $(date -u)" >> $W/device.txt
timeout 60 $R attnc selftest --no-grads --family portable --json $W/sel_split_portable.json $E/gqa_decode_paged.attn $E/sinks.attn > $W/sel_split_portable.txt 2>&1
echo "sel_split_portable rc $? $(date -u)" >> $W/device.txt
timeout 60 $R attnc selftest --no-grads --family hopper --json $W/sel_etf.json $E/causal.attn $E/varlen_causal.attn > $W/sel_etf.txt 2>&1
echo "sel_etf rc $? $(date -u)" >> $W/device.txt
for r in 1 2; do
  timeout 60 $R old attnc bench --suites decode --json $W/decode_old_$r.json > $W/decode_old_$r.txt 2>&1
  timeout 60 $R attnc bench --suites decode --json $W/decode_new_$r.json > $W/decode_new_$r.txt 2>&1
  echo "decode round $r $(date -u)" >> $W/device.txt
done
export ATTNC=attnc
ROUNDS=2 timeout 280 $R bash scripts/dev/ab_tune.sh prefill $W/ab 'def=' 'etf=ATTNC_HOPPER_TUNE=early_tile_fetch=1' 'pers=ATTNC_HOPPER_TUNE=persistent=1' 'petf=ATTNC_HOPPER_TUNE=persistent=1,early_tile_fetch=1'
echo "ab rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 2 $W/sel_*.txt; grep -c FAIL $W/sel_*.txt
python3 scripts/dev/ab_compare.py $W/ab prefill def 2>&1 | tail -30
