#!/bin/bash
# Prefill configurations (ATTNC_HOPPER_TUNE): one prefill suite per configuration, d64 rows compared.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
i=0
for t in "" "stages=3" "block_n=192" "block_n=176" "consumers=3,consumer_regs=160" "" ; do
  i=$((i+1))
  ATTNC_HOPPER_TUNE=$t bash $D/run.sh attnc bench --suites prefill > $OUT/p_$i.txt 2>/dev/null
  echo "== [$t] rc=$?" | tee -a $OUT/summary.txt
  grep -E "^ +64/64" $OUT/p_$i.txt >> $OUT/summary.txt
done
cat $OUT/summary.txt
date -u | tee -a $OUT/device.txt
