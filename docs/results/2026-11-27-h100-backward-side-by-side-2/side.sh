#!/bin/bash
# Call 3 of 3, one command (after stage1.sh, stage2.sh): the selftest with gradients of the
# d64 examples and the d64 varlen/aux-mask GPU spec on this binary, then attnc bench
# (ceilings, backward) and the peers' backward at head_dim 64 and 128
# (scripts/dev/peers_bwd.py: the anchors' bench.py suite_bwd).
D=$(cd "$(dirname "$0")" && pwd)
R=$(pwd)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } | tee $OUT/device.txt
cd $D && WHEELS=. source install.sh; cd $R
xz -dc $D/attnc.xz > /tmp/attnc/attnc; chmod +x /tmp/attnc/attnc
export ATTNC_PTXAS=/tmp/attnc/ptxas
E=dsl-examples
timeout 200 /tmp/attnc/attnc selftest $E/mqa_falcon.attn $E/sinks.attn $E/vit_fp16.attn tests/gpu-specs/varlen_document_d64.attn \
  --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc=$?"; tail -1 $OUT/selftest.txt; date -u | tee -a $OUT/device.txt
/tmp/attnc/attnc bench --suites ceilings,backward --json $OUT/attnc_bench.json > $OUT/attnc_bench.txt 2>$OUT/attnc_bench.err
echo "attnc bench rc=$?"; date -u | tee -a $OUT/device.txt
python3 scripts/dev/peers_bwd.py $D/bench.py $OUT/peers_bwd.json --hdims 64,128 > $OUT/peers_bwd.txt 2>&1
echo "peers_bwd rc=$?"; date -u | tee -a $OUT/device.txt
