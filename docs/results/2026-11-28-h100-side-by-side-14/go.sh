#!/bin/bash
# Staging 4 of 4 and the final runs for issues #13 and #14 (H100, 2026-11-28), attnc at 2925eef.
#   STEP=side: the gradient selftest (--quick) of every example and GPU spec; attnc bench
#              (every suite); the anchors' bench.py (FA4, cuDNN, FA2: ceilings, forward,
#              decode, compile); the peers' backward at d64/d128 (scripts/dev/peers_bwd.py).
#   STEP=var:  the variants at b4 x 8k x 16 heads d128, attnc (forward + backward) then
#              FlexAttention (torch.compile, BlockMask) in the same command; then
#              scripts/dev/interleaved.py --busy (attnc, FA4, cuDNN round-robin, GPU busy
#              time per kernel).
SRC=$(cd "$(dirname "$0")" && pwd)
D=/tmp/stage/st; cp $SRC/* $D/
W=/tmp/w300/$STEP; mkdir -p $W /tmp/site; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
R="$D/run.sh"; $R true
[ -d /tmp/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $D/*.whl 2>&1 | tail -n 2
ls /tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu* >/dev/null 2>&1 || \
  cat /tmp/stage/cu13.tar.xz.part-aa /tmp/stage/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
if [ "$STEP" = side ]; then
  timeout 250 $R attnc selftest --quick --json $W/selftest.json dsl-examples tests/gpu-specs > $W/selftest.txt 2>&1
  echo "selftest rc $? $(date -u)" >> $W/device.txt; tail -n 4 $W/selftest.txt; grep -c FAIL $W/selftest.txt
  timeout 150 $R attnc bench --json $W/attnc_bench.json > $W/attnc_bench.txt 2> $W/attnc_bench.err
  echo "attnc bench rc $? $(date -u)" >> $W/device.txt
  timeout 130 python3 $D/bench.py --suites ceil,fwd,decode,compile --backends fa4,cudnn,fa2 --out $W/anchors.json > $W/anchors.txt 2>&1
  echo "bench.py rc $? $(date -u)" >> $W/device.txt
  timeout 100 python3 scripts/dev/peers_bwd.py $D/bench.py $W/peers_bwd.json --hdims 64,128 > $W/peers_bwd.txt 2>&1
  echo "peers_bwd rc $? $(date -u)" >> $W/device.txt
  python3 scripts/dev/side_by_side.py $W/attnc_bench.json $W/anchors.json $W/peers_bwd.json > $W/table.md 2>&1; head -60 $W/table.md
fi
if [ "$STEP" = var ]; then
  V=benches/variants; A=/tmp/aux
  python3 $V/flex_variants.py write-aux $A > /dev/null
  aux() { case $1 in document_mask_16h) echo "--aux doc=$A/doc.bin";; block_sparse_table) echo "--aux layout=$A/layout.bin";; esac; }
  for v in causal_16h sliding_window_16h softcap_16h alibi_16h document_mask_16h block_sparse_table; do
    echo "== $v"; timeout 60 $R attnc bench $V/$v.attn --batch 4 --seqlen 8192 --json $W/var_$v.json $(aux $v) 2>&1 | grep -v "^\["
  done > $W/variants.txt 2>&1
  echo "attnc variants rc $? $(date -u)" >> $W/device.txt; cat $W/variants.txt | grep "effective"
  timeout 200 python3 $V/flex_variants.py time $A $W/flex.json > $W/flex.txt 2>&1; echo "flex rc $? $(date -u)" >> $W/device.txt
  grep "flex forward" $W/flex.txt
  mkdir -p /tmp/pyattnc; xz -dc $D/_attnc.so.xz > python/attnc/_attnc.abi3.so
  export PYTHONPATH=$PWD/python:$PYTHONPATH ATTNC_PTXAS=/tmp/attnc/ptxas
  timeout ${INTER_LIMIT:-260} python3 scripts/dev/interleaved.py $W/interleaved.json --dirs bwd,fwd --rounds 3 --busy > $W/interleaved.txt 2>&1
  echo "interleaved rc $? $(date -u)" >> $W/device.txt; tail -n 46 $W/interleaved.txt
fi
cat $W/device.txt
