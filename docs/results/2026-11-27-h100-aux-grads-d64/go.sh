#!/bin/bash
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $W/gpu.txt
$R attnc --version >> $W/gpu.txt
ATTNC_HOPPER_BWD_TUNE=aux_grads=1 $R attnc selftest dsl-examples/t5_bias.attn --json $W/selftest_t5_aux_grads.json > $W/selftest_t5_aux_grads.txt 2>&1
echo "t5 aux_grads rc $?" >> $W/gpu.txt
T=/tmp/attnc; mkdir -p /tmp/o1; printf '#!/bin/bash\nexec %s/ptxas -O1 "$@"\n' $T > /tmp/o1/ptxas; chmod +x /tmp/o1/ptxas
$R env ATTNC_CACHE_DIR=/tmp/cache_o3 attnc bench --suites prefill,compile --json $W/pre_O3.json > $W/pre_O3.txt 2>&1
$R env ATTNC_PTXAS=/tmp/o1/ptxas ATTNC_CACHE_DIR=/tmp/cache_o1b attnc bench --suites prefill,compile,backward --json $W/pre_O1.json > $W/pre_O1.txt 2>&1
tar czf $OUT/w.tgz -C $W .
tail -n 3 $W/*.txt
