#!/bin/bash
# Random-spec ptxas sweep on the device: run.sh FIRST_SEED BUDGET_S [FIRST_N]
# Runs chunks with seeds FIRST_SEED, FIRST_SEED+1, ...: the first of FIRST_N specs
# (calibration), later ones sized from the measured rate so that each ends well inside
# the budget (seconds from the script's start).
set -u
S=$1; BUDGET=$2; N0=${3:-60}; JOBS=${JOBS:-16}
T0=$(date +%s)
D=/tmp/sw; mkdir -p $D
for f in examples ptxas nvdisasm; do xz -dc .device/sweep/$f.xz > $D/$f; chmod +x $D/$f; done
echo "nproc $(nproc)"; date -u; nvidia-smi -L 2>&1; ldd --version 2>&1 | head -1
export ATTNC_PTXAS=$D/ptxas CI=1 ATTNC_SPEC_SWEEP_JOBS=$JOBS
unset ATTNC_NVDISASM ATTNC_CUOBJDUMP
$D/ptxas --version | tail -1
RUN=($D/examples)
if ! $D/examples --list >/dev/null 2>&1; then
  RUN=($PWD/.device/sweep/lib/ld-linux-x86-64.so.2 --library-path $PWD/.device/sweep/lib $D/examples)
  echo "using the carried libc"
fi
"${RUN[@]}" --list 2>&1 | grep random
echo "unpacked in $(( $(date +%s)-T0 ))s"
tot_s=0; tot_n=0; n=$N0; seed=$S
while :; do
  left=$(( T0 + BUDGET - $(date +%s) ))
  if [ $tot_n -gt 0 ]; then
    rate_ms=$(( tot_s * 1000 / tot_n )); [ $rate_ms -lt 1 ] && rate_ms=1
    span=$(( left * 10 / 16 )); [ $span -gt 200 ] && span=200
    n=$(( span * 1000 / rate_ms ))
  fi
  [ $n -lt 5 ] && break
  echo "=== seed $seed: $n specs, ${left}s left, $(date -u +%T)"
  t=$(date +%s)
  ATTNC_SPEC_SWEEP=$n ATTNC_SPEC_SWEEP_SEED=$seed timeout $(( left - 3 )) "${RUN[@]}" random_specs --nocapture --test-threads=1 2>&1
  rc=$?; dt=$(( $(date +%s) - t ))
  echo "=== seed $seed: $n specs, rc $rc, wall ${dt}s"
  [ $rc -eq 124 ] && break
  tot_s=$(( tot_s + dt )); tot_n=$(( tot_n + n )); seed=$(( seed + 1 ))
done
echo "=== done: $tot_n specs in ${tot_s}s over seeds $S..$(( seed - 1 ))"
