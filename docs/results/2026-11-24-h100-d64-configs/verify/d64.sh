#!/bin/bash
# d64 with three consumers without a causal mask: the selftest of the d64 variants, then the prefill suite.
D=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt; date -u | tee -a $OUT/device.txt
for f in mqa_falcon sinks vit_fp16 t5_bias; do
  bash $D/run.sh attnc selftest --filter $f dsl-examples > $OUT/selftest_$f.txt 2>&1
  echo "selftest $f rc=$?"; grep "^FAIL" $OUT/selftest_$f.txt | head -3; tail -1 $OUT/selftest_$f.txt
  grep -m1 -o "ran hopper[^;]*; [0-9x]* tiles, [0-9]* threads" $OUT/selftest_$f.txt
done
bash $D/run.sh attnc bench --suites ceilings,prefill --json $OUT/prefill.json > $OUT/prefill.txt 2>/dev/null
echo "bench rc=$?"; sed -n '/^prefill/,$p' $OUT/prefill.txt | head -24
date -u | tee -a $OUT/device.txt
