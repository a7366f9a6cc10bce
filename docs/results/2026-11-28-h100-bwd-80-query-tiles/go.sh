#!/bin/bash
# 80-query backward tiles with the transposed dQ split (ATTNC_HOPPER_BWD_TUNE=block_m=80,dq_split=3,
# FA4's SM90 d128 shape): the gradient selftest of d128 specs with the tune (non-causal, causal,
# varlen, score mod: odd lengths, the 160-row workspace padding, the ordered mode), then the
# backward suite default vs tune, alternating, three rounds; then the compile suite twice
# (the cache key of 849796c: memory and disk hits on this host).
D=$(cd "$(dirname "$0")" && pwd)
R="$D/run.sh"; W=/tmp/w96; mkdir -p $W; rm -f /tmp/attnc/attnc
trap 'tar czf $OUT/w.tgz -C $W .' EXIT
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > $W/device.txt
E=dsl-examples
T80=ATTNC_HOPPER_BWD_TUNE=block_m=80,dq_split=3
env $T80 timeout 170 $R attnc selftest --json $W/sel80.json $E/mha.attn $E/causal.attn $E/varlen_causal.attn $E/grok_softcap.attn > $W/sel80.txt 2>&1
echo "selftest t80 rc $? $(date -u)" >> $W/device.txt; tail -n 1 $W/sel80.txt; grep FAIL $W/sel80.txt | head -5
export PATH=/tmp/attnc:$PATH ATTNC_PTXAS=/tmp/attnc/ptxas
ROUNDS=3 timeout 330 bash $D/ab_tune.sh backward $W/ab 'def=' "t80=$T80"
echo "ab rc $? $(date -u)" >> $W/device.txt
for i in 1 2; do
  timeout 45 $R attnc bench --suites compile --json $W/compile_$i.json > $W/compile_$i.txt 2>&1
  echo "compile $i rc $? $(date -u)" >> $W/device.txt
done
cat $W/device.txt $W/ab/device.txt
python3 scripts/dev/ab_compare.py $W/ab backward def 2>&1 | tail -40
grep -iE "hit|cold" $W/compile_*.txt | head -12
