#!/bin/bash
# 1. Where the H100 host's ptxas time goes: process start (--version), the causal d128
#    forward's PTX from /tmp and from /dev/shm, the host's CPU; the compile suite.
# 2. Backward: the ordered mode's dQ writer without its turns (writer_turns=0; the det rows
#    then time the hand-over to a writer warp alone) vs the default, three rounds.
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w80; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
{ nproc; lscpu | grep -E "Model name|MHz|^CPU\(s\)"; df -h /tmp /dev/shm | tail -2
  $R true; P=/tmp/attnc/ptxas
  for i in 1 2 3; do TIMEFORMAT="ptxas --version %R s"; time $P --version > /dev/null; done
  for i in 1 2 3; do TIMEFORMAT="ptxas cc.ptx (/tmp) %R s"; time $P -arch=sm_90a -v -o /tmp/cc.cubin $D/cc.ptx 2>/dev/null; done
  mkdir -p /dev/shm/cc && cp $D/cc.ptx /dev/shm/cc/
  for i in 1 2 3; do TIMEFORMAT="ptxas cc.ptx (/dev/shm) %R s"; time $P -arch=sm_90a -v -o /dev/shm/cc/cc.cubin /dev/shm/cc/cc.ptx 2>/dev/null; done
  for i in 1 2 3; do TIMEFORMAT="attnc dump cc.attn %R s"; time $R attnc dump --arch sm_90a --pass fwd --emit ptx $D/cc.attn > /dev/null; done
} > $W/ptxas_host.txt 2>&1
cat $W/ptxas_host.txt
timeout 60 $R attnc bench --suites compile --json $W/compile.json > $W/compile.txt 2>&1
echo "compile rc $? $(date -u)" >> $W/device.txt; tail -5 $W/compile.txt
export ATTNC=attnc
ROUNDS=3 timeout 300 $R bash scripts/dev/ab_tune.sh backward $W/ab 'def=' 'wt0=ATTNC_HOPPER_BWD_TUNE=writer_turns=0'
echo "ab backward rc $? $(date -u)" >> $W/device.txt
python3 scripts/dev/ab_compare.py $W/ab backward def 2>&1 | tail -44
cat $W/device.txt
