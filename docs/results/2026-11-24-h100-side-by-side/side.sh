#!/bin/bash
# One command: the peers (installed from anchA/anchB), attnc bench (whole protocol) and bench.py next to it,
# then the selftest's aux-gradient variants with the fixed metric.
D=$(cd "$(dirname "$0")" && pwd)
R=$(pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
cd $R/.device/anchB && WHEELS=. source install.sh; cd $R
ATTNC_PTXAS=/tmp/attnc/ptxas /tmp/attnc/attnc bench --json $OUT/attnc_bench.json > $OUT/attnc_bench.txt 2>$OUT/attnc_bench.err
echo "attnc bench rc=$?"; date -u | tee -a $OUT/device.txt
python3 .device/anchB/bench.py --suites ceil,fwd,decode,compile --backends fa4,cudnn,fa2 --out $OUT/anchors.json > $OUT/anchors.txt 2>&1
echo "bench.py rc=$?"; date -u | tee -a $OUT/device.txt
for f in t5_bias alibi_learned; do ATTNC_PTXAS=/tmp/attnc/ptxas /tmp/attnc/attnc selftest --filter $f dsl-examples > $OUT/selftest_$f.txt 2>&1; echo "selftest $f rc=$?"; grep "^FAIL" $OUT/selftest_$f.txt; tail -1 $OUT/selftest_$f.txt; done
sed -n '/^decode (/,$p' $OUT/attnc_bench.txt | head -30; grep -i "compile" $OUT/attnc_bench.txt | head -3
date -u | tee -a $OUT/device.txt
