#!/bin/bash
# Peers + attnc backward in one command (call 2 of 2; call 1 staged anchA).
set -x
D=$(cd "$(dirname "$0")" && pwd)
cd .device/anchB && WHEELS=. source install.sh && cd - >/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/device.txt
date -u | tee -a $OUT/device.txt
for t in 1 0; do
  ATTNC_HOPPER_BWD_TUNE=dq_bulk=$t bash $D/run.sh attnc bench --suites ceilings,backward --json $OUT/attnc_dqbulk$t.json > $OUT/attnc_dqbulk$t.txt 2>&1
  tail -30 $OUT/attnc_dqbulk$t.txt
done
cd .device/anchB && python3 bench.py --suites ceil,bwd --backends fa4,cudnn --hdims 128 --bwd-seqlens 1024,2048,4096,8192,16384 --out $OUT/peers.json > $OUT/peers.txt 2>&1; tail -30 $OUT/peers.txt
