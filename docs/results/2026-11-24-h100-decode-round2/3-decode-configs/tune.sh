#!/bin/bash
# Decode configurations of the hopper forward (ATTNC_HOPPER_TUNE), one bench each: decode suite only.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
i=0
for t in "" "consumers=1" "consumers=1,block_n=64" "consumers=1,stages=3" "consumers=1,block_n=64,stages=4"; do
  i=$((i+1))
  ATTNC_HOPPER_TUNE=$t bash $D/run.sh attnc bench --suites decode --decode-splits 8,16,32 > $OUT/tune_$i.txt 2>/dev/null
  echo "== [$t] rc=$?" | tee -a $OUT/summary.txt
  sed -n '/^decode (/,$p' $OUT/tune_$i.txt | grep -v "^decode\|^batch" >> $OUT/summary.txt
done
cat $OUT/summary.txt
date -u | tee -a $OUT/device.txt
