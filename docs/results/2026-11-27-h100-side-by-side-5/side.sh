#!/bin/bash
# Staging 3 of 3 (the peers' small wheels; the library staged by stage_1/stage_2 is
# extracted again where pip's --upgrade removed it), then in one command: attnc's
# ceilings and prefill suites (the default build), the peers' forward (FA4, cuDNN; the
# anchors' bench.py, d64 and d128), and the selftest of the maskless specs (gradients).
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w50; mkdir -p $W /tmp/site; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
[ -d /tmp/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*.whl 2>&1 | tail -n 2
ls /tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu* >/dev/null 2>&1 || \
  cat /tmp/stage/cu13.tar.xz.part-aa $D/../pb/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
timeout 100 $R attnc bench --suites ceilings,prefill --json $W/attnc.json > $W/attnc.txt 2>&1
echo "attnc rc $? $(date -u)" >> $W/device.txt
timeout 200 python3 $D/bench.py --suites fwd --hdims 64,128 --backends fa4,cudnn --out $W/peers.json > $W/peers.txt 2>&1
echo "peers rc $? $(date -u)" >> $W/device.txt
E=dsl-examples; G=tests/gpu-specs
timeout 150 $R attnc selftest --family hopper --json $W/sel.json $E/mha.attn $E/vit_fp16.attn $G/gqa_d64.attn \
  $G/head_dim_192.attn $G/paged_page1_d64.attn $G/varlen_softcap_d64.attn > $W/sel.txt 2>&1
echo "sel rc $? $(date -u)" >> $W/device.txt
cat $W/device.txt; tail -n 2 $W/sel.txt; tail -n 25 $W/peers.txt
