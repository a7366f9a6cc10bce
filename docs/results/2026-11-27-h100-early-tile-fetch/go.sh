#!/bin/bash
# The persistent producer taking its next tile before issuing the current tile's loads
# (early_tile_fetch=1, never measured) vs the default, prefill suite, three rounds.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w88; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
export ATTNC=attnc
ROUNDS=3 timeout 300 $R bash scripts/dev/ab_tune.sh prefill $W/ab 'def=' 'etf=ATTNC_HOPPER_TUNE=early_tile_fetch=1'
echo "ab prefill rc $? $(date -u)" >> $W/device.txt
python3 scripts/dev/ab_compare.py $W/ab prefill def 2>&1 | tail -22
cat $W/device.txt
