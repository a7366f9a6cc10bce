#!/bin/bash
# sweep.sh COUNT SEED: the random-spec sweep (tests/examples.rs,
# random_specs_compile_and_assemble_without_spills) on the device machine's CPU cores:
# the test binary built on the build machine, ptxas/nvdisasm/cuobjdump 13.5 from its .venv.
D=$(cd "$(dirname "$0")" && pwd)
T=/tmp/sw; mkdir -p $T
for f in examples ptxas nvdisasm cuobjdump; do [ -x $T/$f ] || { xz -dc $D/$f.xz > $T/$f; chmod +x $T/$f; }; done
(nproc; date -u; $T/ptxas --version | tail -1) | tee $OUT/machine_$2.txt
CI=1 ATTNC_PTXAS=$T/ptxas ATTNC_SPEC_SWEEP=$1 ATTNC_SPEC_SWEEP_SEED=$2 ATTNC_SPEC_SWEEP_JOBS=$(nproc) \
  timeout 560 $T/examples random_specs_compile_and_assemble_without_spills --exact --nocapture > $OUT/sweep_seed_$2.log 2>&1
echo "rc=$?" | tee -a $OUT/sweep_seed_$2.log; date -u | tee -a $OUT/machine_$2.txt
grep -E "random specs:|test result|problem" $OUT/sweep_seed_$2.log | head -20
