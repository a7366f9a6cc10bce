#!/bin/bash
# Decode: protocol time vs the GPU's own time vs the host's enqueue time, and a split sweep; compile breakdown.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt; nproc | tee -a $OUT/device.txt
bash $D/run.sh attnc bench --suites ceilings,decode,compile --decode-splits 1,2,4,8,16,32,64,128 --json $OUT/decode.json > $OUT/decode.txt 2>$OUT/decode.err
echo rc=$?; cat $OUT/decode.txt; tail -3 $OUT/decode.err
date -u | tee -a $OUT/device.txt
