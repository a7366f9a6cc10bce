#!/bin/bash
# After the three staging calls (anchC0..2): one command with attnc bench (the whole
# protocol) of the new binary, the anchors' bench.py (forward, decode, compile; FA4, cuDNN,
# FA2), the peers' backward at d64/d128 (scripts/dev/peers_bwd.py), and the backward suite
# of the session's starting binary (attnc_old, beff097) before and after, for old/new.
D=$(cd "$(dirname "$0")" && pwd)
R=$(pwd)
W=/tmp/w41; mkdir -p $W /tmp/attnc /tmp/attnc_old
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } | tee $W/device.txt
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
xz -dc $D/attnc.xz > /tmp/attnc/attnc; xz -dc $D/attnc_old.xz > /tmp/attnc_old/attnc; xz -dc $D/ptxas.xz > /tmp/attnc/ptxas
chmod +x /tmp/attnc/attnc /tmp/attnc_old/attnc /tmp/attnc/ptxas
export ATTNC_PTXAS=/tmp/attnc/ptxas
/tmp/attnc_old/attnc bench --suites backward --json $W/bwd_old_1.json > $W/bwd_old_1.txt 2>&1
/tmp/attnc/attnc bench --json $W/attnc_bench.json > $W/attnc_bench.txt 2>$W/attnc_bench.err
echo "attnc bench rc=$?"; date -u | tee -a $W/device.txt
python3 $D/bench.py --suites ceil,fwd,decode,compile --backends fa4,cudnn,fa2 --out $W/anchors.json > $W/anchors.txt 2>&1
echo "bench.py rc=$?"; date -u | tee -a $W/device.txt
python3 scripts/dev/peers_bwd.py $D/bench.py $W/peers_bwd.json --hdims 64,128 > $W/peers_bwd.txt 2>&1
echo "peers_bwd rc=$?"; date -u | tee -a $W/device.txt
/tmp/attnc_old/attnc bench --suites backward --json $W/bwd_old_2.json > $W/bwd_old_2.txt 2>&1
/tmp/attnc/attnc bench --suites backward --json $W/bwd_new_2.json > $W/bwd_new_2.txt 2>&1
date -u | tee -a $W/device.txt
tar czf $OUT/w.tgz -C $W .
python3 scripts/dev/side_by_side.py $W/attnc_bench.json $W/anchors.json $W/peers_bwd.json 2>&1 | head -80
