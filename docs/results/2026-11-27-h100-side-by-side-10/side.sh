#!/bin/bash
# Staging 3 of 3 (the peers' small wheels; the CUTLASS-DSL library staged by .device/pa
# and .device/pb), then in one command: attnc bench (ceilings, prefill, decode, compile;
# the backward kernels are side by side 9's) and the anchors' bench.py (forward, decode,
# compile; FA4, cuDNN, FA2).
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/w82; mkdir -p $W /tmp/site /tmp/attnc; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
[ -d /tmp/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*.whl 2>&1 | tail -n 2
ls /tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu* >/dev/null 2>&1 || \
  cat /tmp/stage/cu13.tar.xz.part-aa $D/../pb/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 120 $D/run.sh attnc bench --suites ceilings,prefill,decode,compile --json $W/attnc_bench.json > $W/attnc_bench.txt 2> $W/attnc_bench.err
echo "attnc bench rc $? $(date -u)" >> $W/device.txt
timeout 110 python3 $D/bench.py --suites ceil,fwd,decode,compile --backends fa4,cudnn,fa2 --out $W/anchors.json > $W/anchors.txt 2>&1
echo "bench.py rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt
python3 scripts/dev/side_by_side.py $W/attnc_bench.json $W/anchors.json 2>&1 | head -40
