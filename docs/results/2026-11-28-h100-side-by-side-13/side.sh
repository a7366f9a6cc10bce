#!/bin/bash
# Staging 3 of 3 (the peers' small wheels; the CUTLASS-DSL library staged by
# .device/pa and .device/pb is extracted again where pip's --upgrade removed it), then in
# one command: attnc bench (the whole protocol: ceilings, prefill, backward, decode,
# compile), the anchors' bench.py (forward, decode, compile; FA4, cuDNN, FA2) and the
# peers' backward at d64/d128 (scripts/dev/peers_bwd.py).
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/w113; mkdir -p $W /tmp/site /tmp/attnc; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
[ -d /tmp/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*.whl 2>&1 | tail -n 2
ls /tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu* >/dev/null 2>&1 || \
  cat /tmp/stage/cu13.tar.xz.part-aa $D/../pb/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 30 $D/run.sh attnc selftest --no-grads --family hopper --json $W/sel_sinks.json tests/gpu-specs/split_sinks.attn > $W/sel_sinks.txt 2>&1
echo "selftest split_sinks hopper rc $? $(date -u)" >> $W/device.txt
timeout 30 $D/run.sh attnc selftest --no-grads --family portable --json $W/sel_sinks_portable.json tests/gpu-specs/split_sinks.attn > $W/sel_sinks_portable.txt 2>&1
echo "selftest split_sinks portable rc $? $(date -u)" >> $W/device.txt
timeout 200 $D/run.sh attnc bench --json $W/attnc_bench.json > $W/attnc_bench.txt 2> $W/attnc_bench.err
echo "attnc bench rc $? $(date -u)" >> $W/device.txt
timeout 180 python3 $D/bench.py --suites ceil,fwd,decode,compile --backends fa4,cudnn,fa2 --out $W/anchors.json > $W/anchors.txt 2>&1
echo "bench.py rc $? $(date -u)" >> $W/device.txt
timeout 150 python3 scripts/dev/peers_bwd.py $D/bench.py $W/peers_bwd.json --hdims 64,128 > $W/peers_bwd.txt 2>&1
echo "peers_bwd rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 1 $W/sel_*.txt
python3 scripts/dev/side_by_side.py $W/attnc_bench.json $W/anchors.json $W/peers_bwd.json 2>&1 | head -70
