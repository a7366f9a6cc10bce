#!/bin/bash
# Call 3 of 3, one command (after anchA/stage.sh, anchA2/stage.sh): attnc bench (the whole
# protocol: ceilings, prefill, backward, decode, compile), the anchors' bench.py (forward,
# decode, compile) and the peers' backward at head_dim 64 and 128 (scripts/dev/peers_bwd.py).
D=$(cd "$(dirname "$0")" && pwd)
R=$(pwd)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } | tee $OUT/device.txt
cd $D && WHEELS=. source install.sh; cd $R
mkdir -p /tmp/attnc; xz -dc $D/attnc.xz > /tmp/attnc/attnc; chmod +x /tmp/attnc/attnc
export ATTNC_PTXAS=/tmp/attnc/ptxas
/tmp/attnc/attnc bench --json $OUT/attnc_bench.json > $OUT/attnc_bench.txt 2>$OUT/attnc_bench.err
echo "attnc bench rc=$?"; date -u | tee -a $OUT/device.txt
python3 $D/bench.py --suites ceil,fwd,decode,compile --backends fa4,cudnn,fa2 --out $OUT/anchors.json > $OUT/anchors.txt 2>&1
echo "bench.py rc=$?"; date -u | tee -a $OUT/device.txt
python3 scripts/dev/peers_bwd.py $D/bench.py $OUT/peers_bwd.json --hdims 64,128 > $OUT/peers_bwd.txt 2>&1
echo "peers_bwd rc=$?"; date -u | tee -a $OUT/device.txt
