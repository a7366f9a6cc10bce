#!/bin/bash
# The prefill suite at c4a1691: default vs the tiled (non-persistent) grid, two rounds
# alternating: does the persistent grid cost the 16k non-causal cells?
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w106; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
$R true
export PATH=/tmp/attnc:$PATH ATTNC_PTXAS=/tmp/attnc/ptxas
ROUNDS=2 timeout 400 bash $D/ab_tune.sh prefill $W/ab 'def=' "np=ATTNC_HOPPER_TUNE=persistent=0"
echo "ab rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt $W/ab/device.txt
python3 scripts/dev/ab_compare.py $W/ab prefill def 2>&1 | head -30
