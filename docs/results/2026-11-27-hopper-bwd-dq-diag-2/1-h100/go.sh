#!/bin/bash
# call 1: aux_grads selftest (d64 t5_bias), d64/d128 backward diag at the current defaults, ptxas -O1 cost/benefit
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
$R attnc --version >> $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt 2>/dev/null
# 1. learnable aux gradients on hopper at d64
ATTNC_HOPPER_BWD_TUNE=aux_grads=1 $R attnc selftest dsl-examples/t5_bias.attn --json $OUT/selftest_t5_aux_grads.json > $OUT/selftest_t5_aux_grads.txt 2>&1
echo "t5 aux_grads rc $?" >> $OUT/gpu.txt
# 2. backward diag at the defaults
for t in "" diag_no_dq_red=1 diag_no_dq=1 diag_no_softmax=1; do
  n=${t:-default}; n=${n%%=*}
  ATTNC_HOPPER_BWD_TUNE=$t $R attnc bench --suites backward --json $OUT/bwd_$n.json > $OUT/bwd_$n.txt 2>&1
done
# 3. ptxas -O1: compile time and kernel speed
T=/tmp/attnc; mkdir -p /tmp/o1; printf '#!/bin/bash\nexec %s/ptxas -O1 "$@"\n' $T > /tmp/o1/ptxas; chmod +x /tmp/o1/ptxas
$R attnc bench --suites prefill,compile --json $OUT/pre_O3.json > $OUT/pre_O3.txt 2>&1
$R env ATTNC_PTXAS=/tmp/o1/ptxas ATTNC_CACHE_DIR=/tmp/cache_o1 attnc bench --suites prefill,compile,backward --json $OUT/pre_O1.json > $OUT/pre_O1.txt 2>&1
tail -3 $OUT/*.txt
