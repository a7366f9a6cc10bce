#!/bin/bash
# Peers' install finished (part-ab), then gpu_check.py (overhead vs FA4 in the same process) and prof.py.
D=$(cd "$(dirname "$0")" && pwd); R=$(pwd)
cd $R/.device/anchB && WHEELS=. source install.sh; cd $R
export PYTHONPATH=/tmp/pyattnc:$PYTHONPATH ATTNC_PTXAS=/tmp/attnc/ptxas
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
python3 python/tests/gpu_check.py $OUT/gpu_check.json > $OUT/gpu_check.txt 2>&1; echo "gpu_check rc=$?"
grep -v "^DEBUG" $OUT/gpu_check.txt | grep -E "PASS|FAIL|passed" | cut -c1-400
python3 $D/prof.py > $OUT/prof.txt 2>&1; echo "prof rc=$?"; head -12 $OUT/prof.txt
date -u | tee -a $OUT/device.txt
