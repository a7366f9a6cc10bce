#!/bin/bash
# ncu (--set full) of FA4's SM90 backward kernels and attnc's backward main kernel at the same
# causal shapes (b4 x 8k; d64 x 32 heads, d128 x 16 heads), after the staging calls
# .device/pa, .device/pb and the peers' wheels + ptxas in /tmp/stage/st.
D=$(cd "$(dirname "$0")" && pwd)
ST=/tmp/stage/st
OUTD=/tmp/wcp; mkdir -p $OUTD /tmp/attnc /tmp/site
trap 'rm -f $OUTD/*.ncu-rep; tar cJf $OUT/prof.txz -C $OUTD .' EXIT
[ -d /tmp/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $ST/*.whl 2>&1 | tail -n 2
ls /tmp/site/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu* >/dev/null 2>&1 || \
  cat /tmp/stage/cu13.tar.xz.part-aa /tmp/stage/cu13.tar.xz.part-ab | xz -d | tar -x -C /tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUTD/device.txt
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
NCU=/usr/local/cuda/bin/ncu
xz -dc $ATTNC_XZ > /tmp/attnc/attnc; xz -dc $ST/ptxas.xz > /tmp/attnc/ptxas; chmod +x /tmp/attnc/attnc /tmp/attnc/ptxas
for d in 64 128; do
  h=$((2048 / d))
  timeout 150 $NCU --set full --import-source no -k 'regex:(?i)bwd|backward' -c 4 -o $OUTD/fa4_d$d python3 $D/fa4prof.py $d > $OUTD/ncu_fa4_d$d.log 2>&1
  echo "ncu fa4 d$d rc $? $(date -u)" >> $OUTD/device.txt
  $NCU --import $OUTD/fa4_d$d.ncu-rep --page details --csv > $OUTD/fa4_d${d}_details.csv 2>&1
  $NCU --import $OUTD/fa4_d$d.ncu-rep --page source --csv --print-source sass > $OUTD/fa4_d${d}_sass.csv 2>&1
  ATTNC_PTXAS=/tmp/attnc/ptxas timeout 120 $NCU --set full --import-source no -k 'regex:hopper_bwd$' -s 2 -c 1 -o $OUTD/attnc_d$d /tmp/attnc/attnc bench $D/c${d}h$h.attn --batch 4 --seqlen 8192 --iters 3 > $OUTD/ncu_attnc_d$d.log 2>&1
  echo "ncu attnc d$d rc $? $(date -u)" >> $OUTD/device.txt
  $NCU --import $OUTD/attnc_d$d.ncu-rep --page details --csv > $OUTD/attnc_d${d}_details.csv 2>&1
  $NCU --import $OUTD/attnc_d$d.ncu-rep --page source --csv --print-source sass > $OUTD/attnc_d${d}_sass.csv 2>&1
done
cd $OUTD && python3 $D/summary.py . > summary.md 2>&1; cat summary.md | head -80; ls -la; cat device.txt
