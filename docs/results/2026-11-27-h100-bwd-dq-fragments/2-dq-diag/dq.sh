#!/bin/bash
# #13: does the d128 backward's time follow the dQ reduce volume? Default (bulk reduce
# per (key tile, query tile) pair), half the pairs reducing (diag_dq_half, wrong dQ),
# none (diag_no_dq_red, wrong dQ); run 2: staging stores in a conflict-free order
# (diag_dq_linear), none (diag_dq_no_stage). Two rounds, interleaved.
D=$(cd "$(dirname "$0")" && pwd)
cd "$D/../.."
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $OUT/device.txt
for round in 1 2; do
  for t in "" diag_dq_linear=1 diag_dq_no_stage=1 diag_no_dq_red=1; do
    for v in "dsl-examples/mha.attn --batch 2 --seqlen 8192" "benches/variants/causal_16h.attn --batch 4 --seqlen 8192" "dsl-examples/mha.attn --batch 1 --seqlen 16384"; do
      echo "== round $round tune=[$t] $v"
      ATTNC_HOPPER_BWD_TUNE=$t $D/run.sh attnc bench $v --iters 15 2>&1 | grep -v "^\["
    done
  done
done > $OUT/dq.txt 2>&1
date -u >> $OUT/device.txt
