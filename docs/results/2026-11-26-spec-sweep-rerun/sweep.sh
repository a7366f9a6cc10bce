#!/bin/bash
# sweep.sh [--selftest] SEED:N ...: the random-spec ptxas sweep (tests/examples.rs
# random_specs) over the first N specs of each SEED on this machine's cores, with the
# carried ptxas and nvdisasm; --selftest first runs the GPU selftest of tests/sweep-specs.
D=$(cd "$(dirname "$0")" && pwd)
W=/tmp/sw; mkdir -p $W
for f in examples ptxas nvdisasm; do [ -x $W/$f ] || { xz -dc $D/$f.xz > $W/$f; chmod +x $W/$f; }; done
echo "nproc $(nproc)"; date -u; nvidia-smi -L 2>&1
if [ "$1" = --selftest ]; then
  shift
  timeout 120 bash $D/run.sh attnc selftest tests/sweep-specs 2>&1 | tail -25
fi
export ATTNC_PTXAS=$W/ptxas CI=1 ATTNC_SPEC_SWEEP_JOBS=$(nproc)
$W/ptxas --version | tail -1
for sn in "$@"; do
  seed=${sn%%:*}; n=${sn##*:}; t=$(date +%s)
  echo "=== seed $seed: $n specs, $(date -u +%T)"
  ATTNC_SPEC_SWEEP=$n ATTNC_SPEC_SWEEP_SEED=$seed $W/examples random_specs --nocapture --test-threads=1 2>&1 | grep -v "^test \|^running\|^$"
  echo "=== seed $seed: $n specs, rc ${PIPESTATUS[0]}, wall $(( $(date +%s) - t ))s"
done
date -u
