#!/bin/bash
# The backward row kernels (preprocess, dQ convert) with 8 consecutive rows per warp, all loads
# before the first use, lane i reading/writing row i's LSE, D: the gradient selftest of specs covering every dq_accum layout,
# varlen, fp16, sinks, aux grads and the deterministic modes (new binary); the row kernels
# under ncu (new); then the backward suite, old (c6dc175) vs new, alternating, two rounds.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w93; mkdir -p $W; rm -f /tmp/attnc/attnc /tmp/attnc_old/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples
timeout 300 $R attnc selftest --json $W/sel.json $E/mha.attn $E/causal.attn $E/varlen_causal.attn tests/gpu-specs/head_dim_96.attn tests/gpu-specs/head_dim_192.attn $E/sinks.attn $E/alibi_learned.attn $E/t5_bias.attn $E/mqa_falcon.attn $E/vit_fp16.attn $E/document_mask.attn tests/gpu-specs/gqa_d64.attn tests/gpu-specs/varlen_gqa_d64.attn > $W/sel.txt 2>&1
echo "selftest rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel.txt; grep FAIL $W/sel.txt | head -5
NCU=/usr/local/cuda/bin/ncu
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
for spec in t128h16 t64h32; do
  timeout 120 $R $NCU --metrics $M --csv -k 'regex:bwd_(pre|dq)' -c 4 attnc bench $D/$spec.attn --batch 32 --seqlen 1024 --iters 2 > $W/ncu_${spec}_1024.csv 2>&1
  echo "ncu $spec rc $? $(date -u)" >> $W/device.txt
done
for f in $W/ncu_*.csv; do echo "== $f"; grep -E '"(gpu__time_duration.sum|dram__bytes_read.sum|dram__bytes_write.sum)"' $f | awk -F'","' '{print $5, $(NF-2), $NF}' | sed 's/"//g'; done
for round in 1 2; do
  order="old new"; [ $round = 2 ] && order="new old"
  for b in $order; do
    X=""; [ $b = old ] && X=old
    timeout 120 $R $X attnc bench --suites backward --json $W/backward_${b}_$round.json > $W/backward_${b}_$round.txt 2>&1
    echo "$b round $round rc $? $(date -u)" >> $W/device.txt
  done
done
cat $W/device.txt
python3 scripts/dev/ab_compare.py $W backward old 2>&1 | tail -30
