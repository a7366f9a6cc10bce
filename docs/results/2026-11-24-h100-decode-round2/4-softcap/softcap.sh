#!/bin/bash
# Softcap cost: causal vs causal+softcap (d128, 16 heads, batch 4, 8k), with the FMA-pipe exp2 emulation at 0/25/50%.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
for rep in 1 2; do
for pct in 0 25 50; do
  for f in benches/variants/causal_16h.attn $D/softcap_16h.attn; do
    echo "== rep $rep emulate_pct=$pct $(basename $f)" | tee -a $OUT/softcap.txt
    ATTNC_HOPPER_TUNE=emulate_pct=$pct bash $D/run.sh attnc bench $f --batch 4 --seqlen 8192 > $OUT/out.tmp 2>&1; grep -v "^\s*$" $OUT/out.tmp | tail -8 >> $OUT/softcap.txt
  done
done
done
rm -f $OUT/out.tmp; cat $OUT/softcap.txt; date -u | tee -a $OUT/device.txt
